"""The host's share of a plan: what install keeps in host memory (the bf16 block linears gemm_quant replaces when the
checkpoint is not in its format, the AdaLN linears adaln_table parks, the VAE's originals under a cast, the conditioner
at offload_after / host), each item from the same count the device estimate uses, and the plan's `host` line."""

import pytest

from h3plan.planning import memory as M

GiB = 2**30


def _line(p):
    from h3plan import cli

    return " ".join(" ".join(cli._request_lines(p, 200)).split())


def test_bf16_keeps_only_the_parked_adaln_linears(plan):
    p = plan()
    items = p.derived_value("memory_host_items_gib")
    assert set(items) == {"parked_adaln_linears"} and p.derived_value("memory_host_gib") == items[
        "parked_adaln_linears"]
    tables = next(r for r in p.decision("adaln_table").reasons if "frees" in r)
    freed = float(tables.split("frees ")[1].split(" GiB")[0])  # the device memory the parked linears free
    assert items["parked_adaln_linears"] == pytest.approx(freed + float(tables.split("table ")[1].split(" GiB")[0]),
                                                          abs=0.02)
    assert (f"host {items['parked_adaln_linears']:.1f} GiB kept in host memory per process: "
            f"parked_adaln_linears {items['parked_adaln_linears']:.1f} GiB") in _line(p)


def test_without_the_tables_nothing_stays_on_the_host(plan):
    p = plan("levers.adaln_table=off")
    assert p.derived_value("memory_host_gib") == 0 and p.derived_value("memory_host_items_gib") == {}
    assert "kept in host memory" not in _line(p)


def test_fp8_from_a_bf16_checkpoint_parks_the_block_linears(plan):
    fp8 = plan("recipe=fp8").derived_value("memory_host_items_gib")
    from_bf16 = plan("recipe=fp8", "recipe.checkpoint=bf16", "levers.gemm_quant=fp8")
    items = from_bf16.derived_value("memory_host_items_gib")
    assert "parked_block_linears" not in fp8  # an fp8 checkpoint loads its linears quantised: nothing replaced
    tp = M.transformer_params(M._dc(from_bf16.get("model")))
    assert items["parked_block_linears"] == round(2 * tp["block_linears"] / GiB, 3)
    assert from_bf16.derived_value("memory_host_gib") == pytest.approx(sum(items.values()), abs=1e-3)


def test_a_cast_vae_keeps_its_originals(plan):
    fp32, fp16 = plan("recipe=bf16"), plan("recipe=bf16", "recipe.vae=fp16")
    assert "vae_originals" not in fp32.derived_value("memory_host_items_gib")
    vp = M.vae_params(M._dc(fp16.get("vae")))
    assert fp16.derived_value("memory_host_items_gib")["vae_originals"] == round(
        4 * (vp["decoder_linears"] + vp["other"]) / GiB, 3)


@pytest.mark.parametrize("placement,on_host", [("offload_after", True), ("host", True), ("resident", False)])
def test_the_conditioner_counts_where_its_placement_leaves_it(plan, placement, on_host):
    p = plan("video=ref2va_768x1344_5s", "recipe=fp8", f"memory.text_encoder={placement}")
    items = p.derived_value("memory_host_items_gib")
    assert ("text_encoder" in items) == on_host
    resident = plan("video=ref2va_768x1344_5s", "recipe=fp8", "memory.text_encoder=resident")
    weights = resident.derived_value("memory_breakdown_gib")["text_encoder"]  # its weights, as resident counts them
    assert weights > 60
    if on_host:
        assert items["text_encoder"] == pytest.approx(weights, abs=0.01)
        assert f"text_encoder {items['text_encoder']:.1f}" in _line(p)


def test_holding_the_vae_alone_counts_no_transformer_item(plan):
    p = plan("recipe=bf16", "recipe.vae=fp16", "memory.holds=vae")
    assert set(p.derived_value("memory_host_items_gib")) == {"vae_originals"}

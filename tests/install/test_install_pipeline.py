"""install_pipeline / uninstall_pipeline on a tiny diffusers MiniMaxH3ModularPipeline (CPU, no forward runs:
installing swaps modules and forwards only; the numerics are the installer's own tests)."""

import dataclasses
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.errors import InstallError  # noqa: E402
from h3plan.install import installed_plan  # noqa: E402
from h3plan.install.pipeline import (PipelineReport, install_pipeline, installed_pipeline_plan,  # noqa: E402
                                     is_pipeline, uninstall_pipeline)

from install_helpers import ROOT  # noqa: E402

TILING = ("use_tiling", "tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
          "tile_sample_min_overlap_width")


def _cfg(name):
    return OmegaConf.load(ROOT / name).diffusers_config


@pytest.fixture(scope="module")
def pipe():
    from h3plan.actions.pipeline_build import build_pipeline

    return build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe")


def _plan(**levers):
    return h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **{f"levers.{k}": v for k, v in levers.items()})


@pytest.fixture(scope="module")
def bf16():  # every lossless lever of sm90 that touches a module, VAE ones included
    return _plan(attention="sdpa", vae_ops="fused", vae_graphs="on")


def _snapshot(pipe):
    t, vae = pipe.transformer, pipe.vae
    state = {name: {k: v.clone() for k, v in getattr(pipe, name).state_dict().items()}
             for name in ("transformer", "vae", "audio_vae")}
    return {
        "state": state,
        "processors": [type(b.attn.processor) for b in t.transformer_blocks],
        "linears": [type(b.attn.to_q) for b in t.transformer_blocks],
        "forwards": [sorted(b.__dict__) for b in t.transformer_blocks] + [sorted(b.__dict__) for b in
                                                                          vae.decoder.transformer_blocks],
        "decoder": sorted(vae.decoder.__dict__),
        "tiling": tuple(getattr(vae, a) for a in TILING),
    }


def _assert_restored(pipe, before):
    after = _snapshot(pipe)
    for name, sd in before["state"].items():
        got = after["state"][name]
        assert list(got) == list(sd), name
        for k, v in sd.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), f"{name}.{k}"
    for key in ("processors", "linears", "forwards", "decoder", "tiling"):
        assert after[key] == before[key], key
    assert all(p is None for p in installed_pipeline_plan(pipe).values())


def test_round_trip_restores_every_component(pipe, bf16):
    before = _snapshot(pipe)
    report = install_pipeline(pipe, bf16)
    assert isinstance(report, PipelineReport) and is_pipeline(pipe)
    assert list(report.reports) == ["transformer", "vae"]
    assert report.skipped["audio_vae"].startswith("no lever applies")
    assert report.skipped["transformer_ref"] == "not a component of these blocks"
    assert {"attention", "qk_norm_rope", "modulation", "vae_ops", "vae_graphs"} <= set(report.swapped_levers())
    text = str(report)
    for name in ("[transformer]", "[vae]", "[audio_vae] skipped: no lever applies", "[transformer_ref] skipped"):
        assert name in text
    assert installed_pipeline_plan(pipe) == {"transformer": bf16, "vae": bf16}
    # swapped while installed: plan processors, instance forwards, the graphed decoder
    assert _snapshot(pipe)["processors"] != before["processors"]
    assert "forward" in pipe.vae.decoder.__dict__
    assert install_pipeline(pipe, bf16)["transformer"] is report["transformer"]  # same plan again: nothing to do
    assert uninstall_pipeline(pipe) is True
    _assert_restored(pipe, before)
    assert uninstall_pipeline(pipe) is False


def test_fp8_plan_round_trip_restores_the_linears(pipe):
    before = _snapshot(pipe)
    plan = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", recipe="fp8")
    report = install_pipeline(pipe, plan)
    assert "gemm_quant" in report["transformer"].swapped_levers()
    assert _snapshot(pipe)["linears"] != before["linears"]
    assert uninstall_pipeline(pipe)
    _assert_restored(pipe, before)


def test_a_component_that_refuses_leaves_the_pipeline_untouched(pipe):
    before = _snapshot(pipe)
    # overlap >= tile: diffusers' tiling cannot lay such tiles. The planner refuses it, and so does Plan.from_dict (a
    # plan file's params must be the planner's); a Plan edited in Python gets as far as the install, where the VAE
    # refuses after the transformer's
    with pytest.raises(h3plan.ConfigError, match="vae.custom_tile.overlap=64: must be smaller than the tile"):
        h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **{"levers.vae_tiles": "custom",
                              "vae.custom_tile.height": 64, "vae.custom_tile.width": 64, "vae.custom_tile.overlap": 64})
    d = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", recipe="fp8", **{
        "levers.vae_tiles": "custom", "vae.custom_tile.height": 64, "vae.custom_tile.width": 64,
        "vae.custom_tile.overlap": 32}).to_dict()
    next(x for x in d["decisions"] if x["lever"] == "vae_tiles")["params"]["tile"]["overlap"] = 64
    with pytest.raises(h3plan.PlanFileError, match=r"decision vae_tiles: params.tile is .*'overlap': 64.*, but its "
                                                   r"config gives"):
        h3plan.Plan.from_dict(d)
    p = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", recipe="fp8", **{
        "levers.vae_tiles": "custom", "vae.custom_tile.height": 64, "vae.custom_tile.width": 64,
        "vae.custom_tile.overlap": 32})
    plan = dataclasses.replace(p, decisions=tuple(h3plan.Decision.from_dict(x) for x in d["decisions"]))
    with pytest.raises(InstallError) as e:
        install_pipeline(pipe, plan)
    assert str(e.value).startswith("vae: vae_tiles: tile 64x64, overlap 64") and "\n" not in str(e.value)
    assert installed_plan(pipe.transformer) is None
    _assert_restored(pipe, before)


def test_other_objects_get_one_line(pipe, bf16):
    for obj in (pipe.transformer, object()):
        with pytest.raises(InstallError) as e:
            install_pipeline(obj, bf16)
        msg = str(e.value)
        assert "expects diffusers' MiniMaxH3ModularPipeline; got" in msg and "\n" not in msg
    with pytest.raises(InstallError, match="expects an h3plan Plan"):
        install_pipeline(pipe, {"levers": {}})
    assert not is_pipeline(pipe.transformer)


def test_a_replaced_component_is_still_restored(pipe, bf16):
    """update_components after install: uninstall_pipeline still restores the component it installed into."""
    from h3plan.actions.inputs import build_model

    old = pipe.transformer
    install_pipeline(pipe, bf16)
    pipe.update_components(transformer=build_model(_cfg("conf/model/h3_tiny.yaml"), seed=1))
    try:
        assert installed_plan(old) == bf16
        assert uninstall_pipeline(pipe) is True
        assert installed_plan(old) is None and installed_plan(pipe.vae) is None
    finally:
        pipe.update_components(transformer=old)


def test_a_second_plan_over_the_pipeline_is_said_once(pipe, bf16, caplog):
    """Each component replaced its plan: the pipeline's install says it once, not once a component."""
    import logging

    other = _plan(attention="sdpa", vae_graphs="off")
    install_pipeline(pipe, bf16)
    try:
        with caplog.at_level(logging.WARNING, logger="h3plan.install"):
            report = install_pipeline(pipe, other)
        assert [r.getMessage() for r in caplog.records] == [
            "h3plan.install: replaced the plan installed before (sm90/bf16/u1 +attention=sdpa +vae_graphs=on "
            "+vae_ops=fused) with this one (sm90/bf16/u1 +attention=sdpa +vae_graphs=off); the first was uninstalled, "
            "bit for bit"]
        assert all(r.warnings == report.reports["transformer"].warnings for r in report.reports.values())
    finally:
        assert uninstall_pipeline(pipe)

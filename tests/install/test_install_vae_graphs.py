"""vae_graphs on the CPU: the decoder wrapper's routing, signature cache, recapture and refusals with a
stand-in capture (a "graph" that replays by calling the forward on its static input), the per-call
fallback on a CPU tensor, install / uninstall, and the planner's decisions. The real CUDA capture and its
bit-identity are GPU facts: tests/gpu/test_install_vae_gpu.py."""

from __future__ import annotations

import pytest
import torch

import h3plan
from h3plan.install import counters, fallback_reasons, install, reset_counters, uninstall
from h3plan.install.vae.graph import GraphedDecoder, _Entry
from h3plan.install.vae.install import graphs_of

from test_install_vae import decode, interpreter_order, latent, tiny_vae  # noqa: F401 (autouse: CPU reference orders)


POOLS = []  # the pool each stand-in capture was given


def fake_capture(fn, x, pool=None):
    POOLS.append(pool)
    static_in = x.detach().clone()
    static_out = fn(static_in)

    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1
            static_out.copy_(fn(static_in))

    return _Entry(Graph(), static_in, static_out, (), pool if pool is not None else object())


def graphs_plan(ops):
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny",
                                 **{"levers.vae_graphs": "on", "levers.vae_ops": ops})


@pytest.fixture(autouse=True)
def fresh():
    reset_counters()
    POOLS.clear()


def _wrapped(capture=fake_capture, cpu_ok=True, **kw):
    vae = tiny_vae().requires_grad_(False)
    dec = vae.decoder
    gd = GraphedDecoder(dec, dec.forward, capture=capture, **kw)
    if cpu_ok:
        gd.device_reason = lambda x: None  # the stand-in capture runs anywhere
    return vae, dec, gd


def _x(frames=2, hw=3, seed=0):
    return torch.randn(1, 4, frames, hw, hw, generator=torch.Generator().manual_seed(seed))


def test_cpu_input_falls_back_with_the_reason():
    _, dec, gd = _wrapped(cpu_ok=False)
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(gd(x), dec(x), rtol=0, atol=0)
    assert counters() == {"vae_graphs.fallback": 1}
    assert fallback_reasons() == {"vae_graphs": {"CUDA graphs need a CUDA device (input on cpu)": 1}}
    assert gd.captures == 0


def test_one_capture_per_signature_then_replays():
    _, dec, gd = _wrapped()
    a, b = _x(seed=1), _x(seed=2)
    with torch.no_grad():
        ref_a, ref_b = dec(a), dec(b)
        torch.testing.assert_close(gd(a), ref_a, rtol=0, atol=0)
        torch.testing.assert_close(gd(b), ref_b, rtol=0, atol=0)  # same signature: replay with new values
        out = gd(_x(hw=4))
    assert gd.captures == 2 and len(gd.graphs) == 2 and out.shape[-1] != ref_a.shape[-1]
    assert counters() == {"vae_graphs.fused": 3}


def test_every_capture_shares_the_first_captures_pool():
    _, dec, gd = _wrapped()
    with torch.no_grad():
        for hw in (3, 4, 5):
            gd(_x(hw=hw))
    first = gd.graphs[next(iter(gd.graphs))].pool
    assert POOLS[0] is None and POOLS[1:] == [first, first] and gd.pool is first
    assert all(e.pool is first for e in gd.graphs.values())
    gd.release()
    assert gd.pool is None and not gd.graphs


def test_results_are_copies_not_the_static_buffer():
    _, dec, gd = _wrapped()
    with torch.no_grad():
        first = gd(_x(seed=1))
        keep = first.clone()
        gd(_x(seed=2))
    torch.testing.assert_close(first, keep, rtol=0, atol=0)


def test_replaced_weights_are_recaptured():
    _, dec, gd = _wrapped()
    x = _x()
    with torch.no_grad():
        gd(x)
        w = dec.proj_in.weight
        dec.proj_in.weight = torch.nn.Parameter(w.detach() * 2)
        out = gd(x)
        ref = dec(x)
    assert gd.captures == 2 and len(gd.graphs) == 1
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_failed_capture_is_refused_once_and_remembered():
    calls = []

    def boom(fn, x, pool=None):
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    _, dec, gd = _wrapped(capture=boom)
    x = _x()
    with torch.no_grad():
        gd(x)
        torch.testing.assert_close(gd(x), dec(x), rtol=0, atol=0)
    assert len(calls) == 1 and counters() == {"vae_graphs.fallback": 2}
    assert list(fallback_reasons()["vae_graphs"]) == [
        "capture failed (RuntimeError: operation not permitted when stream is capturing)"]


def test_full_cache_falls_back():
    _, dec, gd = _wrapped(max_graphs=1)
    with torch.no_grad():
        gd(_x())
        gd(_x(hw=4))
    assert fallback_reasons()["vae_graphs"] == {"graph cache full (1 input signatures)": 1}


def test_autograd_and_extra_arguments_fall_back():
    _, dec, gd = _wrapped()
    x = _x().requires_grad_()
    with torch.enable_grad():
        gd(x)
    with torch.no_grad(), pytest.raises(TypeError):
        gd(_x(), "extra")  # diffusers' forward takes no extra argument: it raises, as it would unwrapped
    assert fallback_reasons()["vae_graphs"] == {"autograd is recording: the graph keeps no backward": 1,
                                                "extra forward arguments: only decoder(hidden_states) is graphed": 1}
    assert gd.captures == 0


def test_autocast_weight_cache_with_trainable_weights_falls_back():
    _, dec, gd = _wrapped()
    dec.requires_grad_(True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        gd(_x())
    assert list(fallback_reasons()["vae_graphs"]) == [
        "autocast's weight cache is on and decoder parameters require grad (cached casts would go stale)"]


def test_key_includes_the_autocast_state():
    _, dec, gd = _wrapped()
    x = _x()
    with torch.no_grad():
        gd(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            gd(x)
    assert gd.captures == 2


def test_install_swaps_the_decoder_forward_and_uninstall_restores_it():
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    plan = graphs_plan("eager")
    report = install(vae, plan)
    assert isinstance(graphs_of(vae), GraphedDecoder)
    assert graphs_of(vae).validate is None  # no FP8 codes to check
    assert (graphs_of(vae).captures, len(graphs_of(vae).graphs)) == (0, 0)  # what the GPU test reads after replays
    assert report.swapped_levers() == ["vae_graphs"]
    assert str(report.swaps[0]).startswith("vae_graphs: decoder.forward MiniMaxH3VideoViTDecoder3d.forward -> CUDA "
                                           "graph replay")
    torch.testing.assert_close(decode(vae, z), ref, rtol=0, atol=0)  # CPU: counted fallback, diffusers' forward
    assert counters()["vae_graphs.fallback"] == 1
    assert install(vae, plan) is report  # idempotent
    assert uninstall(vae) and "forward" not in vae.decoder.__dict__ and graphs_of(vae) is None


def test_graph_replays_refuse_linears_edited_after_their_fp8_codes_were_made():
    """A replay skips the block forwards' checks, so the decoder wrapper runs the FP8 codes' check first."""
    vae = tiny_vae()
    install(vae, h3plan.resolve_config(hardware="sm90", recipe="fp8", vae="h3_tiny", **{"levers.vae_graphs": "on"}))
    gd = graphs_of(vae)
    assert gd.validate is not None
    gd.validate()  # unchanged: nothing raised
    with torch.no_grad():
        vae.decoder.transformer_blocks[0].attn.to_v.bias.add_(1)
    with pytest.raises(h3plan.errors.InstallError, match=r"transformer_blocks\.0 linear bias was replaced, moved, cast "
                                                         r"or edited"):
        gd(torch.zeros(1, 4, 2, 3, 3))
    assert uninstall(vae) and vae.decoder.transformer_blocks[0].attn.to_v.bias.dtype == torch.float32


def test_hooked_decoder_is_skipped_with_the_reason():
    vae = tiny_vae()
    vae.decoder.register_forward_hook(lambda m, i, o: None)
    plan = graphs_plan("eager")
    report = install(vae, plan)
    assert "forward" not in vae.decoder.__dict__
    assert "carries hooks" in dict(report.skipped)["vae_graphs"]
    uninstall(vae)


def test_planner_decisions():
    p = h3plan.resolve_config(hardware="sm90", recipe="bf16")
    g = p.decision("vae_graphs")
    assert g.setting == "on" and g.lossless and "bit-identical" in g.reasons[0]
    off = h3plan.resolve_config(hardware="sm90", recipe="bf16", **{"levers.vae_graphs": "off"}).decision("vae_graphs")
    assert off.setting == "off" and off.forced
    assert not h3plan.resolve_config(hardware="sm103").decision("vae_graphs").hardware_verified


def test_graphs_install_over_the_fused_block_forwards():
    """vae_ops' block forwards are instance attributes too: the graph install accepts them (and only them)."""
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    plan = graphs_plan("fused")
    report = install(vae, plan)
    assert isinstance(graphs_of(vae), GraphedDecoder)
    assert report.swapped_levers() == ["vae_ops", "vae_graphs"]
    torch.testing.assert_close(decode(vae, z), ref, rtol=0, atol=0)
    c = counters()
    # the fp32 decode (diffusers' default) installs the op whose kernel takes float32
    assert (c["vae_graphs.fallback"] == 1
            and c["vae_ops.scaled_residual.fused"] == 2 * len(vae.decoder.transformer_blocks))
    uninstall(vae)
    assert "forward" not in vae.decoder.__dict__
    assert all("forward" not in b.__dict__ for b in vae.decoder.transformer_blocks)

"""vae_parallel: one VAE decode spread over gloo ranks (h3plan/install/vae/parallel.py), and its planning
numbers (h3plan/facts/vae/parallel_plan.py).

Contract: rtol=0, atol=0 against diffusers' single-process decode of the same tiny AutoencoderKLMiniMaxH3
(16 px tiles, 8 px overlap: several tiles and temporal chunks), at degree 2 and 3 (uneven shares): the
decoder calls are the same calls on the same inputs, the stitching is diffusers' own `_decode`. Guards
(no group, one rank, tiling off, different latents per rank) run diffusers' decode, counted with reasons.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from gloo_spawn import spawn
from test_install_vae import tiny_vae

import h3plan.facts.vae.parallel_plan as vpp
import h3plan.facts.vae.tiling as tiling
import vae_parallel_worker as W
from h3plan.errors import InstallError, PlanningError
import h3plan.install.vae.parallel as vp
from h3plan.install.vae.parallel import REPLAY, ParallelDecode, _Replay, geometry, install_parallel
from h3plan.runtime.counters import counters, fallback_reasons, reset_counters

LEVER = vp.LEVER


@pytest.fixture
def vae():
    v = tiny_vae()
    v.enable_tiling(*W.TILE)
    reset_counters()
    return v


def _decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


# ---------------------------------------------------------------- the work-item mirror
@pytest.mark.parametrize("shape", [(1, 4, 4, 6, 6), (1, 4, 6, 6, 8), (1, 4, 3, 5, 7), (1, 4, 5, 4, 4)])
def test_work_items_are_diffusers_decoder_calls_in_order(vae, shape):
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    calls = []
    hook = vae.decoder.register_forward_pre_hook(lambda m, a: calls.append(a[0].clone()))
    _decode(vae, z)
    hook.remove()
    items = ParallelDecode(vae, original=vae._decode).items(z)
    assert len(items) == len(calls) == vpp.work(shape[2:], geometry(vae)).items
    with torch.no_grad():
        for it, x in zip(items, calls):
            assert torch.equal(vae.post_quant_conv(it.tile), x)
            assert tuple(vae.decoder(x).shape) == it.out_shape
            assert it.out_shape[1:] == vpp.work(shape[2:], geometry(vae)).item_shape


def test_tile_count_is_diffusers_split_tiles(vae):
    for tile, overlap in ((16, 8), (16, 4), (32, 12), (256, 64)):
        vae.enable_tiling(tile, tile, overlap, overlap)
        for length in range(4, 400, 4):
            assert (tiling.tile_count(length, tile, overlap)
                    == len(vae._split_tiles(length, tile, overlap)[0])), (tile, overlap, length)


# ---------------------------------------------------------------- guards, install, replay
def test_without_a_process_group_diffusers_decodes_counted(vae):
    z = torch.randn(1, 4, 4, 6, 6)
    ref = _decode(vae, z)
    undo = install_parallel(vae)
    assert torch.equal(_decode(vae, z), ref)
    undo()
    assert counters() == {f"{LEVER}.fallback": 1}
    assert fallback_reasons() == {LEVER: {"no process group (torch.distributed is not initialised)": 1}}


def test_a_group_of_one_rank_decodes_alone_counted(vae):
    import torch.distributed as dist

    from gloo_spawn import free_port

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        z = torch.randn(1, 4, 4, 6, 6)
        ref = _decode(vae, z)
        undo = install_parallel(vae)
        assert torch.equal(_decode(vae, z), ref)
        undo()
    finally:
        dist.destroy_process_group()
    assert fallback_reasons() == {LEVER: {"the process group has one rank": 1}}


def test_local_guards_name_their_reason(vae):
    pd = ParallelDecode(vae, original=vae._decode)
    z = torch.randn(1, 4, 4, 6, 6)
    items = pd.items(z)
    with torch.no_grad():
        assert pd.local_reason(z, items) == 0
        assert pd.local_reason(z, items[:1]) == vp.FEW_ITEMS
        assert pd.local_reason(z[0], items) == vp.NOT_5D
        h = vae.decoder.register_forward_hook(lambda *a: None)
        assert pd.local_reason(z, items) == vp.HOOKS
        h.remove()
    assert pd.local_reason(z, items) == vp.GRAD  # grad enabled and the decoder's parameters require grad
    vae.requires_grad_(False)
    assert pd.local_reason(z, items) == 0 and pd.local_reason(z.requires_grad_(), items) == vp.GRAD
    vae.disable_tiling()
    assert pd.local_reason(z, items) == vp.TILING_OFF
    assert vp.LOCAL_REASONS[vp.TILING_OFF].startswith("tiling off")


def test_install_uninstall_restores_and_refuses_twice(vae):
    assert "_decode" not in vae.__dict__
    undo = install_parallel(vae)
    assert isinstance(vae.__dict__["_decode"], ParallelDecode)
    with pytest.raises(InstallError, match="already installed"):
        install_parallel(vae)
    undo()
    undo()
    assert "_decode" not in vae.__dict__
    vae._decode_clip = vae._decode_clip  # someone else's instance patch: the mirror would not hold
    with pytest.raises(InstallError, match="_decode_clip is patched on the instance"):
        install_parallel(vae)


def test_installer_step_logs_the_swap_and_registers_a_hook_that_undoes_it(vae):
    from types import SimpleNamespace

    from h3plan.install.report import InstallReport

    from h3plan.install.hooks import registered, remove_all

    state = SimpleNamespace(report=InstallReport(), hooks=[])
    vp.apply(vae, None, state)
    assert [str(s) for s in state.report.swaps] == [
        "vae_parallel: _decode AutoencoderKLMiniMaxH3._decode -> work items spread over the process group, "
        "gathered, stitched by diffusers' _decode"]
    assert state.hooks == [(vae, "h3plan.vae_parallel")] and registered(vae) == ["h3plan.vae_parallel"]
    remove_all(state)
    assert "_decode" not in vae.__dict__ and "_diffusers_hook" not in vae.__dict__


def test_replay_mismatch_decodes_locally_from_there_on_counted():
    items = [vp.Item(torch.zeros(1, 2), (1, 2)), vp.Item(torch.zeros(1, 3), (1, 3))]
    seen = []
    r = _Replay(items, ["a", "b"], lambda x: seen.append(x) or "local", None)
    assert r(torch.zeros(1, 2)) == "a"
    assert r(torch.zeros(1, 4)) == "local" and r(torch.zeros(1, 3)) == "local"
    assert counters()[f"{REPLAY}.fused"] == 1 and counters()[f"{REPLAY}.fallback"] == 2
    assert "decoder call 1 got (1, 4), work item 1 is (1, 3)" in next(iter(fallback_reasons()[REPLAY]))


# ---------------------------------------------------------------- gloo ranks
@pytest.mark.slow
def test_degree_2_and_3_decode_bitwise_like_one_process():
    outdir = tempfile.mkdtemp(prefix="h3plan_vae_parallel_")
    spawn(W.worker, 3, outdir, timeout_s=240)
    for rank in range(3):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            res = json.load(f)
        assert sorted(res) == (["2", "3"] if rank < 2 else ["3"])
        for degree, cases in res.items():
            for case in ("fp32", "fp16", "slicing", "graphed"):
                r = cases[case]
                assert r["bitwise"] and r["restored"], (degree, rank, case, r)
                calls = 2 if case == "slicing" else 1
                assert r["counters"][f"{LEVER}.fused"] == calls and f"{LEVER}.fallback" not in r["counters"], r
                assert r["counters"][f"{REPLAY}.fused"] == calls * r["items"], r  # every call answered from the gather
                sizes = [hi - lo for lo, hi in r["shares"]]
                assert len(sizes) == int(degree) and sum(sizes) == r["items"] and max(sizes) - min(sizes) <= 1, r
            assert cases["graphed"]["forward_kept"] and cases["graphed"]["counters"]["vae_graphs.fallback"] >= 1
            assert cases["fp16"]["dtype"] == "float16" and cases["fp16"]["items"] == 18
            if degree == "3":
                assert [hi - lo for lo, hi in cases["fp32"]["shares"]] == [3, 3, 2]  # uneven: 8 items on 3 ranks
            for case, why in (("different", "ranks hold different latents (checksums differ): each decodes its own"),
                              ("tiling_off", "rank 0: tiling off: diffusers decodes each temporal chunk in one decoder "
                                             "call")):
                r = cases[case]
                assert r["bitwise"] and r["restored"], (degree, rank, case, r)
                assert r["counters"] == {f"{LEVER}.fallback": 1} and r["reasons"] == {LEVER: {why: 1}}, r


# ---------------------------------------------------------------- planning numbers (torch-free)
RELEASED = (62, 48, 84)  # latent [1, 24, 62, 48, 84] -> video [1, 3, 209, 768, 1344]


def test_released_latent_work_and_estimate():
    w = vpp.work(RELEASED)
    assert (w.chunks, w.rows, w.cols, w.item_shape) == (12, 4, 7, (3, 28, 256, 256)) and w.items == 336
    e = vpp.estimate(RELEASED, 2)
    assert e.max_items_per_rank == 168 and e.item_bytes == 3 * 28 * 256 * 256 * 2
    assert e.gathered_bytes_per_rank == vpp.HEADER_BYTES + 168 * e.item_bytes  # the other rank's slot
    assert e.one_gpu_s == (6.723, 6.723) and 1.9 < e.speedup[0] < 2.0 and e.gather_s < 0.02
    assert vpp.estimate(RELEASED, 3).max_items_per_rank == 112


@pytest.mark.parametrize("latent, degree, setting, why", [
    (RELEASED, 1, "off", "Ulysses degree 1: one rank"),
    (RELEASED, 2, "tiles", "estimated 6.72 s on one GPU -> 3.37 s at degree 2 (1.99x"),
    (RELEASED, 8, "tiles", "at degree 8"),
    ((1, 8, 8), 2, "off", "decodes in 0 decoder calls"),  # 1 + token_drop 3 latent frames: no whole chunk
    ((7, 8, 8), 2, "off", "decodes in 1 decoder call:"),
    ((4, 48, 84), 2, "tiles", "28 decoder calls"),
])
def test_auto_decision_table(latent, degree, setting, why):
    got, reasons, params = vpp.auto(latent, degree)
    assert got == setting and any(why in r for r in reasons), reasons
    assert bool(params) == (setting == "tiles")


def test_auto_declines_when_the_gather_costs_more_than_it_saves():
    got, reasons, _ = vpp.auto(RELEASED, 2, gather_gbps=0.5)  # a 0.5 GB/s link: 3.7 s of gather
    assert got == "off" and "below 1.05x" in reasons[0]


def test_forced_tiles_that_cannot_apply_raise_with_every_reason():
    import h3plan

    with pytest.raises(PlanningError, match="levers.vae_parallel=tiles cannot apply: Ulysses degree 1"):
        h3plan.resolve_config(**{"levers.vae_parallel": "tiles"})
    p = h3plan.resolve_config(parallel="u2", **{"levers.vae_parallel": "tiles"})
    assert p.decision("vae_parallel").setting == "tiles" and p.decision("vae_parallel").forced
    assert h3plan.resolve_config(parallel="u2").decision("vae_parallel").setting == "tiles"  # the released request
    assert h3plan.resolve_config(parallel="u2", **{"parallel.seq_len": 37820}).decision("vae_parallel").setting == "off"
    assert vpp.blockers("tiles", (1, 8, 8), 1)
    tiled_off = tiling.Geometry(tiling=False)
    assert vpp.auto(RELEASED, 2, tiled_off)[0] == "off"


def test_geometry_from_the_vae_config_and_torch_free_import():
    from omegaconf import OmegaConf

    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    conf = OmegaConf.to_container(OmegaConf.load(os.path.join(root, "conf/vae/h3.yaml")), resolve=True)
    assert tiling.Geometry.from_config(conf["diffusers_config"], conf["default_tile"]) == tiling.RELEASED
    code = "import sys, h3plan.facts.vae.parallel_plan as v; v.auto((62, 48, 84), 2); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)

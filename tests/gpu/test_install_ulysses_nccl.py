"""A whole installed transformer at Ulysses degree U over NCCL (>= 2 GPUs): real width, two blocks (the
first shards the sequence, the last gathers it), the plan that `parallel=u<U>` resolves, against the
same model with the degree-1 plan on one GPU.

Numeric contract: a plan at degree U gives the degree-1 plan's bits: every op is per row or per head,
so sharding only changes how many rows a GEMM or kernel sees and how many heads one attention call
holds (the GEMM M-split keeping cuBLAS's bits is what this test checks on the hardware). The fp8 plan
too: its per-tensor scales (the FP8 linears' activations, cuDNN FP8's q/k/v) are amaxes over the whole
sequence, all-reduced over the group with padding rows excluded, so every rank casts with degree 1's
scales.

    torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ulysses_nccl.py -q -s -p no:cacheprovider

or plainly with pytest, which spawns one process per GPU (at most 8).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.distributed as dist
from nccl_launch import N_GPU, NEEDS_2_GPUS, run_check, torchrun_world
from test_ulysses_nccl import assert_bits

pytestmark = [pytest.mark.gpu, NEEDS_2_GPUS]
BLOCKS = 2
# (recipe, S, extra overrides): S = 19,001 pads at every even degree (padding mode and merge tail)
CASES = {
    "bf16-37820": ("bf16", 37820, ()),
    "bf16-19001": ("bf16", 19001, ()),
    "bf16-37820-no-overlap": ("bf16", 37820, ("levers.ulysses_overlap=off",)),
    "fp8-37820": ("fp8", 37820, ()),
    "fp8-19001": ("fp8", 19001, ()),  # padding rows on the last rank: excluded from every amax
    "fp8-37820-codes": ("fp8", 37820, ("levers.a2a_fp8_codes=on",)),  # e4m3 codes through the all-to-all
    # per-destination projections sent while the next project: the sliced GEMMs must keep the whole GEMM's bits
    "bf16-37820-projection": ("bf16", 37820, ("levers.ulysses_overlap=off", "levers.ulysses_exchange=projection")),
    "bf16-19001-projection": ("bf16", 19001, ("levers.ulysses_overlap=off", "levers.ulysses_exchange=projection")),
    # and the output exchange per destination row block (a high-priority NCCL group), padded at 19,001
    "bf16-37820-split": ("bf16", 37820, ("levers.ulysses_overlap=off", "levers.ulysses_exchange=projection_split")),
    "bf16-19001-split": ("bf16", 19001, ("levers.ulysses_overlap=off", "levers.ulysses_padding=padded",
                                         "levers.ulysses_exchange=projection_split")),
}


def _plan(recipe, S, U, extra=()):
    from h3plan.planning.config import compose as compose_config
    from h3plan.planner import resolve

    cfg = compose_config(["hardware=sm90", f"parallel=u{U}", f"recipe={recipe}", f"parallel.seq_len={S}", *extra])
    return cfg, resolve(cfg)


def check_case(name):
    recipe, S, extra = CASES[name]
    U, rank = dist.get_world_size(), dist.get_rank()
    _, pu = _plan(recipe, S, U, extra)
    # the same levers at degree 1: compile is off at U > 1 (levers/compile.py), and a compiled block rounds its own way
    cfg, p1 = _plan(recipe, S, 1, (f"levers.compile={pu.decision('compile').setting}",))
    pairs, rel, c = run_pair(cfg, p1, pu, S)
    same = {k: torch.equal(a, b) for k, (a, b) in pairs.items()}
    settings = {lv: pu.decision(lv).setting for lv in ("attention", "ulysses_padding", "ulysses_overlap",
                                                       "a2a_fp8_codes",
                                                       "ulysses_exchange")}
    print(f"[ulysses-install] rank {rank}/{U} {name}: {settings}; bitwise vs degree 1 {same}; rel {rel}; counters {c}",
          flush=True)
    assert c.get("attention.fused", 0) >= BLOCKS, c  # one call per block and head chunk
    assert not {k: v for k, v in c.items() if k.endswith(".fallback")}, c
    if settings["ulysses_exchange"].startswith("projection"):
        assert c.get("ulysses_exchange.fused", 0) == BLOCKS, c
    for k, (a, b) in pairs.items():
        assert_bits(a, b, f"{name} {k}")


def run_pair(cfg, p1, pu, S, blocks=BLOCKS):
    """The seeded real-width model with `p1` on this GPU alone and with `pu` over the world group, on the same
    packed inputs: ({"video"|"audio": (out, ref)}, relative errors, the counters of the group's forward)."""
    from h3plan.actions.inputs import build_model, packed_inputs
    from h3plan.install import counters, install, reset_counters

    dc = cfg["model"]["diffusers_config"]
    eager = build_model(dc, blocks=blocks, device="cuda", dtype="bf16", seed=0)
    inputs = packed_inputs(dc, S, seed=0, device="cuda")
    one, many = copy.deepcopy(eager), eager
    install(one, p1)
    install(many, pu, group=dist.group.WORLD)
    with torch.no_grad():
        ref = one(**inputs)
        reset_counters()
        out = many(**inputs)
    c = counters()
    pairs = {"video": (out.sample, ref.sample), "audio": (out.audio_sample, ref.audio_sample)}
    rel = {k: float((a.float() - b.float()).norm() / b.float().norm()) for k, (a, b) in pairs.items()}
    return pairs, rel, c


CHECKS = {name: functools.partial(check_case, name) for name in CASES}


@pytest.fixture(scope="module")
def torchrun_group():
    yield torchrun_world(allowed=(2, 4, 8))  # conf/parallel has u2, u4 and u8


@pytest.mark.parametrize("name", list(CASES))
def test_installed_transformer_ulysses_nccl(name, torchrun_group):
    run_check(CHECKS, name, 8 if N_GPU >= 8 else 4 if N_GPU >= 4 else 2)

"""CUDA graphs for the VAE's ViT decoder: one graph per input signature, replayed instead of 36 blocks of
host-paced launches (h3plan/install/vae/graph.py). Bit-identical to diffusers' forward: the same kernels
on the same pointers.

auto: on. The decoder is host-bound wherever its per-tile blocks are small (docs/measurements.md); where the end-to-end
gain was measured the reason cites it, elsewhere it says it was not. Guards per call fall back to diffusers' forward
(counted, with reasons).
"""

from __future__ import annotations

from .base import Context, default_install, is_bool, Option, resolve, Spec, Terms, VERIFY_DECODE

SPEC = Spec(
    name="vae_graphs",
    settings={"off": True, "on": True},
    summary="the VAE's ViT decoder replayed from one CUDA graph per input signature (exact)",
    model="vae",
    verify=VERIFY_DECODE,
    counter="vae_graphs",
    options=(Option("vae", "graphs", is_bool, "bool", False),),
    terms={"on": Terms(vae_graph_pool=True)},
)


def blockers(ctx: Context, s: str) -> list[str]:
    return []


def auto(ctx: Context):
    v = ctx.hardware["vae_ops"]
    sp, src = v.get("graphs_speedup"), v.get("graphs_source")
    if sp:
        why = f"measured {sp[0]:.2f}-{sp[1]:.2f}x over diffusers' eager decode on this GPU with diffusers' ops ({src})"
    else:
        why = ("the end-to-end gain was never measured on this GPU (the H200's decoder is host-bound: "
               "benchmarks/results/vae-h200.md)")
    return "on", ["the ViT decoder replays one CUDA graph per input signature: the same kernels, bit-identical, "
                  f"without the host's per-launch cost; {why}"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto)


install = default_install(SPEC)

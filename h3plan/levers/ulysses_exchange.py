"""How q, k and v reach the ranks that attend over them at Ulysses degree U > 1 (exact either way).

- `packed`: the q/k/v projections run whole, the fused norm + RoPE packs them destination-major, one
  all-to-all moves (U, 3, B, S_loc, H/U, D), and three copies put the received rows in sequence order.
- `projection`: the projections run one destination's H/U heads at a time (weight rows sliced, no copy),
  the other ranks' heads first: each destination's normed + roped q, k, v are sent (send/recv with that
  peer) while the next destination's heads project, and land straight in sequence order; this rank's own
  heads go last and are copied into place. The exchange hides behind the projection GEMMs and the
  seq-major copies are gone. Per-head math is unchanged; the sliced GEMMs must give the whole GEMM's bits,
  which the NCCL install test asserts (tests/gpu/test_install_ulysses_nccl.py).
- `projection_split`: `projection`, and the output exchange per destination too: attention over each
  other rank's query rows first, each result sent (on a high-priority NCCL stream, runtime/parallel/comm.py) while
  the next rows attend, this rank's rows last. Needs padding none or padded (whole destination row
  blocks). Exact given attention rows that do not depend on the other query rows of the call.

Needs: the fused BF16 norm + RoPE (qk_norm_rope=fused), plain BF16 linears (gemm_quant=bf16: a quantised
linear does not slice per destination here), BF16 on the wire (a2a_fp8_codes off), no head chunks
(ulysses_overlap off), no sequence-wide FP8 amax (cudnn_fp8 with dynamic scales), no ring. At run time
batch 1 (else the packed exchange runs, counted with the reason).

auto: among the settings the hardware measured against `packed` at this degree (`measured.ulysses.exchange`,
each setting's nearest length), the fastest (median) of those faster in every run and allowed here;
`packed` otherwise (never measured: the proven path).
Runtime: h3plan/runtime/levers/ulysses_exchange.py (the projection exchange and its guard, the split
output exchange).
"""

from __future__ import annotations

from . import rules
from .base import (Context, default_install, faster_in_every_run, nearest_ulysses_point, Option, resolve, Spec,
                   speedup_runs, Terms)

SPEC = Spec(
    name="ulysses_exchange",
    settings={"packed": True, "projection": True, "projection_split": True},
    summary="Ulysses q/k/v exchange: one packed all-to-all, or per-destination projections sent while the next project "
            "(exact)",
    ulysses=True,
    options=(Option("attention", "ulysses_exchange", lambda v: v in ("packed", "projection", "projection_split"),
                    "'packed', 'projection' or 'projection_split'", "packed",
                    describe=lambda v: None if v == "packed" else f"{v}_exchange"),),
    counter="ulysses_exchange",
    terms={"projection": Terms(a2a_note="ulysses_exchange=projection: Q, K, V travel as send/recv while the next "
                                          "destination's projections run (mostly hidden), O's exchange stays exposed")},
)


def _needs(ctx: Context) -> list[str]:
    out = []
    if ctx.degree == 1:
        out.append("Ulysses degree 1: there is no exchange")
    if rules.ring(ctx):
        out.append("ring attention runs its own exchange")
    if rules.qk_norm_rope(ctx) != "fused":
        out.append(f"qk_norm_rope is {rules.qk_norm_rope(ctx)}: the projection exchange runs the fused BF16 norm + "
                   "RoPE per destination")
    if rules.gemm(ctx) != "bf16":
        out.append(f"gemm_quant is {rules.gemm(ctx)}: only plain BF16 linears slice per destination")
    if rules.a2a_fp8_codes(ctx):
        out.append("a2a_fp8_codes is on: e4m3 codes travel in the packed exchange")
    if rules.ulysses_overlap(ctx):
        out.append("ulysses_overlap is on: head chunks run with the packed exchange")
    if rules.dynamic_fp8_attention(ctx):
        out.append("cudnn_fp8 with dynamic scales takes its amax over the packed q, k, v")
    return out


def _split_needs(ctx: Context) -> list[str]:
    out = []
    if rules.ulysses_padding(ctx) not in ("none", "padded"):
        out.append(f"ulysses_padding is {rules.ulysses_padding(ctx)}: the split output exchange sends whole "
                   "destination row blocks (padding none or padded)")
    if rules.prefix_inplace(ctx):
        out.append("prefix_inplace is on: the split output exchange writes no padded prefix")
    if rules.sparse_attention(ctx):
        out.append("sparse_attention is on: its router routes whole sequences, and the split output exchange attends "
                   "a slice of the query rows per call")
    return out


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "packed":
        return []
    return _needs(ctx) + (_split_needs(ctx) if s == "projection_split" else [])


WHY = {"projection": "the q/k/v exchange hides behind the projection GEMMs and the seq-major copies are gone",
       "projection_split": "the q/k/v exchange hides behind the projection GEMMs, the output exchange behind this "
                           "rank's own rows' attention"}


def _point(ctx: Context, setting: str):
    points = [p for p in ctx.hardware["measured"]["ulysses"]["exchange"] if p.get("setting", "projection") == setting]
    return nearest_ulysses_point({"measured": {"ulysses": {"exchange": points}}}, "exchange", ctx.degree, ctx.seq_len)


def auto(ctx: Context):
    if ctx.degree == 1:
        return "packed", ["Ulysses degree 1: no exchange"], {}
    needs = _needs(ctx)
    if needs:
        return "packed", [needs[0]], {}
    src = ctx.hardware["measured"]["ulysses"]["source"]
    seen, wins = [], []
    for s in ("projection", "projection_split"):
        m = _point(ctx, s)
        if m is None:
            continue
        text = (f"{s} vs packed {speedup_runs(m['speedups'])} at {m['seq_len']:,} tokens (nearest measured length)")
        why = blockers(ctx, s)
        if why:
            seen.append(f"{text}, but {why[0]}")
        elif not faster_in_every_run(m["speedups"]):
            seen.append(f"{text}: not faster in every run")
        else:
            seen.append(f"{text}: faster in every run")
            wins.append((sorted(m["speedups"])[len(m["speedups"]) // 2], s))
    if not seen:
        return "packed", [f"the projection exchanges were never measured at degree {ctx.degree} on {ctx.hw}: "
                          "the packed exchange is the proven path"], {}
    where = f"measured {ctx.hw} at degree {ctx.degree}: " + "; ".join(seen) + f" ({src})"
    if not wins:
        return "packed", [where], {}
    best = max(wins)[1]
    return best, [f"{where}; {best}: {WHY[best]}"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto)


install = default_install(SPEC)

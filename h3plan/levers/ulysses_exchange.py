"""How q, k and v reach the ranks that attend over them at Ulysses degree U > 1 (exact either way).

- `packed`: the q/k/v projections run whole, the fused norm + RoPE packs them destination-major, one
  all-to-all moves (U, 3, B, S_loc, H/U, D), and three copies put the received rows in sequence order.
- `projection`: the projections run one destination's H/U heads at a time (weight rows sliced, no copy),
  the other ranks' heads first: each destination's normed + roped q, k, v are sent (send/recv with that
  peer) while the next destination's heads project, and land straight in sequence order; this rank's own
  heads go last and are copied into place. The exchange hides behind the projection GEMMs and the
  seq-major copies are gone. Per-head math is unchanged; the sliced GEMMs must give the whole GEMM's bits,
  which the NCCL install test asserts (tests/gpu/test_install_ulysses_nccl.py).

Needs: the fused BF16 norm + RoPE (qk_norm_rope=fused), plain BF16 linears (gemm_quant=bf16: a quantised
linear does not slice per destination here), BF16 on the wire (a2a_fp8_codes off), no head chunks
(ulysses_overlap off), no sequence-wide FP8 amax (cudnn_fp8 with dynamic scales), no ring. At run time
batch 1 (else the packed exchange runs, counted with the reason).

auto: `projection` where the hardware measured the installed plan with it against `packed` at this degree
(`measured.ulysses.exchange`, nearest length) faster in every run; `packed` otherwise (never measured:
the proven path).
"""

from __future__ import annotations

from .base import Context, Option, Spec, faster_in_every_run, nearest_ulysses_point, resolve, speedup_runs

SPEC = Spec(
    name="ulysses_exchange",
    settings={"packed": True, "projection": True},
    summary="Ulysses q/k/v exchange: one packed all-to-all, or per-destination projections sent while the next project (exact)",
    ulysses=True,
    options=(Option("attention", "ulysses_exchange", lambda v: v in ("packed", "projection"),
                    "'packed' or 'projection'", "packed"),),
    counter="ulysses_exchange",
)


def _needs(ctx: Context) -> list[str]:
    out = []
    if ctx.degree == 1:
        out.append("Ulysses degree 1: there is no exchange")
    if ctx.setting("ring") == "on":
        out.append("ring attention runs its own exchange")
    if ctx.setting("qk_norm_rope") != "fused":
        out.append(f"qk_norm_rope is {ctx.setting('qk_norm_rope')}: the projection exchange runs the fused BF16 norm + RoPE per destination")
    if ctx.setting("gemm_quant") != "bf16":
        out.append(f"gemm_quant is {ctx.setting('gemm_quant')}: only plain BF16 linears slice per destination")
    if ctx.setting("a2a_fp8_codes") == "on":
        out.append("a2a_fp8_codes is on: e4m3 codes travel in the packed exchange")
    if ctx.setting("ulysses_overlap") == "on":
        out.append("ulysses_overlap is on: head chunks run with the packed exchange")
    if ctx.setting("attention") == "cudnn_fp8" and ctx.setting("fp8_scales") == "dynamic":
        out.append("cudnn_fp8 with dynamic scales takes its amax over the packed q, k, v")
    return out


def blockers(ctx: Context, s: str) -> list[str]:
    return [] if s == "packed" else _needs(ctx)


def auto(ctx: Context):
    if ctx.degree == 1:
        return "packed", ["Ulysses degree 1: no exchange"], {}
    needs = _needs(ctx)
    if needs:
        return "packed", [needs[0]], {}
    m = nearest_ulysses_point(ctx.hardware, "exchange", ctx.degree, ctx.seq_len)
    if m is None:
        return "packed", [f"the projection exchange was never measured at degree {ctx.degree} on {ctx.hw}: "
                          "the packed exchange is the proven path"], {}
    where = (f"{ctx.hw} at degree {ctx.degree}, {m['seq_len']:,} tokens (nearest measured length): projection vs "
             f"packed {speedup_runs(m['speedups'])} ({ctx.hardware['measured']['ulysses']['source']})")
    if not faster_in_every_run(m["speedups"]):
        return "packed", [f"measured {where}: not faster in every run"], {}
    return "projection", [f"measured {where}: faster in every run; the exchange hides behind the projection GEMMs "
                          "and the seq-major copies are gone"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto)


def install(builder, decision) -> None:
    if decision.setting == "projection":
        builder.set(SPEC.name, "ulysses_exchange", "projection")
    else:
        builder.skip(SPEC.name, decision.reasons[0])

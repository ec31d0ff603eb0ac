"""Ring x Ulysses attention: past one node the sequence is split into `parallel.ring` blocks whose keys and
values rotate between the Ulysses groups (h3plan/runtime/parallel/ring.py; planning in ring_plan.py).

Scope: the transformer blocks' attention. world = ring x ulysses ranks; the sequence is sharded over all of
them (rank g holds rows g*S_loc ..), Ulysses runs inside each ring block of U*S_loc rows, and each rank's
block attention returns its log-sum-exp so the R key blocks merge in fp32.

Settings: off (parallel.ring = 1) and on (parallel.ring > 1); neither is a choice once the mesh is fixed,
so auto follows parallel.ring and a plan whose ring cannot run fails with the reasons. on is lossy
(ring_plan.NUMERICS: not bitwise equal to one GPU, within a stated bound), so a lossless recipe refuses it.
Blocked with on: FP8 attention (no log-sum-exp), FP8 codes on the wire, prefix-in-place, FA4's 2-CTA switch and
tuned tiles (the ring's FA4 block call takes neither), regional compile (compile.py). Those levers decide first and
yield to parallel.ring (levers/rules.py: EXCLUDES, `ring_excluded`): auto picks what the ring takes, a forced
setting is refused.

Cost: ring_plan.ring_ulysses_cost at the plan's shape with the hardware's rates: block attention TFLOP/s
measured at the nearest shape (else vendor peak x assumed efficiency), the all-to-all rate measured at this
Ulysses degree (hardware.measured.ulysses.a2a), the network rate hardware.device.nic_gbps (else an assumed
400 Gb/s NIC per GPU, never measured) and HBM for the merge. Install: `ring_degree` on the attention scope;
the installer builds the (ring, Ulysses) groups and runs RingUlysses, counted as `ring.fused` (the plan's
backend family computed the blocks) or `ring.fallback` (the fp32 reference did, with the reason).
"""

from __future__ import annotations

from h3plan.facts.attention import BACKENDS
from h3plan.facts.ring_plan import degree_reasons, describe, ring_ulysses_cost
from . import rules
from .base import Context, LeverError, Option, Spec, nearest_point, nearest_ulysses_point, resolve

SPEC = Spec(
    name="ring",
    settings={"off": True, "on": False},
    summary="ring x Ulysses attention over parallel.ring sequence blocks (lossy: log-sum-exp merge, not bitwise)",
    counter="ring",
    options=(Option("attention", "ring_degree", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                    "int >= 1", 1),),
)

ASSUMED_NIC_GBPS = 50.0  # one 400 Gb/s ConnectX-7 per GPU, one way
RAN = ("ran on GPUs: the ring module (RingAttention, ring 2 x ulysses 1, tests/gpu/test_ring_nccl.py, 4/4) and the "
       "installed ring plan at ring 2 x ulysses 1 (tests/gpu/test_install_ring_nccl.py, 2/2: bf16 budget at 37,820 "
       "tokens 3.5e-4 and fp8 at 19,001 9.4e-4 relative to degree 1; benchmarks/results/logs/overlap-h200x2.log), two "
       "H200s, NCCL; ring x ulysses > 1 and ring across nodes never ran")


def blockers(ctx: Context, s: str) -> list[str]:
    R, U = ctx.ring, ctx.degree
    if s == "off":
        return [] if R == 1 else [f"parallel.ring={R} shards the sequence over {R} ring blocks: the key/value "
                                  "rotation is required (set parallel.ring=1 for none)"]
    out = [] if R > 1 else ["parallel.ring=1: one ring block, nothing to rotate"]
    out += degree_reasons(R * U, R, U, heads=ctx.model["diffusers_config"]["num_attention_heads"])
    att = BACKENDS[rules.attention(ctx)]
    if not att.lse:
        out.append(f"attention is {att.name}: {att.precision.upper()} attention returns no log-sum-exp here "
                   "(h3plan/runtime/parallel/lse.py)")
    return out


def rates(ctx: Context) -> tuple[dict, list[str]]:
    """The rates ring_ulysses_cost takes, and where each comes from."""
    hw, U = ctx.hardware, ctx.degree
    dc = ctx.model["diffusers_config"]
    h, L = dc["num_attention_heads"] // U, U * ctx.rows_per_rank
    att = rules.attention(ctx)
    out, basis = {"hbm_tbps": hw["device"]["hbm_tbps"]}, []
    p = nearest_point(hw, L, h, att)
    if p is not None:
        out["attention_tflops"] = float(p[att])
        basis.append(f"block attention: {att} {p[att]:g} TFLOP/s measured at {p['seq_len']:,} x {p['heads']} heads "
                     f"(nearest to {L:,} x {h}; {hw['measured']['source']})")
    elif hw["peak_dense_tflops"].get("bf16") and hw["efficiency"]["attention"]:
        out["attention_tflops"] = hw["peak_dense_tflops"]["bf16"] * hw["efficiency"]["attention"]
        basis.append(f"block attention: assumed {hw['efficiency']['attention']:g} x bf16 peak; never measured on "
                     f"{ctx.hw}")
    nic = hw["device"].get("nic_gbps")
    out["ring_gbps"] = nic if nic else ASSUMED_NIC_GBPS
    basis.append(f"ring P2P: hardware.device.nic_gbps {nic:g} GB/s one way" if nic else
                 f"ring P2P: ASSUMED {ASSUMED_NIC_GBPS:g} GB/s one way (one 400 Gb/s NIC per GPU across nodes); "
                 f"no network fact for {ctx.hw}, never measured")
    if U > 1:
        m = nearest_ulysses_point(hw, "a2a", U, ctx.seq_len)
        if m is not None:
            out["a2a_gbps"] = m["gbps_leaving_rank"]
            basis.append(f"all-to-all: {m['gbps_leaving_rank']:g} GB/s leaving a rank, measured at degree {U}, "
                         f"{m['seq_len']:,} tokens ({hw['measured']['ulysses']['source']})")
        elif hw["device"]["nvlink_gbps"]:
            out["a2a_gbps"] = hw["device"]["nvlink_gbps"] / 2
            basis.append(f"all-to-all: one-direction NVLink {hw['device']['nvlink_gbps']:g}/2 GB/s; never measured at "
                         f"degree {U} on {ctx.hw}")
    return out, basis


def cost(ctx: Context):
    dc, p = ctx.model["diffusers_config"], ctx.parallel
    r, basis = rates(ctx)
    c = ring_ulysses_cost(ctx.seq_len, ring=ctx.ring, ulysses=ctx.degree, heads=dc["num_attention_heads"],
                          head_dim=dc["attention_head_dim"], batch=p["batch"], **r)
    return c, basis


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    c, _ = cost(ctx)
    return {"ring": ctx.ring, "ulysses": ctx.degree, "cost": c.as_dict()}


def explain(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    c, basis = cost(ctx)
    return describe(c) + basis + [RAN]


def auto(ctx: Context):
    if ctx.ring == 1:
        return "off", ["parallel.ring=1: one ring block, no key/value rotation"], {}
    problems = blockers(ctx, "on")
    if ctx.lossless_only:
        problems.append(f"recipe {ctx.recipe['name']} has policy lossless and the ring is lossy (not bitwise: "
                        "log-sum-exp merge of the key blocks); set parallel.ring=1 or a budget recipe")
    if problems:
        raise LeverError(SPEC.name, "on", problems)
    return "on", [f"parallel.ring={ctx.ring}: the sequence spans {ctx.ring} ring blocks", *explain(ctx, "on"),
                  ctx.budget_text()], params(ctx, "on")


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    if decision.setting == "on":
        builder.set(SPEC.name, "ring_degree", int(decision.param("ring")))
    else:
        builder.skip(SPEC.name, decision.reasons[0])

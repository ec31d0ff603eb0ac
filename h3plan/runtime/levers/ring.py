"""ring's runtime (its plan: levers/ring.py; plan option `ring_degree` > 1): ring x Ulysses as sites of the attention
processor (runtime/attention_sites.py), the world exchange in the Ulysses exchange's place.

Scope: the world group passed to `h3plan.install(..., group=)` (it must be the default group: the mesh's sub-groups
are made over it, h3plan.runtime.parallel.ring.ring_ulysses_groups) holds ring x ulysses ranks. The block stack runs
on world shards (install/shard.py over the world: rank g holds rows g*S_loc ..), and every attention call runs
h3plan.runtime.parallel.ring.RingUlysses: Ulysses inside each ring block, the key/value blocks rotating over the ring.

Block attention (`RingBlock`): the log-sum-exp backend the plan's backend declares (h3plan.facts.attention.LSE_OF:
fa4 -> fa4, sdpa -> sdpa_flash, cudnn_bf16 -> torch's cuDNN sdpa_cudnn; FA4's 2-CTA switch and tiles are not
applied, the plan blocks them). Per call, `reason(q)` (device, dtype, head_dim; cached) routes a refused
input to the fp32 reference `attention_with_lse`, counted `ring.fallback` with the reason; else `ring.fused`.
No cudnn_fp8: FP8 attention gives no log-sum-exp.

Numerics: not bitwise equal to the degree-1 plan (ring_plan.NUMERICS): the fp32 reference's block outputs
merge within ~1e-6 relative and round once to bf16; bf16 block outputs add one bf16 rounding per block.
"""

from __future__ import annotations

from dataclasses import replace

from h3plan.errors import InstallError
from h3plan.facts.attention import LSE_OF
from h3plan.levers import OPTIONS, counter
from h3plan.levers.rules import EXCLUDES
from h3plan.runtime.attention_sites import AttentionSites, eager_norm_rope
from h3plan.runtime.guards import count_route
from h3plan.runtime.parallel.comm import degree_rank
from h3plan.runtime.parallel.lse import LSE_BACKENDS, attention_with_lse, lse_reason
from h3plan.runtime.parallel.ring import RingUlysses, ring_ulysses_groups

COUNTER = counter("ring_degree")


class RingBlock:
    """Block attention (q, k, v) -> (out, lse) for RingAttention: the plan's LSE backend, else the reference."""

    def __init__(self, backend: str):
        if backend not in LSE_OF:
            raise InstallError(f"ring: attention {backend} has no log-sum-exp backend; allowed: {', '.join(LSE_OF)}")
        self.name = LSE_OF[backend]
        self._reasons: dict = {}
        self.__name__ = f"RingBlock[{self.name}]"

    def reason(self, q) -> str | None:
        key = (q.device, q.dtype, q.shape[-1])
        if key not in self._reasons:
            self._reasons[key] = lse_reason(self.name, q)
        return self._reasons[key]

    def __call__(self, q, k, v):
        return attention_with_lse(q, k, v) if self.reason(q) else LSE_BACKENDS[self.name](q, k, v)


def problems(opts, builder) -> list[str]:
    """Attention options the ring cannot run with (the plan blocks them; a hand-made plan may not): a backend without a
    log-sum-exp (qk_norm_rope's FP8 codes need cudnn_fp8, which has none), the settings of earlier levers that
    parallel.ring rules out (levers/rules.py EXCLUDES) where their install recorded an option, padding."""
    out = []
    if opts.backend not in LSE_OF:
        out.append(f"backend {opts.backend} gives no log-sum-exp (ring needs {' / '.join(LSE_OF)})")
    for lever in dict.fromkeys(OPTIONS[key][0] for key in builder.recorded("attention")):
        setting, why = EXCLUDES.get(lever, (None, None))
        if setting is not None and builder.settings.get(lever) == setting:
            out.append(f"{lever}={setting} ({why})")
    if opts.ulysses_padding != "none":
        out.append(f"ulysses_padding={opts.ulysses_padding} (the ring handles padding: none only)")
    return out


def build(opts, group, builder):
    """(world degree, RingUlysses) for ring_degree x ulysses_degree ranks; `builder`: the plan's recorded options and
    settings (what `problems` checks)."""
    import torch.distributed as dist

    R, U = opts.ring_degree, opts.ulysses_degree
    why = problems(opts, builder)
    if why:
        raise InstallError(f"ring_degree={R} cannot run with: " + "; ".join(why))
    world, _ = degree_rank(group)
    if world != R * U:
        raise InstallError(f"plan ring {R} x ulysses {U} = {R * U} ranks but the process group has {world} "
                           "(initialise torch.distributed with that many ranks, or pass group=)")
    if group is not None and dist.get_world_size() != world:
        raise InstallError(f"ring x Ulysses makes its groups over the default group ({dist.get_world_size()} ranks): "
                           f"group= must be the whole world, got {world} ranks")
    ring_g, uly_g = ring_ulysses_groups(R, U)
    return world, RingUlysses(ring_g, uly_g, RingBlock(opts.backend), chunks=opts.ulysses_chunks)


def attend(proc, attn, q, k, v, rotary_emb):
    """This rank's world-shard rows in, (B, S_loc, H*D) out, through the processor's RingUlysses (`proc.world`)."""
    ru, S, U = proc.world, proc.shard.seq_len, proc.world.ulysses_degree
    sites = proc.sites
    block = ru.ring.attn
    why = block.reason(q)
    count_route(COUNTER, None if why is None else f"{block.name}: {why}; fp32 reference blocks")
    if _bf16_packing(sites) and U > 1:
        packed = sites.packed(attn, q, k, v, rotary_emb, U)
        if packed is not None:
            return ru(None, None, None, seq_len=S, packed=packed)
    if U == 1:
        q, k = sites.norm_rope(attn, q, k, rotary_emb)
    else:
        q, k = eager_norm_rope(attn, q, k, rotary_emb)
    return ru(q, k, v.contiguous(), seq_len=S)


def _bf16_packing(sites: AttentionSites) -> bool:
    """The bf16 norm + RoPE packs for the exchange (the ring takes no FP8 codes: `problems`)."""
    return sites.packed is not None and sites.codes is None


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """ring_degree > 1: the world exchange and the attention through it."""
    if opts.ring_degree <= 1:
        return sites
    return replace(sites, world_exchange=build, world_call=attend)

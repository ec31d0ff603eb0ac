"""Ring x Ulysses for the installed transformer (plan option `ring_degree` > 1, lever h3plan/levers/ring.py).

Scope: the world group passed to `h3plan.install(..., group=)` (it must be the default group: the mesh's
sub-groups are made over it, h3plan.runtime.parallel.ring.ring_ulysses_groups) holds ring x ulysses ranks. The block
stack runs on world shards (install/shard.py over the world: rank g holds rows g*S_loc ..), and every
attention call runs h3plan.runtime.parallel.ring.RingUlysses: Ulysses inside each ring block, the key/value blocks
rotating over the ring.

Block attention (`RingBlock`): the log-sum-exp backend the plan's backend declares (h3plan.facts.attention.LSE_OF:
fa4 -> fa4, sdpa -> sdpa_flash, cudnn_bf16 -> torch's cuDNN sdpa_cudnn; FA4's 2-CTA switch and tiles are not
applied, the plan blocks them). Per call, `reason(q)` (device, dtype, head_dim; cached) routes a refused
input to the fp32 reference `attention_with_lse`, counted `ring.fallback` with the reason; else `ring.fused`.
No cudnn_fp8: FP8 attention gives no log-sum-exp.

Numerics: not bitwise equal to the degree-1 plan (ring_plan.NUMERICS): the fp32 reference's block outputs
merge within ~1e-6 relative and round once to bf16; bf16 block outputs add one bf16 rounding per block.
"""

from __future__ import annotations

from h3plan.facts.attention import LSE_OF
from h3plan.errors import InstallError
from h3plan.levers import OPTIONS
from h3plan.levers.rules import EXCLUDES
from h3plan.runtime.parallel.comm import degree_rank
from h3plan.runtime.parallel.lse import LSE_BACKENDS, attention_with_lse, lse_reason
from h3plan.runtime.parallel.ring import RingUlysses, ring_ulysses_groups

from .shard import SequenceShard


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


def build(model, opts, group, builder):
    """(SequenceShard over the world, RingUlysses) for ring_degree x ulysses_degree ranks; `builder`: the plan's
    recorded options and settings (what `problems` checks)."""
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
    ru = RingUlysses(ring_g, uly_g, RingBlock(opts.backend), chunks=opts.ulysses_chunks)
    return SequenceShard(group, world, 0, len(model.transformer_blocks) - 1), ru

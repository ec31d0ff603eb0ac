"""`h3plan::count`: the counters' event as a torch custom op, for regions torch.compile or torch.export traces.

Opaque to dynamo (nothing in the graph reads the counts, so nothing guards on them) and run at every call
of the compiled graph or exported program, so counting stays exact. It mutates nothing: the op is
registered as having an ordered side effect (torch.library's effect registry, as `aten::_print` is), so
functionalization threads an effect token through it (`with_effects`) instead of a mutated tensor, and no
compiler pass drops it as dead code. Registered at import (never while tracing); imported by the guards,
which every installed call site uses.
"""

import torch

from .tally import record


@torch.library.custom_op("h3plan::count", mutates_args=())
def count(lever: str, reason: str, fused: bool) -> None:
    record(lever, None if fused else reason)


@count.register_fake
def _(lever, reason, fused):
    return None


if hasattr(count, "register_effect"):  # torch.library's effect registry (torch 2.13 here)
    from torch._library.effects import EffectType

    count.register_effect(EffectType.ORDERED)
else:  # older torch: the same registry through its with_effects module (untested here)
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    _register_effectful_op(torch.ops.h3plan.count.default, _EffectType.ORDERED)

"""`h3plan::count`: the counters' event as a torch custom op, for regions torch.compile traces.

Opaque to dynamo (nothing in the graph reads the counts, so nothing guards on them) and run at every call
of the compiled graph, so counting stays exact. It mutates a one-element token only so that no
compiler pass drops it as dead code. Registered at import (never while tracing); imported by the
guards, which every installed call site uses.
"""

import torch

from .counters import _record

TOKEN = torch.zeros(1)


@torch.library.custom_op("h3plan::count", mutates_args=("token",))
def count(token: torch.Tensor, lever: str, reason: str, fused: bool) -> None:
    _record(lever, None if fused else reason)


@count.register_fake
def _(token, lever, reason, fused):
    return None

"""sparse_attention's runtime (its plan: levers/sparse_attention.py, whose `Spec.model_step` calls `install` here with
the install's Site, install/site.py): which forwards run block-sparse attention, as a named diffusers hook.

`h3plan.sparse_attention`, a diffusers ModelHook (install/hooks.py) on MiniMaxH3Transformer3DModel's forward, places
each call in its generation by its `timestep` vector (runtime/schedule.py schedule_index: the same index the step cache
keys on, one 4 x T byte device-to-host copy per call) and sets, for the attention processors of that call:
- `active`: the call is forward >= dense_forwards of its generation (and keep < 1: keeping every block is the dense
  call, which then runs as it is); a vector not in the index runs dense, counted `sparse_attention.fallback`;
- `video_start`: the first target-video row, on the device (no sync): the start of the trailing run of rows tagged
  video (token_tags 0) at the last row's timestep (diffusers packs [text | conditions | target audio | target video]:
  the conditioning video rows carry their own timestep, so the run stops there). One persistent buffer, so a
  compiled block sees the same tensor every call.
After the call `active` is cleared: a block called outside a hooked forward runs dense. Each plan attention processor
holds the state as its override while installed (`processor.override`, an effect hook `h3plan.sparse_attention.state`
on its attention): on an active forward the processor hands it each call, after the Ulysses exchange (this rank's
heads, the whole sequence), and `SparseState.take` runs the router and FA4's block-sparse forward as one custom op,
counted `sparse_attention.fused` (FA4 ran), else `.fallback` with the reason (the torch reference of the same mask,
or, returning None, the dense call where the mask cannot apply). `calls(model)` lists each generation's dense and
sparse forwards.
Under torch.compile the processor's branch on `active` is guarded: two graphs per block region (dense, sparse).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from h3plan.errors import InstallError
from h3plan.levers import counter, owner
from h3plan.runtime.attention.block_sparse import fa4_block_sparse_reason, router_reason
from h3plan.runtime.counters import event
from h3plan.runtime.guards import GRAD_REASON, count_route, needs_grad, signature
from h3plan.runtime.schedule import schedule_index

LEVER = owner("sparse_attention")
COUNTER = counter("sparse_attention")
HOOK = "h3plan." + LEVER  # the hook's name (install/hooks.py `name`)
STATE = "_h3plan_sparse_attention"


_VERDICTS: dict = {}  # ((q, k) signature, (block_q, block_k, keep)) -> _verdict


def _verdict(sig: tuple, plan: tuple) -> tuple[bool, str | None]:
    """(FA4's block-sparse forward takes q of this signature, the reasons the call runs a torch reference or None),
    computed once on empty tensors of the (q, k) signature and the plan's (block_q, block_k, keep). Under
    torch.compile it runs at trace time and is a constant of the graph (the guards on shapes, dtype and device keep it
    valid)."""
    if (sig, plan) not in _VERDICTS:
        q, k = (torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype, device in sig)
        block_q, block_k, keep = plan
        fa4 = fa4_block_sparse_reason(q, block_q, block_k)
        router = router_reason(q, k, torch.zeros(1, dtype=torch.int64, device=q.device), keep, block_q, block_k)
        why = [w for w in (None if fa4 is None else f"{fa4}: the torch reference of the same mask",
                           None if router is None else f"router kernel: {router}: its torch reference") if w]
        _VERDICTS[(sig, plan)] = (fa4 is None, "; ".join(why) or None)
    return _VERDICTS[(sig, plan)]


_traced_verdict = torch.compiler.assume_constant_result(_verdict)


class SparseState:
    """What the processors of one transformer read per call: the plan's values, `active`, `video_start`."""

    def __init__(self, spec: dict[str, Any], index: dict[bytes, tuple[int, int]]):
        self.keep, self.dense_forwards = float(spec["keep"]), int(spec["dense_forwards"])
        self.block_q, self.block_k = int(spec["block_q"]), int(spec["block_k"])
        self.video_only = bool(spec["video_only"])
        self.index = index
        self.active = False
        self.video_start: torch.Tensor | None = None  # (1,) int64 on the model's device
        self.history: list[dict[str, int]] = []
        self._run = {"forwards": 0, "dense": 0, "sparse": 0}

    def _dense(self, q, k, v) -> str | None:
        """Why this call runs dense (None: it routes); shapes, dtype and grad only (a constant at trace time)."""
        if needs_grad(q, k, v):
            return GRAD_REASON
        if q.dtype not in (torch.bfloat16, torch.float16):
            return f"q/k/v are {q.dtype}: the router and FA4's block-sparse forward take bf16/fp16"
        if q.shape[1] < k.shape[1]:
            return "the call attends a slice of the query rows (the router routes whole sequences)"
        return None

    def take(self, q, k, v):
        """The block-sparse attention of this call's kept blocks (the router and FA4's block-sparse forward as one
        custom op, runtime/attention/block_sparse.py; its torch reference of the same mask where FA4 refuses), or
        None where the call must run dense; counted either way."""
        dense = self._dense(q, k, v)
        if dense is not None:
            count_route(COUNTER, f"{dense}: dense")
            return None
        sig, plan = signature(q, k), (self.block_q, self.block_k, self.keep)
        fa4, why = _traced_verdict(sig, plan) if torch.compiler.is_compiling() else _verdict(sig, plan)
        count_route(COUNTER, why)
        return torch.ops.h3plan.sparse_attention(q, k, v, self.video_start, self.keep, self.block_q, self.block_k,
                                                 self.video_only, fa4)

    def boundary(self, token_tags: torch.Tensor, timestep_indices: torch.Tensor) -> torch.Tensor:
        """Write the first target-video row into the persistent `video_start` buffer (device ops only)."""
        target = (token_tags == 0) & (timestep_indices == timestep_indices[-1])
        rows = torch.arange(token_tags.shape[0], device=token_tags.device)
        start = torch.where(target, -1, rows).amax().clamp(min=-1) + 1
        if self.video_start is None or self.video_start.device != token_tags.device:
            self.video_start = torch.zeros(1, dtype=torch.int64, device=token_tags.device)
        self.video_start.copy_(start.reshape(1))
        return self.video_start

    def place(self, step: int, n: int) -> None:
        if step == 0:
            self._run = {"forwards": n, "dense": 0, "sparse": 0}
        self.active = self.keep < 1.0 and step >= self.dense_forwards
        self._run["sparse" if self.active else "dense"] += 1
        event(LEVER, "sparse" if self.active else "dense")
        if step == n - 1:
            self.history.append(dict(self._run))


def _arg(args, kwargs, name: str, pos: int):
    return kwargs[name] if name in kwargs else args[pos]


def _make_forward(state: SparseState):
    """The hook's forward around `original` (the transformer's): sets the state for this forward's attention calls
    (module docstring), then runs it."""

    def sparse_forward(original, *args, **kwargs):
        ts = _arg(args, kwargs, "timestep", 3)
        where = state.index.get(ts.detach().to("cpu", torch.float32).numpy().tobytes())
        if where is None:
            count_route(COUNTER, "timestep vector not in the planned schedules "
                                 "(install num_inference_steps=): dense")
            state.active = False
            return original(*args, **kwargs)
        state.boundary(_arg(args, kwargs, "token_tags", 5), _arg(args, kwargs, "timestep_indices", 4))
        state.place(*where)
        try:
            return original(*args, **kwargs)
        finally:
            state.active = False

    return sparse_forward


def install(model, spec: dict[str, Any], site) -> SparseState:
    """Register, through `site` (install/site.py; its `steps`: more step counts to key), the hook, the state on the
    model and on each transformer block's plan attention processor (hooks of their own); return the state. The
    processors must be the plan's (the attention lever's, installed before): InstallError otherwise."""
    counts = sorted({int(spec["steps"]), *(int(s) for s in site.steps)})
    st = SparseState(spec, schedule_index(counts))
    procs = []
    for i, block in enumerate(model.transformer_blocks):
        proc = block.attn.processor
        if not hasattr(proc, "override"):
            raise InstallError(f"{LEVER}: transformer_blocks.{i}.attn runs {type(proc).__name__}, not the plan's "
                               "attention processor, which block-sparse attention runs in")
        procs.append((f"transformer_blocks.{i}.attn", block.attn, proc))
    site.attach(model, "", _make_forward(st), replaces=False)
    site.hold(model, STATE, st)
    for fqn, attn, proc in procs:
        site.effect(attn, functools.partial(setattr, proc, "override", None),
                    apply=functools.partial(setattr, proc, "override", st), part="state", fqn=fqn)
    rows = "target-video query blocks" if st.video_only else "every query block"
    what = (f"block-sparse attention: {rows} keep {st.keep:g} of the {st.block_q}x{st.block_k} key blocks after "
            f"{st.dense_forwards} dense forwards")
    site.swap("forward", "every attention call dense", what)
    site.note(f"sparse_attention: {what}; keyed by the timestep vectors of num_inference_steps "
              f"{', '.join(map(str, counts))} (another vector runs dense, counted sparse_attention.fallback); per "
              "call: h3plan.runtime.levers.sparse_attention.calls(model)")
    return st


def calls(model) -> list[dict[str, int]]:
    """Each finished generation's forwards, dense and sparse counts (empty without the lever installed)."""
    st = model.__dict__.get(STATE)
    return [] if st is None else list(st.history)

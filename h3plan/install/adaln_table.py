"""adaln_table=on: the AdaLN modulation linears served from tables built at install (levers/adaln_table.py).

Tabled: every block's `adaln_proj.linear` and `norm_out.linear`. diffusers computes each as
`linear(silu(temb).to(linear's dtype))`, temb (T, time_embed_dim) float32 from `time_embedder`, T the call's
distinct timesteps; the output (T, 18 x hidden) is viewed as (3T, 6 x hidden) and chunked (rows
`timestep_index * 3 + modality`; norm_out: (T, 2 x hidden), chunked into shift and scale).

Install (`build`): the timestep vectors of the plan's request come from diffusers' own code: two
`MiniMaxH3Scheduler`s (the pipeline's shifts) `.set_timesteps(n)` for every step count, and the pipeline's
`MiniMaxH3SetTimestepsStep.build_row_timesteps` for the rows the request has (video, audio, conditioning);
the pipeline's own schedulers when installing into a pipeline (install/pipeline.py). For each vector, temb is
computed by the model's own `time_proj` / `time_embedder` on its device, as its forward does, and each
linear's entry is `F.linear(F.silu(temb).to(w.dtype), w, b)`: the forward's very GEMM (same shapes, dtypes,
device), hence its bits. Then the linears' parameters move to pinned host memory (install/parking.py). A model
loaded on the host and installed with `device=` (install/placement.py) keeps these linears off the device: each
one's weights are streamed to it for its entries (the same GEMM on the same device, so the same bits), and its
host tensors are copied into pinned memory (CUDA) for the misses; uninstall leaves them on the host, pageable.

Forward: `norm_out` (under a hook `h3plan.adaln_table`, install/hooks.py) and each block's `adaln_proj` (a bound
instance forward: it runs inside the blocks regional compile compiles, where a hooked forward costs a graph per
block) run diffusers' own code around the custom op
`h3plan::adaln_table(temb, weight, bias)` = `linear(silu(temb).to(weight.dtype))`, which looks the entry up
by the exact bits of temb (one 4 x T x time_embed_dim byte device-to-host copy per forward: the key is
memoised on the temb tensor while it is alive and unmodified, so the 51 linears share it) and returns a
copy. A vector not in the table, or weights changed, moved or replaced since install, is a miss counted
`adaln_table.fallback` with its reason and served exactly: the same GEMM on the weights as they are, streamed
to temb's device (the block's 2 x 18 x hidden x time_embed_dim bytes over PCIe), and added to the table.
Grad mode and autocast run that streamed eager expression outside the op (counted). PEFT layers wrapped around a
tabled linear after install without diffusers' checks (lora.py) make the call raise one InstallError line, never read
the table. A direct call of a parked linear streams its weights (counted). Compile: the op is opaque with a fake;
the counters it records run at call time. The timestep embedding that makes temb runs as opaque ops too
(install/adaln_temb.py), so a whole-model torch.compile keeps eager's temb bits and hits the table.

State dict while installed: the same keys, shapes, dtypes and bits; the AdaLN linears' tensors are the
pinned host copies (device cpu). `uninstall` copies them back into the same Parameter objects and removes
the hooks. `prepare(model_or_pipe, num_inference_steps=..., timesteps=...)` adds entries after install
(each linear's weights streamed to the device once).
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any, Optional

import torch
import torch.nn.functional as F

from h3plan.levers import counter, owner
from h3plan.errors import InstallError
from h3plan.runtime import count_op  # noqa: F401 (h3plan::count before any compiled call site)
from h3plan.runtime.guards import count_route, needs_grad

from . import adaln_temb
from .components import STATE, TRANSFORMERS, is_pipeline
from .hooks import attach, effect
from .lora import WAY
from .parking import park
from h3plan.runtime.schedule import step_counts, timestep_vectors

LEVER = owner("adaln_table")
COUNTER = counter("adaln_table")
_SLOTS: dict[int, "_Slot"] = {}  # weight.data_ptr() of a parked linear -> its slot (the op's lookup)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors keep no version counter
        return None


def _key(temb: torch.Tensor) -> tuple:
    t = temb.detach().contiguous()
    return (t.dtype, tuple(t.shape), t.cpu().view(torch.uint8).numpy().tobytes())


def linear_of(temb: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """diffusers' `linear(silu(temb).to(linear dtype))` with the weights on temb's device (streamed if parked)."""
    x = F.silu(temb).to(weight.dtype)
    w = weight.to(temb.device, non_blocking=True)
    b = None if bias is None else bias.to(temb.device, non_blocking=True)
    return F.linear(x, w, b)


class Tables:
    """One model's tables: the key index shared by its linears (every linear reads the same temb)."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        self.index: dict[tuple, int] = {}
        self.vectors: list[tuple[float, ...]] = []
        self.slots: list[_Slot] = []
        self._memo = None  # (weakref to temb, its version, key, key id)

    def lookup(self, temb: torch.Tensor) -> tuple[tuple, int | None]:
        ver, m = _version(temb), self._memo
        if m is not None and ver is not None and m[0]() is temb and m[1] == ver:
            return m[2], self.index.get(m[2])
        key = _key(temb)
        if ver is not None:
            self._memo = (weakref.ref(temb), ver, key)
        return key, self.index.get(key)

    def register(self, key: tuple) -> int:
        return self.index.setdefault(key, len(self.index))

    @property
    def rows(self) -> int:
        return sum(len(v) for v in self.vectors)

    @property
    def nbytes(self) -> int:
        return sum(e.numel() * e.element_size() for s in self.slots for e in s.entries.values())


class _Slot:
    """One tabled linear: its entries (key id -> output) and the weights they were computed from."""

    def __init__(self, fqn: str, linear: torch.nn.Linear, tables: Tables):
        self.fqn, self.linear, self.tables = fqn, linear, tables
        self.entries: dict[int, torch.Tensor] = {}
        self.stamp = None

    def seal(self) -> None:
        """Record the parked weights' identity (the op checks it on every call)."""
        w, b = self.linear.weight, self.linear.bias
        self.stamp = (w.data_ptr(), _version(w), None if b is None else (b.data_ptr(), _version(b)))

    def changed(self, weight, bias) -> str | None:
        b = None if bias is None else (bias.data_ptr(), _version(bias))
        if self.stamp != (weight.data_ptr(), _version(weight), b):
            return f"{self.fqn}'s weights changed since install: the table was dropped"
        return None


@torch.library.custom_op("h3plan::adaln_table", mutates_args=())
def adaln_table(temb: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """`linear(silu(temb).to(weight.dtype), weight, bias)`, the entry of the table installed for `weight` when it
    holds temb's exact bits (a copy), else computed on the weights streamed to temb's device (a counted miss)."""
    slot = _SLOTS.get(weight.data_ptr())
    why = "weights without a table (moved or replaced since install)" if slot is None else slot.changed(weight, bias)
    if why is None:
        key, kid = slot.tables.lookup(temb)
        entry = slot.entries.get(kid) if kid is not None else None
        if entry is not None and entry.device == temb.device:
            count_route(COUNTER, None)
            return entry.clone()
        why = (f"timestep vector not in the table (T={temb.shape[0]})" if entry is None else
               f"temb on {temb.device}, the table on {entry.device}")
        why += ": weights streamed to the device, the entry added"
    elif slot is not None:  # stale: start over from the weights as they are now
        slot.entries.clear()
    out = linear_of(temb, weight, bias)
    if slot is not None:
        if slot.stamp is None or slot.changed(weight, bias):
            slot.seal()
        key, _ = slot.tables.lookup(temb)
        slot.entries[slot.tables.register(key)] = out.clone()
    count_route(COUNTER, why)
    return out


@adaln_table.register_fake
def _(temb, weight, bias):
    return temb.new_empty((*temb.shape[:-1], weight.shape[0]), dtype=weight.dtype)


def _eager_reason(temb, weight, bias) -> str | None:
    if needs_grad(temb, weight, bias):
        return "grad enabled: the eager expression on streamed weights (autograd reaches the host parameters)"
    if torch.is_autocast_enabled(temb.device.type):
        return ("autocast enabled: the eager expression under autocast on streamed weights (the table holds the "
                "un-autocast GEMM)")
    return None


def projection(linear: torch.nn.Linear, temb: torch.Tensor) -> torch.Tensor:
    """The AdaLN projection `linear(silu(temb))` from the table, else its counted eager expression."""
    w, b = linear.weight, linear.bias
    why = _eager_reason(temb, w, b)
    if why is not None:
        count_route(COUNTER, why)
        return linear_of(temb, w, b)
    return torch.ops.h3plan.adaln_table(temb, w, b)


def _tabled(linear):
    """The tabled nn.Linear itself; PEFT layers wrapped around it since install (a LoRA, install/lora.py) refuse."""
    if type(linear) is not torch.nn.Linear:
        kind = f"{type(linear).__module__}.{type(linear).__name__}"
        raise InstallError(f"adaln_table: the tabled AdaLN linear is now {kind}, whose layers the table would bypass; "
                           f"{WAY}")
    return linear


def tabled_modulation_forward(self, temb: torch.Tensor):
    """diffusers' MiniMaxH3AdaLayerNormModulation.forward, the projection from the table."""
    temb = projection(_tabled(self.linear), temb)
    temb = temb.view(-1, 6 * self.hidden_size)
    return temb.chunk(6, dim=-1)


def tabled_norm_out_forward(self, hidden_states: torch.Tensor, temb: torch.Tensor, timestep_indices: torch.Tensor):
    """diffusers' MiniMaxH3AdaLayerNormOut.forward, the projection from the table."""
    shift, scale = projection(_tabled(self.linear), temb).chunk(2, dim=-1)
    hidden_states = self.norm(hidden_states)
    return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(0, timestep_indices)


def parked_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """A direct call of a parked AdaLN linear: nn.Linear's math on its weights streamed to x's device."""
    count_route(COUNTER, "direct call of a parked AdaLN linear: weights streamed to the device")
    return F.linear(x, self.weight.to(x.device), None if self.bias is None else self.bias.to(x.device))


def _temb(model, timestep: torch.Tensor, device) -> torch.Tensor:
    """temb exactly as MiniMaxH3Transformer3DModel.forward computes it from `timestep` (the pipeline's CPU float32
    vector moved to the device)."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    temb = model.time_proj(timestep.to(device))
    return model.time_embedder(temb.to(get_parameter_dtype(model.time_embedder)))


def _device(model) -> torch.device:
    return next(model.time_embedder.parameters()).device


# ---- install / prepare / uninstall ----------------------------------------------------------------------------


def _linears(model) -> list[tuple[str, torch.nn.Module, torch.nn.Linear]]:
    out = []
    for i, block in enumerate(model.transformer_blocks):
        out.append((f"transformer_blocks.{i}.adaln_proj", block.adaln_proj, block.adaln_proj.linear))
    out.append(("norm_out", model.norm_out, model.norm_out.linear))
    for fqn, _, lin in out:
        if type(lin) is not torch.nn.Linear:
            raise InstallError(f"adaln_table: {fqn}.linear is {type(lin).__name__}, not torch.nn.Linear; install "
                               f"without levers.adaln_table (or load diffusers' AdaLN projections as released)")
    return out


def _add(tables: Tables, model, vectors: list[torch.Tensor]) -> int:
    """Compute the entries of `vectors` not yet in the table, each linear's weights on temb's device (streamed there
    once per linear when they rest on the host: parked, or a host-loaded model installed with device=)."""
    device = _device(model)
    with torch.no_grad():
        todo = []
        for ts in vectors:
            temb = _temb(model, ts, device)
            key = _key(temb)
            if key not in tables.index:
                todo.append((tables.register(key), temb))
                tables.vectors.append(tuple(ts.tolist()))
        for slot in tables.slots:
            if not todo:
                break
            w, b = slot.linear.weight, slot.linear.bias
            w, b = w.to(device), None if b is None else b.to(device)
            for kid, temb in todo:
                slot.entries[kid] = linear_of(temb, w, b)
    return len(todo)


def build(model, value: dict[str, Any], state, swap, num_inference_steps=None) -> Tables:
    """Install the tables (module docstring); `value`: the lever's install option; `swap(lever, fqn, old, new)`
    logs a swap; num_inference_steps: more step counts to table."""
    steps = list(value["steps"]) + [int(n) for n in (num_inference_steps or ()) if int(n) not in value["steps"]]
    kw = {k: value[k] for k in ("video_shift", "audio_shift", "keyframe_noise_aug", "audio", "condition_video",
                                "condition_audio")}
    vectors = timestep_vectors(steps, **kw)
    tables = Tables({**kw, "steps": steps})
    mods = _linears(model)
    tables.slots = [_Slot(fqn + ".linear", lin, tables) for fqn, _, lin in mods]
    _add(tables, model, vectors)
    # install(..., device=) of a host-loaded model: the linears rest on the host
    placement = getattr(state, "placement", None)
    host_loaded = placement is not None and all(p.device.type == "cpu" for _, _, lin in mods for p in lin.parameters())
    parked = park([lin for _, _, lin in mods], pin_host=host_loaded and placement.device.type == "cuda")
    effect(model, LEVER, state, parked.unpark, part="parked")
    for slot in tables.slots:
        slot.seal()
        _SLOTS[slot.stamp[0]] = slot

    def unregister():
        for slot in tables.slots:
            if slot.stamp is not None and _SLOTS.get(slot.stamp[0]) is slot:
                del _SLOTS[slot.stamp[0]]
        model.__dict__.pop("_h3plan_adaln", None)

    effect(model, LEVER, state, unregister, part="tables")
    for fqn, mod, lin in mods:
        if fqn == "norm_out":
            attach(mod, fqn, LEVER, tabled_norm_out_forward, state)
        else:
            # a block's adaln_proj runs inside the block that compile_repeated_blocks compiles: dynamo guards a hooked
            # forward (a functools.partial per module) by identity, one graph per block, so it gets a bound method
            effect(mod, LEVER, state, functools.partial(mod.__dict__.pop, "forward", None), fqn=fqn,
                   apply=functools.partial(mod.__dict__.__setitem__, "forward",
                                           types.MethodType(tabled_modulation_forward, mod)))
        attach(lin, f"{fqn}.linear", LEVER, parked_linear_forward, state)
        swap(LEVER, f"{fqn}.linear", "Linear", f"table ({len(tables.vectors)} timestep vectors, {tables.rows} rows)")
    model._h3plan_adaln = tables
    temb_why = adaln_temb.install(model, state, LEVER)
    if host_loaded:  # each linear streamed for its entries, never on the device whole
        where = (f"loaded there, each streamed to {placement.device} once for its entries; "
                 + (f"{parked.pinned / 2**30:.2f} GiB copied into pinned host memory" if parked.pinned
                    else "kept as loaded"))
        kept = sum(p.numel() * p.element_size() for _, _, lin in mods for p in lin.parameters())
        label = f"{LEVER}: the AdaLN linears" + (" (pinned)" if parked.pinned else "")
        state.report.placement.setdefault("host", {})[label] = kept
    else:
        where = (f"{parked.nbytes / 2**30:.2f} GiB moved to pinned host memory" if parked.nbytes
                 else "already on the CPU: nothing moved")
    state.report.notes.append(
        f"adaln_table: {len(mods)} AdaLN linears served from a {tables.nbytes / 2**30:.3f} GiB table on "
        f"{_device(model)} ({len(tables.vectors)} timestep vectors at num_inference_steps "
        f"{', '.join(map(str, steps))}); their weights wait on the host ({where}); state_dict() shows those host "
        f"copies (same keys, dtypes and bits) until uninstall copies them back")
    state.report.notes.append(
        "adaln_table: the timestep embedding runs as opaque ops (install/adaln_temb.py), so a whole-model "
        "torch.compile keeps eager's temb and its table hits" if temb_why is None else
        f"adaln_table: the timestep embedding keeps its forward ({temb_why}): under a whole-model torch.compile its "
        f"temb may miss the table (counted, served by streaming the weights)")
    return tables


def inputs(model, decision, site) -> dict:
    """adaln_table's install step (its Spec.input_step): the tables of the plan's option, with the install's condition
    flags over the plan's and its extra step counts (`build`). Sets no block option back."""
    value = site.option()
    if value is not None:
        build(model, {**value, **site.conditions}, site.state, site.state.report.swap, site.steps)
    return {}


def _installed(obj) -> None:
    """prepare on an object with no h3plan plan in it (or in its transformers) is a mistake, not 0 entries."""
    if obj is None or not hasattr(obj, "__dict__"):
        raise InstallError(f"prepare expects a MiniMaxH3Transformer3DModel or MiniMaxH3ModularPipeline with a plan "
                           f"installed, got {type(obj).__name__}")
    models = [getattr(obj, n, None) for n in TRANSFORMERS if n in obj.component_names] if is_pipeline(obj) else [obj]
    if not any(m is not None and STATE in m.__dict__ for m in models):
        raise InstallError(f"prepare: no h3plan plan is installed in this {type(obj).__name__}; h3plan.install(model, "
                           f"plan) first (prepare adds step counts to an installed adaln_table)")


def tables_of(model) -> Tables | None:
    return model.__dict__.get("_h3plan_adaln")


def prepare(obj, num_inference_steps=None, *, timesteps=None, condition_video=None, condition_audio=None) -> int:
    """Add table entries after install: the vectors of `num_inference_steps` (an int or a list; a pipeline's own
    schedulers, else the plan's shifts) and/or explicit `timesteps` vectors (each as the transformer's `timestep`
    argument). obj: a transformer with adaln_table installed, or a MiniMaxH3ModularPipeline (both transformers).
    Returns the number of vectors added; 0 where the installed plan has no table (an object with no plan installed,
    or a step count diffusers refuses, is an InstallError)."""
    _installed(obj)
    if num_inference_steps is not None:  # checked whether or not a table is installed
        num_inference_steps = step_counts(num_inference_steps, "prepare")
    if is_pipeline(obj):
        added = 0
        schedulers = (getattr(obj, "scheduler", None), getattr(obj, "audio_scheduler", None))
        aug = getattr(obj, "keyframe_noise_aug", None)
        for name in TRANSFORMERS:
            model = getattr(obj, name, None) if name in obj.component_names else None
            if model is not None:
                added += _prepare(model, num_inference_steps, timesteps, condition_video, condition_audio,
                                  schedulers if None not in schedulers else None, aug)
        return added
    return _prepare(obj, num_inference_steps, timesteps, condition_video, condition_audio, None, None)


def _prepare(model, steps, timesteps, condition_video, condition_audio, schedulers, aug) -> int:
    tables = tables_of(model)
    if tables is None:
        return 0
    s = tables.spec
    vectors = []
    if steps is not None:
        vectors += timestep_vectors(steps, video_shift=s["video_shift"], audio_shift=s["audio_shift"],
                                    keyframe_noise_aug=s["keyframe_noise_aug"] if aug is None else aug,
                                    audio=s["audio"],
                                    condition_video=s["condition_video"] if condition_video is None
                                    else condition_video,
                                    condition_audio=s["condition_audio"] if condition_audio is None
                                    else condition_audio,
                                    schedulers=schedulers)
        s["steps"] = s["steps"] + [n for n in steps if n not in s["steps"]]
    for t in timesteps or ():
        vectors.append(torch.as_tensor(t, dtype=torch.float32).detach().cpu().reshape(-1))
    return _add(tables, model, vectors)


__all__ = ["Tables", "build", "inputs", "prepare", "step_counts", "tables_of", "timestep_vectors", "adaln_table"]

"""step_cache's runtime (its plan: levers/step_cache.py, whose `Spec.model_step` calls `install` here with the
install's Site, install/site.py): fewer transformer forwards, as a named diffusers hook on the transformer.

`h3plan.step_cache`, a diffusers ModelHook (HookRegistry, removable by name, install/hooks.py), wraps
MiniMaxH3Transformer3DModel's forward. Each call is placed in its generation by its `timestep` vector: install builds,
from diffusers' own MiniMaxH3Scheduler pair and the pipeline's build_row_timesteps
(runtime/schedule.py), the vectors of every forward at the plan's step count (the request's), at those
passed as num_inference_steps=, and at the pipeline's default step count, for every kind of row (audio or not,
conditioning rows or not): vector bits -> (forward index, forwards). One 4 x T byte device-to-host copy per call. A call
the plan did not plan for runs the whole forward, counted `step_cache.fallback` with its reason: a vector of the
pipeline's default step count where the plan's request has another (the reason names both), or a vector of no indexed
step count. Every count's first forward passes the same vector: it is placed as the plan's (it computes under every
schedule), and the second forward tells the counts apart (`_State.rebase`).

- fixed / taylor: a forward the schedule computes runs diffusers' forward and keeps its outputs (video and audio
  velocities); a skipped one returns a copy of the last computed outputs (fixed) or their first-order extrapolation
  in forward index from the last two computed ones (taylor; reuse while only one exists). A call of a step count
  passed as num_inference_steps= keeps the plan's fraction (levers/step_cache.scaled), its warm-up, final and limit
  in a row (counted `step_cache.scaled` per forward: no evidence covers it).
- first_block (Cache-DiT's DBCache, Fn 1, Bn 0): `transformer_blocks` iterates through the cache while a hooked call
  runs (its class swapped for `_CachedBlocks`, the same modules and state_dict keys): the first block runs, its
  residual (output less input) is compared with the one of the last computed forward (sum |r - r_prev| / sum
  |r_prev|, both sums all-reduced over the Ulysses group, so every rank takes the same decision), and below the
  threshold the other blocks give way to the first block's output plus the cached residual (last block out - first
  block out of the last computed forward); never in warm-up or final forwards, at most max_skip in a row. The
  iteration runs in the transformer's eager forward, outside the blocks that compile_repeated_blocks compiles: no
  guard sees the state.
Exact: a forward that computes runs diffusers' forward untouched (a schedule computing every forward, or threshold 0,
is bitwise the plan without the cache). Counted: `step_cache.fused` per placed call, `step_cache.computed` /
`step_cache.skipped` per forward, `step_cache.calls` per finished generation; `calls(model)` lists each generation's
computed count. uninstall removes the hook and restores the ModuleList's class.
"""

from __future__ import annotations

from typing import Any

import torch

from h3plan.levers import REGISTRY, counter, owner
from h3plan.runtime.counters import event
from h3plan.runtime.guards import count_route

from h3plan.runtime.schedule import schedule_index

LEVER = owner("step_cache")
COUNTER = counter("step_cache")
_SCHEDULE = REGISTRY[LEVER]  # the lever module: its schedule arithmetic (computed_mask, scaled)
HOOK = "h3plan." + LEVER  # the hook's name (install/hooks.py `name`)
STATE = "_h3plan_step_cache"  # the installed cache's _State, in the model's (and its blocks') __dict__




class _State:
    """One installed cache: the plan's values, the schedule index and the current generation. `runs`: the forwards
    counts whose calls run the cache (the plan's, and those passed as num_inference_steps=); `steps_of`: forwards ->
    the step count that gives them, for every indexed count."""

    def __init__(self, spec: dict[str, Any], index: dict[bytes, tuple[int, int]], group,
                 runs: set[int] | None = None, steps_of: dict[int, int] | None = None):
        self.spec, self.index, self.group = dict(spec), index, group
        self.runs = set(runs) if runs is not None else {int(spec["forwards"])}
        self.steps_of = dict(steps_of or {})
        self.history: list[dict[str, int]] = []
        self.reset()

    def reset(self) -> None:
        self.forwards = 0
        self.mask: tuple[bool, ...] = ()
        self.kept: list[tuple[int, tuple]] = []  # (forward index, outputs) of the last two computed forwards
        self.computed = self.skipped = 0
        self.done: list[bool] = []  # per forward of this generation, in order: computed (True) or skipped
        self.run = 0  # skipped in a row (first_block)
        self.first_res = self.first_out = self.residual = None
        self.active, self.step, self.skip = False, -1, False

    def begin(self, forwards: int) -> None:
        self.reset()
        s = self.spec
        self.forwards = forwards
        if s["mode"] in ("fixed", "taylor"):
            c = _SCHEDULE.scaled(s["computed"], s["forwards"], forwards)
            self.mask = _SCHEDULE.computed_mask(forwards, c, s["warmup"], s["final"], s["max_skip"])
        else:  # first_block: the forwards that never skip
            self.mask = _SCHEDULE.computed_mask(forwards, 0, s["warmup"], s["final"])

    def rebase(self, forwards: int) -> None:
        """The generation begun as the plan's is of `forwards` forwards (its first forward, computed under every
        schedule, told the counts apart only now): its mask, keeping what that forward left."""
        done, kept, computed = self.done, self.kept, self.computed
        first_res, first_out, residual, step = self.first_res, self.first_out, self.residual, self.step
        self.begin(forwards)
        self.done, self.kept, self.computed, self.step = done, kept, computed, step
        self.first_res, self.first_out, self.residual = first_res, first_out, residual
        if forwards != int(self.spec["forwards"]):
            event(LEVER, "scaled")  # its first forward, counted as the plan's

    def finish(self) -> None:
        self.history.append({"forwards": self.forwards, "computed": self.computed, "skipped": self.skipped})
        event(LEVER, "calls")

    def unplanned(self, forwards: int) -> str | None:
        """Why a call of `forwards` forwards does not run the cache (None: it does)."""
        if forwards in self.runs:
            return None
        mine = self.steps_of.get(int(self.spec["forwards"]), self.spec["steps"])
        return (f"a call at num_inference_steps={self.steps_of.get(forwards, '?')}, not the plan's {mine}: every "
                f"forward computed (plan the request's steps, or install(num_inference_steps=) to run a scaled "
                f"schedule)")

    # ------------------------------------------------------------------ fixed / taylor

    def keep(self, step: int, out: tuple) -> None:
        self.kept = (self.kept + [(step, tuple(t.detach() for t in out))])[-2:]

    def reuse(self, step: int) -> tuple:
        (i1, v1) = self.kept[-1]
        if self.spec["mode"] == "taylor" and len(self.kept) == 2:
            (i0, v0) = self.kept[0]
            w = (step - i1) / (i1 - i0)
            return tuple((b.float() + w * (b.float() - a.float())).to(b.dtype) for a, b in zip(v0, v1))
        return tuple(t.clone() for t in v1)

    # ------------------------------------------------------------------ first_block

    def blocks(self, mods):
        first, rest = mods[0], mods[1:]

        def probe(h, *a):
            out = first(h, *a)
            if not rest:
                self.skip = False
                return out
            res = out - h  # the first block's residual: Cache-DiT's Fn residual
            self.skip = self._first_block_skip(res)
            if not self.skip:
                self.first_res, self.first_out = res.detach(), out.detach()
            return out

        yield probe
        if self.skip:
            yield lambda h, *a: h + self.residual
            return
        yield from rest[:-1]

        def record(h, *a):
            out = rest[-1](h, *a)
            self.residual = (out - self.first_out).detach()
            self.first_out = None
            return out

        yield record

    def _first_block_skip(self, res: torch.Tensor) -> bool:
        """Whether this forward skips, from its first block's residual `res` (module docstring)."""
        s, prev = self.spec, self.first_res
        if (self.mask[self.step] or prev is None or self.residual is None or self.run >= s["max_skip"]
                or s["threshold"] <= 0 or prev.shape != res.shape):
            return False
        sums = torch.stack([(res.float() - prev.float()).abs().sum(), prev.float().abs().sum()])
        return relative_change(sums, self.group) < s["threshold"]


def relative_change(sums: torch.Tensor, group=None) -> float:
    """sum |a - b| / sum |b| from this rank's two sums, reduced over `group` (None: this rank alone): every rank gets
    the same value, hence the same decision."""
    if group is not None:
        import torch.distributed as dist

        sums = sums.clone()
        dist.all_reduce(sums, group=group)
    d, base = sums.double().tolist()
    return d / base if base > 0 else (0.0 if d == 0 else float("inf"))


class _CachedBlocks(torch.nn.ModuleList):
    """transformer_blocks while first_block is installed: a hooked call iterates through the cache."""

    def __iter__(self):
        st = self.__dict__.get(STATE)
        if st is None or not st.active:
            return iter(self._modules.values())
        return st.blocks(list(self._modules.values()))


def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, tuple) else (out.sample, out.audio_sample)


def _make_forward(state: _State):
    """The hook's forward around `original` (the transformer's): places each call in its generation and computes,
    reuses or extrapolates (module docstring)."""

    def step_cache_forward(original, *args, **kwargs):
        st = state
        ts = kwargs["timestep"] if "timestep" in kwargs else args[3]
        where = st.index.get(ts.detach().to("cpu", torch.float32).numpy().tobytes())
        if where is None:
            count_route(COUNTER, "a timestep vector of no indexed step count (install(num_inference_steps=) adds "
                               "counts): every forward computed")
            st.reset()
            return original(*args, **kwargs)
        step, n = where
        why = st.unplanned(n)
        if why is not None:
            count_route(COUNTER, why)
            st.reset()
            return original(*args, **kwargs)
        if step == 0 or step != st.step + 1:
            st.begin(n)
        elif n != st.forwards:  # forward 0 passed every count's first vector: the call is of this count
            st.rebase(n)
        if n != int(st.spec["forwards"]):
            event(LEVER, "scaled")
        st.step = step
        count_route(COUNTER, None)
        if st.spec["mode"] == "first_block":
            st.active = True
            try:
                out = original(*args, **kwargs)
            finally:
                st.active = False
            skipped = st.skip
            st.run = st.run + 1 if skipped else 0
        elif st.mask[step] or not st.kept:
            out = original(*args, **kwargs)
            st.keep(step, _outputs(out))
            skipped = False
        else:
            out, skipped = None, True
        st.done.append(not skipped)
        if skipped:
            st.skipped += 1
            event(LEVER, "skipped")
            if out is None:
                like = kwargs.get("return_dict", True) is False
                values = st.reuse(step)
                out = values if like else _like_output(values)
        else:
            st.computed += 1
            event(LEVER, "computed")
        if step == n - 1:
            st.finish()
        return out

    return step_cache_forward


def _like_output(values: tuple):
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerOutput

    return MiniMaxH3TransformerOutput(sample=values[0], audio_sample=values[1])


def install(model, spec: dict[str, Any], site) -> _State:
    """Register the hook (and, for first_block, the blocks' iteration; the state on the model: hooks of their own)
    through `site` (install/site.py): its `steps`, more step counts that run the plan's schedule scaled; its plan's
    `pipeline` section: its shifts place the calls, and its default step count is indexed to name a call at it (it
    computes every forward where it is not the plan's); its `group`, the Ulysses group the first block's decision is
    reduced over. spec: the lever's values (levers/step_cache.py `values`)."""
    steps, group, pipeline = site.steps, site.group, site.plan.get("pipeline") if site.plan is not None else None
    mine = int(spec["steps"])
    extra = sorted({int(s) for s in (steps or [])} - {mine})
    # the plan's own count first: every count's first forward passes the same vector, placed as the plan's (it
    # computes under every schedule)
    default_steps = (pipeline or {}).get("num_inference_steps")
    known = [mine, *extra, *([int(default_steps)] if default_steps
                             and int(default_steps) not in (mine, *extra) else [])]
    steps_of: dict[int, int] = {}
    index = schedule_index(known, pipeline, counts=steps_of)
    runs = {f for f, n in steps_of.items() if n in (mine, *extra)} | {int(spec["forwards"])}
    st = _State(spec, index, group, runs=runs, steps_of=steps_of)
    site.attach(model, "", _make_forward(st), replaces=False)
    blocks = model.transformer_blocks
    if spec["mode"] == "first_block":
        old = type(blocks)

        def cached():
            blocks.__class__ = _CachedBlocks
            blocks.__dict__[STATE] = st

        def plain():
            blocks.__dict__.pop(STATE, None)
            blocks.__class__ = old

        site.effect(blocks, plain, apply=cached, fqn="transformer_blocks")
    site.hold(model, STATE, st)
    limit = f", at most {spec['max_skip']} in a row" if spec["max_skip"] < spec["forwards"] else ""
    if spec["mode"] == "first_block":
        what = (f"first-block cache: residual threshold {spec['threshold']:g}{limit}, warm-up {spec['warmup']} + final "
                f"{spec['final']} never skip")
    else:
        mask = _SCHEDULE.computed_mask(spec["forwards"], spec["computed"], spec["warmup"], spec["final"],
                                       spec["max_skip"])
        what = (f"{spec['mode']} schedule: computes {sum(mask)} of {spec['forwards']} forwards per call "
                f"(num_inference_steps={mine}{limit}), skips {[i for i, m in enumerate(mask) if not m]}")
    site.swap("forward", "every forward computed", what)
    site.note(f"step_cache: {what}; planned for num_inference_steps={mine} (the request's): call "
              f"pipe(..., num_inference_steps={mine}); computed per call: "
              "h3plan.runtime.levers.step_cache.calls(model) and counters() step_cache.computed / .calls")
    others = [n for n in known if n != mine and n not in extra]
    if others:
        site.note(f"step_cache: a call at num_inference_steps={', '.join(map(str, others))} (the pipeline's default), "
                  f"or at any count not planned, is not the plan's {mine}: it computes every forward, counted "
                  "step_cache.fallback with that reason")
    if extra:
        site.note(f"step_cache: calls at num_inference_steps={', '.join(map(str, extra))} "
                  "(install(num_inference_steps=)) run the plan's schedule scaled, which no evidence covers "
                  "(unmeasured), counted step_cache.scaled per forward")
    return st


def calls(model) -> list[dict[str, int]]:
    """Each finished generation's forwards, computed and skipped counts (empty without an installed step cache)."""
    st = model.__dict__.get(STATE)
    return [] if st is None else list(st.history)

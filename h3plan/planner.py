"""resolve(config) -> Plan: validate the composed config, derive the shape numbers, let every lever
decide in registry order (each sees the decisions before it), then add the estimates.

Deterministic and pure (no torch, no clock, no environment; `model.path` names the one file input: the
checkpoint's config.json files, read for its widths). A forced lever that cannot apply, or an
`auto` with no allowed setting, raises PlanningError (one line, every reason of the failing lever).

The Plan it returns is plain frozen data: the configuration it was resolved from (as plain dicts), the derived
numbers a user needs, and one Decision per lever in installation order; the whole contract between planning (CPU,
no torch) and installing (GPU host). `Plan.from_dict(plan.to_dict()) == plan` and the YAML / JSON round trips are
the identity, so a plan resolved on a laptop installs unchanged on a cluster. A plan read back (`from_dict`,
`load`) is planned again from its own config: what is derivable (losslessness, params, the derived numbers, notes)
comes from the planner, not the file; a decision the config does not give is planned as forced (and must apply);
anything else (a lever missing, twice or unknown, a lossless flag the lever registry contradicts, params the
planner does not derive, a config that does not plan) is a PlanFileError.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .errors import H3PlanError, PlanFileError, PlanningError
from .levers import LEVER_SETTINGS, REGISTRY, SPECS, Context, LeverError
from .planning import checkpoint, derive, memory, schema
from .planning.decision import Decision, freeze, thaw
from .planning.config import compose, override
from .planning.schema import PLAN_SECTIONS

SCHEMA_VERSION = 1

__all__ = ["PlanningError", "Plan", "resolve", "resolve_config", "context", "make_plan"]


@dataclass(frozen=True)
class Plan:
    """A resolved plan. `config` and `derived` are frozen mappings; `decisions` keep lever order."""

    config: tuple[tuple[str, Any], ...]
    derived: tuple[tuple[str, Any], ...]
    decisions: tuple[Decision, ...]
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default=())

    def decision(self, lever: str) -> Decision:
        for d in self.decisions:
            if d.lever == lever:
                return d
        raise KeyError(f"plan has no decision for lever {lever!r}; levers: {[d.lever for d in self.decisions]}")

    def get(self, section: str) -> dict[str, Any]:
        """A config section (hardware, recipe, parallel, model, vae, video, pipeline, memory, levers) as a plain
        dict ({} when a hand-built plan lacks it); a name that is no section raises SectionError (an H3PlanError and
        a KeyError) with the near miss."""
        if section not in PLAN_SECTIONS:
            import difflib

            near = difflib.get_close_matches(str(section), PLAN_SECTIONS, n=1)
            raise SectionError(f"Plan.get({section!r}): no such config section" + (f" (did you mean {near[0]!r}?)" if near else "")
                               + f"; sections: {', '.join(PLAN_SECTIONS)}")
        cfg = thaw(self.config) if self.config else {}
        return cfg.get(section, {})

    def derived_value(self, key: str, default: Any = None) -> Any:
        for k, v in self.derived:
            if k == key:
                return thaw(v) if isinstance(v, tuple) else v
        return default

    @property
    def lossless(self) -> bool:
        return all(d.lossless for d in self.decisions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "config": thaw(self.config) if self.config else {},
            "derived": thaw(self.derived) if self.derived else {},
            "decisions": [d.to_dict() for d in self.decisions],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        """A Plan from its dict form; anything that is not one raises PlanFileError (one line)."""
        if not isinstance(d, Mapping):
            raise PlanFileError(f"a plan must be a mapping with 'decisions', got {type(d).__name__}")
        try:
            version = int(d.get("schema_version", SCHEMA_VERSION))
        except (TypeError, ValueError):
            raise PlanFileError(f"schema_version must be an integer, got {d.get('schema_version')!r}") from None
        if version != SCHEMA_VERSION:
            raise PlanFileError(f"plan schema_version {version} is not supported (this h3plan reads {SCHEMA_VERSION})")
        if not isinstance(d.get("decisions"), list) or not d["decisions"]:
            raise PlanFileError("a plan needs a non-empty 'decisions' list (write one with `python -m h3plan out=plan.yaml`)")
        for key in ("config", "derived"):
            if not isinstance(d.get(key) or {}, Mapping):
                raise PlanFileError(f"plan '{key}' must be a mapping")
        decisions = tuple(Decision.from_dict(x) for x in d["decisions"])
        _check_levers(decisions)
        return _replan(dict(d.get("config", {}) or {}), dict(d.get("derived", {}) or {}), decisions)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, width=120)

    @classmethod
    def from_yaml(cls, text: str) -> "Plan":
        import yaml

        return cls.from_dict(yaml.safe_load(text))

    def save(self, path: str) -> None:
        """Write the plan file `Plan.load` reads: JSON for a .json path (any case), else YAML. An unwritable path
        raises PlanFileError naming it."""
        path = str(path)
        text = self.to_json() + "\n" if is_json_path(path) else self.to_yaml()
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as e:
            raise PlanFileError(f"plan file {path}: cannot write it ({e.strerror or e})") from e

    @classmethod
    def load(cls, path: str) -> "Plan":
        """Read a plan file (.json in any case, else YAML); a missing, unreadable or malformed file raises
        PlanFileError naming the file."""
        import yaml

        path = str(path)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise PlanFileError(f"plan file {path}: {e.strerror or e}") from None
        try:
            if is_json_path(path):
                raw = json.loads(text)
            else:
                raw = yaml.safe_load(text)
        except json.JSONDecodeError as e:
            raise PlanFileError(f"plan file {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise PlanFileError(f"plan file {path}: malformed YAML{where}: {getattr(e, 'problem', None) or e}") from None
        try:
            return cls.from_dict(raw)
        except PlanFileError as e:
            raise PlanFileError(f"plan file {path}: {e}") from None


def is_json_path(path) -> bool:
    """A plan path is JSON when it ends in .json, in any case (p.JSON too); anything else is YAML."""
    return str(path).lower().endswith(".json")


class SectionError(PlanFileError, KeyError):
    """Plan.get of a name that is no config section: an H3PlanError, and a KeyError for `except KeyError`."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


def _check_levers(decisions) -> None:
    """Every lever of the registry once, each setting one of its own, its lossless flag the registry's."""
    seen: set[str] = set()
    for d in decisions:
        if d.lever not in LEVER_SETTINGS:
            raise PlanFileError(f"unknown lever {d.lever!r}; known: {', '.join(LEVER_SETTINGS)}")
        if d.lever in seen:
            raise PlanFileError(f"decision {d.lever!r} appears twice")
        seen.add(d.lever)
        if d.setting not in LEVER_SETTINGS[d.lever]:
            raise PlanFileError(f"{d.lever}={d.setting} is not one of its settings: {', '.join(LEVER_SETTINGS[d.lever])}")
        if d.lossless != SPECS[d.lever].lossless(d.setting):
            truth = "lossless" if SPECS[d.lever].lossless(d.setting) else "lossy"
            raise PlanFileError(f"decision {d.lever}={d.setting} says lossless: {str(d.lossless).lower()}, but "
                                f"{d.lever}={d.setting} is {truth} (h3plan/levers/{d.lever}.py SPEC)")
    missing = [lever for lever in LEVER_SETTINGS if lever not in seen]
    if missing:
        raise PlanFileError(f"a plan needs a decision for every lever; missing: {', '.join(missing)} (write the plan with "
                            "`python -m h3plan out=plan.yaml`)")


def _replan(config: dict[str, Any], derived: dict[str, Any], decisions: tuple[Decision, ...]) -> "Plan":
    """The plan its config gives, with the file's settings (those the config does not pick are planned as forced);
    the file's params must be the planner's. Raises PlanFileError (one line)."""
    lacking = [s for s in PLAN_SECTIONS if not isinstance(config.get(s), Mapping)]
    if lacking:
        raise PlanFileError(f"plan 'config' lacks the section(s) {', '.join(lacking)} (write the plan with "
                            "`python -m h3plan out=plan.yaml`)")
    unknown = sorted(set(config) - set(PLAN_SECTIONS))
    if unknown:
        raise PlanFileError(f"plan 'config' has unknown section {unknown[0]!r}; sections: {', '.join(PLAN_SECTIONS)}")
    sections = copy.deepcopy(config)
    seq_len = sections["parallel"].get("seq_len")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise PlanFileError(f"parallel.seq_len={seq_len}: must be a positive integer")
    from_request = (derived.get("sequence") or {}).get("source") != "parallel.seq_len"
    if from_request:
        sections["parallel"]["seq_len"] = None  # the video request gives it: planned again, then compared
    want = {d.lever: d for d in decisions}
    for _ in range(3):  # forcing one setting can change a later auto pick: at most a few rounds
        try:
            fresh = resolve(copy.deepcopy(sections))
        except H3PlanError as e:
            raise PlanFileError(f"its config and decisions do not plan: {e}") from None
        off = [d.lever for d in fresh.decisions if d.setting != want[d.lever].setting]
        if not off:
            break
        sections["levers"].update({lever: want[lever].setting for lever in off})
    else:
        raise PlanFileError(f"decisions {', '.join(off)} do not follow from the plan's config")
    if from_request and fresh.get("parallel")["seq_len"] != seq_len:
        raise PlanFileError(f"parallel.seq_len={seq_len}, but its video request gives {fresh.get('parallel')['seq_len']:,} "
                            "tokens (set parallel.seq_len when planning to plan for another length)")
    for d in fresh.decisions:
        mine, theirs = dict(want[d.lever].params), dict(d.params)
        extra = sorted(set(mine) - set(theirs))
        if extra:
            raise PlanFileError(f"decision {d.lever}: unknown params {', '.join(extra)}"
                                + (f"; the planner gives: {', '.join(theirs)}" if theirs else "; the planner gives none"))
        for k, v in mine.items():
            if v != theirs[k]:
                raise PlanFileError(f"decision {d.lever}: params.{k} is {thaw(v)!r}, but its config gives {thaw(theirs[k])!r} "
                                    "(change the config and plan again)")
    return fresh


def make_plan(config: Mapping[str, Any], derived: Mapping[str, Any], decisions, notes=()) -> Plan:
    return Plan(config=freeze(dict(config)), derived=freeze(dict(derived)), decisions=tuple(decisions), notes=tuple(notes))




def context(sections: Mapping[str, Any], decisions: Mapping[str, Any] | None = None,
            request: Mapping[str, Any] | None = None) -> Context:
    shp = derive.shape(sections)
    req = dict(request or {})
    return Context(
        hardware=sections["hardware"], recipe=sections["recipe"], parallel=sections["parallel"],
        model=sections["model"], vae=sections["vae"], levers=MappingProxyType(dict(sections["levers"])),
        shape=MappingProxyType(shp), decisions=MappingProxyType(dict(decisions or {})),
        request=MappingProxyType(req if req.get("source", "").startswith("video") else {}),
        pipeline=MappingProxyType(dict(sections.get("pipeline") or {})),
    )


def _notes(sections: Mapping[str, Any], decisions) -> list[str]:
    hw, r = sections["hardware"], sections["recipe"]
    lossy = [d.lever for d in decisions if not d.lossless]
    notes = []
    if lossy and r["policy"] == "lossless":
        notes.append(f"lossy by the recipe's own choice: {', '.join(lossy)} (each line gives its measured error); every "
                     "other lever keeps eager's bits given the attention backend")
    elif lossy:
        notes.append(f"lossy levers: {', '.join(lossy)}; budget PSNR >= {r['budget']['psnr_db_min']} dB, SSIM >= {r['budget']['ssim_min']} "
                     "(action=verify reports the measured error against diffusers' eager forward)")
    else:
        notes.append("lossless plan: every lever keeps eager's bits given the attention backend")
    unverified = [d.lever for d in decisions if not d.hardware_verified]
    if unverified:
        notes.append(f"* never run on {hw['name']} hardware by h3plan: {', '.join(unverified)}")
    return notes


def _memory(sections, shape, decisions) -> tuple[dict[str, Any], dict[str, str]]:
    """The peak-memory estimate per GPU (h3plan/planning/memory.py) against the hardware's memory; a plan that cannot
    fit raises PlanningError with the numbers and the nearest option that fits."""
    est = memory.estimate(sections, shape, decisions)
    hw, m = sections["hardware"], sections["memory"]
    gb = hw["device"]["memory_gb"]
    values = {"memory_peak_gib_per_gpu": est["peak_gib"], "memory_peak_phase": est["peak_phase"],
              "memory_peak_items": list(est["phases"][est["peak_phase"]]["items"]),
              "memory_breakdown_gib": {k: round(v, 2) for k, v in est["breakdown"].items()},
              "memory_install_gib": est["install_gib"], "memory_loaded_gib": est["loaded_gib"]}
    basis = {"memory_peak_gib_per_gpu": est["summary"] + f"; against {gb} GB ({hw['name']} hardware.device.memory_gb) less "
                                        f"memory.reserve_fraction {m['reserve_fraction']:g}",
             "memory_breakdown_gib": "; ".join(f"{k}: {v}" for k, v in est["basis"].items()),
             "memory_peak_items": f"the items of the peak phase ({est['peak_phase']})",
             "memory_install_gib": ("the install's device peak for a pipeline loaded on the host, h3plan.install(pipe, plan, "
                                    "device=\"cuda\"): " + " + ".join(est["phases"]["install"]["items"])),
             "memory_loaded_gib": ("the pipeline as loaded, before install, on the device (what a pipeline loaded on the GPU "
                                   "first holds; more than the plan's peak when the plan parks or quantises weights)")}
    if getattr(decisions.get("adaln_table"), "setting", None) == "on":  # where the freed memory goes
        off = memory.estimate(sections, shape, {**decisions, "adaln_table": "off"})
        values["memory_peak_gib_tables_off"] = off["peak_gib"]
        basis["memory_peak_gib_tables_off"] = (
            f"the same plan with levers.adaln_table=off ({off['peak_phase']}): the tables free "
            f"{off['peak_gib'] - est['peak_gib']:.1f} GiB of this GPU's peak")
    if gb and m["check"]:
        why = memory.fit(est, gb, m["reserve_fraction"])
        if why:
            raise PlanningError(f"the plan does not fit one {hw['name']} GPU: {why}")
    return values, basis


def _recipe_choice(module, ctx: Context, d) -> bool:
    """A lossy setting a lossless recipe asks for itself (a lever's own `policy`, e.g. recipe.vae=fp16)."""
    policy = getattr(module, "policy", None)
    return policy is not None and not policy(ctx, d.setting)


def resolve(cfg) -> Plan:
    """cfg: the composed Hydra config (DictConfig) or a plain dict with the same sections."""
    # model.path: the checkpoint's config.json files, the one input read from outside the config (torch-free);
    # ConfigError (an H3PlanError) on values the schema rules out
    sections = schema.validate(checkpoint.with_model_path(cfg))
    sequence, sequence_basis = sections.pop("sequence"), sections.pop("sequence_basis")
    ctx = context(sections, request=sequence)
    decisions: dict[str, Any] = {}
    for lever, module in REGISTRY.items():
        try:
            decisions[lever] = module.decide(ctx)
        except LeverError as e:
            raise PlanningError(str(e), e.reasons) from None
        ctx = context(sections, decisions, sequence)
        if sections["recipe"]["policy"] == "lossless" and not decisions[lever].lossless and not _recipe_choice(module, ctx, decisions[lever]):
            raise AssertionError(f"internal: lossy {lever}={decisions[lever].setting} under a lossless policy")
    derived = derive.merge(ctx.shape, derive.estimates(sections, ctx.shape, decisions))
    mem, mem_basis = _memory(sections, ctx.shape, decisions)
    derived.update(mem, sequence=sequence)
    derived["basis"] = {**derived["basis"], **mem_basis, "sequence": "; ".join(f"{k}: {v}" for k, v in sequence_basis.items())}
    return make_plan(sections, derived, decisions.values(), notes=_notes(sections, decisions.values()))


def resolve_config(**groups) -> Plan:
    """Compose the packaged config with group choices and overrides, then resolve it (`h3plan.resolve_config`).

    resolve_config(hardware="sm107", recipe="nvfp4", parallel="u8", **{"parallel.seq_len": 104076})

    Raises H3PlanError (ConfigError, PlanningError) with the CLI's one-line message on bad input.
    """
    return resolve(compose([override(k, v) for k, v in groups.items()]))

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
comes from the planner, not the file, and where the file's differ a warning names them (H3PlanWarning, one line); a
decision the config does not give is planned as forced (and must apply);
anything else (a lever missing, twice or unknown, a lossless flag the lever registry contradicts, params the
planner does not derive, a config that does not plan) is a PlanFileError.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .errors import ConfigError, H3PlanError, H3PlanWarning, PlanFileError, PlanningError, UsageError
from .levers import LEVER_SETTINGS, REGISTRY, SPECS, TERM_OWNERS, Context, LeverError, terms
from .planning import CONF, checkpoint, derive, memory, predict, schema
from h3plan.facts.decision import Decision, freeze, thaw
from .planning.config import compose, override
from .planning.render import evidence, render_summary, render_table
from .planning.request import one_pipeline
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

    def __str__(self) -> str:
        """print(plan): the summary the CLI prints (h3plan/planning/render.py); repr() keeps the dataclass form."""
        return render_summary(self)

    def summary(self, detail: str = "summary") -> str:
        """The CLI's table: detail="summary" (its default) or "full" (every reason, its sources, the derived
        numbers)."""
        if detail not in ("summary", "full"):
            raise UsageError(f"Plan.summary(detail={detail!r}): allowed: summary, full")
        return render_summary(self) if detail == "summary" else render_table(self)

    def decision(self, lever: str) -> Decision:
        for d in self.decisions:
            if d.lever == lever:
                return d
        import difflib

        levers = [d.lever for d in self.decisions]
        near = difflib.get_close_matches(str(lever), levers, n=1)
        raise SectionError(f"Plan.decision({lever!r}): no such lever"
                           + (f" (did you mean {near[0]!r}?)" if near else "")
                           + f"; levers: {', '.join(levers)}")

    def get(self, section: str) -> dict[str, Any]:
        """A config section (hardware, recipe, parallel, model, vae, video, pipeline, memory, levers) as a plain
        dict ({} when a hand-built plan lacks it); a name that is no section raises SectionError (an H3PlanError and
        a KeyError) with the near miss."""
        if section not in PLAN_SECTIONS:
            import difflib

            near = difflib.get_close_matches(str(section), PLAN_SECTIONS, n=1)
            raise SectionError(f"Plan.get({section!r}): no such config section"
                               + (f" (did you mean {near[0]!r}?)" if near else "")
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
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "plan") -> "Plan":
        """A Plan from its dict form; anything that is not one raises PlanFileError (one line). What the planner
        derives (derived numbers, reasons, notes) comes from its config: where the dict's differ they are replaced,
        and a warning (H3PlanWarning, one line starting with `source`) names them."""
        if not isinstance(d, Mapping):
            raise PlanFileError(f"a plan must be a mapping with 'decisions', got {type(d).__name__}")
        unknown = sorted(map(str, set(d) - set(PLAN_KEYS)))
        if unknown:
            raise PlanFileError(f"plan has unknown key {unknown[0]!r}; keys: {', '.join(PLAN_KEYS)}")
        if not isinstance(d.get("decisions"), list) or not d["decisions"]:
            raise PlanFileError("a plan needs a non-empty 'decisions' list (write one with `python -m h3plan "
                                "out=plan.yaml`)")
        if "schema_version" not in d:
            raise PlanFileError(f"plan lacks schema_version (this h3plan reads {SCHEMA_VERSION}; Plan.save and "
                                "`python -m h3plan out=plan.yaml` write it)")
        try:
            version = int(d["schema_version"])
        except (TypeError, ValueError):
            raise PlanFileError(f"schema_version must be an integer, got {d.get('schema_version')!r}") from None
        if version != SCHEMA_VERSION:
            raise PlanFileError(f"plan schema_version {version} is not supported (this h3plan reads {SCHEMA_VERSION})")
        for key in ("config", "derived"):
            if not isinstance(d.get(key) or {}, Mapping):
                raise PlanFileError(f"plan '{key}' must be a mapping")
        decisions = tuple(Decision.from_dict(x) for x in d["decisions"])
        _check_levers(decisions)
        plan = _replan(dict(d.get("config", {}) or {}), dict(d.get("derived", {}) or {}), decisions)
        _say_recomputed(d, plan, source)
        return plan

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        if not isinstance(text, (str, bytes, bytearray)):
            raise PlanFileError(f"Plan.from_json takes the JSON text, got {type(text).__name__} "
                                f"(Plan.load reads a file)")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanFileError(f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        return cls.from_dict(raw)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, width=120)

    @classmethod
    def from_yaml(cls, text: str) -> "Plan":
        import yaml

        if not isinstance(text, (str, bytes)):
            raise PlanFileError(f"Plan.from_yaml takes the YAML text, got {type(text).__name__} "
                                f"(Plan.load reads a file)")
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PlanFileError(_yaml_line(e)) from None
        return cls.from_dict(raw)

    def save(self, path: str) -> None:
        """Write the plan file `Plan.load` reads: JSON for a .json path (any case), else YAML. An unwritable path
        raises PlanFileError naming it."""
        if not isinstance(path, (str, os.PathLike)):
            raise PlanFileError(f"Plan.save takes a file path (str or os.PathLike), got {type(path).__name__}")
        path = os.fspath(path)
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
            raise PlanFileError(f"plan file {path}: {_yaml_line(e)}") from None
        try:
            return cls.from_dict(raw, source=f"plan file {path}")
        except PlanFileError as e:
            raise PlanFileError(f"plan file {path}: {e}") from None


def _yaml_line(e) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"malformed YAML{where}: {getattr(e, 'problem', None) or e}"


PLAN_KEYS = ("schema_version", "config", "derived", "decisions", "notes")  # what Plan.to_dict writes


def _say_recomputed(d: Mapping[str, Any], plan: Plan, source: str) -> None:
    """Warn (one line) where the file's derived values, reasons or notes differ from what its config plans: they were
    replaced, so a hand edit of them is never kept silently. A key the file leaves out is no edit; a file with a setting
    chosen by hand (planned as forced) has them planned anew for it, as documented."""
    import warnings

    fresh = plan.to_dict()
    if any(x.forced != bool(y.get("forced", False)) for x, y in zip(plan.decisions, _by_lever(d["decisions"], plan))):
        return
    mine = dict(d.get("derived") or {})
    changed = [f"derived.{k}" for k in mine if mine[k] != fresh["derived"].get(k)]
    planned = {x["lever"]: x["reasons"] for x in fresh["decisions"]}
    changed += [f"the reasons of {x['lever']}" for x in d["decisions"]
                if "reasons" in x and [str(r) for r in x["reasons"] or ()] != planned[x["lever"]]]
    if d.get("notes") and list(d["notes"]) != fresh["notes"]:
        changed.append("notes")
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        verb = "differs" if len(changed) == 1 and changed[0].startswith("derived.") else "differ"
        warnings.warn(f"{source}: {shown} {verb} from what its config plans, replaced (derived numbers, reasons and "
                      "notes come from the config; edited by hand, or saved by another h3plan version: change the "
                      "config and plan again)", H3PlanWarning, stacklevel=_caller_level())


def _by_lever(decisions, plan: Plan) -> list:
    """The file's decision dicts in the plan's lever order."""
    mine = {x["lever"]: x for x in decisions}
    return [mine[d.lever] for d in plan.decisions]


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first frame outside h3plan/ (the user's call), from its caller's frame."""
    import sys

    here, level = os.path.dirname(os.path.abspath(__file__)), 1
    frame: Any = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def is_json_path(path) -> bool:
    """A plan path is JSON when it ends in .json, in any case (p.JSON too); anything else is YAML."""
    return str(path).lower().endswith(".json")


class SectionError(PlanFileError, KeyError):
    """Plan.get of a name that is no config section, Plan.decision of one that is no lever: an H3PlanError, and a
    KeyError for `except KeyError`."""

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
            raise PlanFileError(f"{d.lever}={d.setting} is not one of its settings: "
                                f"{', '.join(LEVER_SETTINGS[d.lever])}")
        if d.lossless != SPECS[d.lever].lossless(d.setting):
            truth = "lossless" if SPECS[d.lever].lossless(d.setting) else "lossy"
            raise PlanFileError(f"decision {d.lever}={d.setting} says lossless: {str(d.lossless).lower()}, but "
                                f"{d.lever}={d.setting} is {truth} (h3plan/levers/{d.lever}.py SPEC)")
    missing = [lever for lever in LEVER_SETTINGS if lever not in seen]
    if missing:
        raise PlanFileError(f"a plan needs a decision for every lever; missing: {', '.join(missing)} (write the plan "
                            f"with `python -m h3plan out=plan.yaml`)")


RECIPE_IDENTITY = ("checkpoint", "policy")  # what a packaged recipe's name stands for (conf/recipe/<name>.yaml)


def _check_recipe_name(recipe: Mapping[str, Any]) -> None:
    """A plan file's recipe.name that names a packaged recipe must keep that recipe's checkpoint and policy: the
    reasons quote the name beside the policy ("recipe fp8 is lossless" after an edited name)."""
    import yaml

    name = str(recipe.get("name"))
    path = os.path.join(CONF, "recipe", f"{name}.yaml")
    if not os.path.isfile(path):
        return  # a recipe of the user's own
    with open(path) as f:
        packaged = yaml.safe_load(f)
    wrong = [f"{k} {recipe.get(k)!r} (recipe {name}: {packaged[k]!r})"
             for k in RECIPE_IDENTITY if recipe.get(k) != packaged[k]]
    if wrong:
        raise PlanFileError(f"config.recipe.name={name} does not match its recipe section: {', '.join(wrong)}; edited "
                            f"by hand? plan again with recipe=<name> (python -m h3plan recipe={name} out=plan.yaml)")


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
    _check_recipe_name(sections["recipe"])
    seq_len = sections["parallel"].get("seq_len")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise PlanFileError(f"parallel.seq_len={seq_len}: must be a positive integer")
    from_request = (derived.get("sequence") or {}).get("source") != "parallel.seq_len"
    if from_request:
        sections["parallel"]["seq_len"] = None  # the video request gives it: planned again, then compared
    want = {d.lever: d for d in decisions}
    edited: list[str] = []  # the file's settings its config does not plan (hand-edited or hand-chosen), first round

    def refuse(why: str):
        """Lead with the settings the config does not give: a later lever's complaint is their consequence."""
        if edited:
            why = f"{', '.join(edited)}: {why}"
        return PlanFileError(why)

    for _ in range(3):  # forcing one setting can change a later auto pick: at most a few rounds
        try:
            fresh = resolve(copy.deepcopy(sections))
        except H3PlanError as e:
            raise refuse(f"its config and decisions do not plan: {e}") from None
        off = [d.lever for d in fresh.decisions if d.setting != want[d.lever].setting]
        if not off:
            break
        if not edited:
            edited = [f"decision {d.lever}={want[d.lever].setting} (its config plans {d.setting})"
                      for d in fresh.decisions if d.lever in off]
        sections["levers"].update({lever: want[lever].setting for lever in off})
    else:
        raise refuse(f"decisions {', '.join(off)} do not follow from the plan's config")
    if from_request and fresh.get("parallel")["seq_len"] != seq_len:
        raise PlanFileError(f"parallel.seq_len={seq_len}, but its video request gives "
                            f"{fresh.get('parallel')['seq_len']:,} tokens (set parallel.seq_len when planning to plan "
                            f"for another length)")
    for d in fresh.decisions:
        mine, theirs = dict(want[d.lever].params), dict(d.params)
        extra = sorted(set(mine) - set(theirs))
        if extra:
            raise refuse(f"decision {d.lever}: unknown params {', '.join(extra)}"
                         + (f"; the planner gives: {', '.join(theirs)}" if theirs else "; the planner gives none"))
        for k, v in mine.items():
            if v != theirs[k]:
                raise refuse(f"decision {d.lever}: params.{k} is {thaw(v)!r}, but its config gives {thaw(theirs[k])!r} "
                             "(change the config and plan again)")
    return fresh


def make_plan(config: Mapping[str, Any], derived: Mapping[str, Any], decisions, notes=()) -> Plan:
    return Plan(config=freeze(dict(config)), derived=freeze(dict(derived)), decisions=tuple(decisions),
                notes=tuple(notes))




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


def _notes(sections: Mapping[str, Any], decisions, memory_over: str | None = None) -> list[str]:
    hw, r = sections["hardware"], sections["recipe"]
    lossy = [d.lever for d in decisions if not d.lossless]
    notes = []
    if lossy and r["policy"] == "lossless":
        own = [f"{d.lever}={d.setting} ({'; '.join(evidence(d)) or 'its error never measured by h3plan'})"
               for d in decisions if not d.lossless]
        notes.append(f"lossy by the recipe's own choice, outside its lossless policy: {'; '.join(own)}; every "
                     "other lever keeps eager's bits given the attention backend")
    elif lossy:
        notes.append(f"lossy levers: {', '.join(lossy)}; budget PSNR >= {r['budget']['psnr_db_min']} dB, SSIM >= "
                     f"{r['budget']['ssim_min']} (action=verify reports the measured error against diffusers' eager "
                     f"forward)")
    else:
        notes.append("lossless plan: every lever keeps eager's bits given the attention backend")
    if memory_over:
        notes.append(f"does not fit one {_gpu(hw)} GPU (memory.check=false: reported, not refused): {memory_over}")
    unverified = [d.lever for d in decisions if not d.hardware_verified  # an encode lever off for t2va runs nothing
                  and not (SPECS[d.lever].table_skips_off and d.setting == "off")]
    if unverified:
        notes.append(f"* never run on {hw['name']} hardware by h3plan: {', '.join(unverified)}")
    return notes


def _gpu(hw: Mapping[str, Any]) -> str:
    """The GPU the user named (hardware=h100, a file of their own), where its facts may be another's (hardware.name)."""
    return str(hw.get("option") or hw["name"])


def _memory(sections, shape, decisions) -> tuple[dict[str, Any], dict[str, str]]:
    """The peak-memory estimate per GPU (h3plan/planning/memory.py) against the hardware's memory; a plan that cannot
    fit raises PlanningError with the numbers and the nearest option that fits."""
    hw, m = sections["hardware"], sections["memory"]
    est = memory.estimate(sections, shape, decisions)  # refuses a memory.vae_dtype it does not know
    vd = terms(decisions).vae_cast or "fp32"
    if m["vae_dtype"] != "fp32" and vd != m["vae_dtype"]:  # a VAE loaded in fp16/bf16 decodes in its own dtype
        raise PlanningError(f"memory.vae_dtype={m['vae_dtype']} sizes a VAE loaded in {m['vae_dtype']}, which decodes "
                            f"in {m['vae_dtype']}, but the plan decodes in {vd} (vae_precision={vd}): set "
                            f"recipe.vae={m['vae_dtype']} to plan that decode, or memory.vae_dtype=fp32 (the VAE as "
                            f"released)")
    gb = hw["device"]["memory_gb"]
    values = {"memory_peak_gib_per_gpu": est["peak_gib"], "memory_peak_phase": est["peak_phase"],
              "memory_peak_items": list(est["phases"][est["peak_phase"]]["items"]),
              "memory_breakdown_gib": {k: round(v, 2) for k, v in est["breakdown"].items()},
              "memory_install_gib": est["install_gib"], "memory_loaded_gib": est["loaded_gib"],
              "memory_host_gib": est["host_gib"], "memory_host_items_gib": est["host_items"]}
    basis = {"memory_peak_gib_per_gpu": est["summary"] + f"; against {gb} GB ({hw['name']} "
                                                         f"hardware.device.memory_gb) less "
                                        f"memory.reserve_fraction {m['reserve_fraction']:g}",
             "memory_breakdown_gib": "; ".join(f"{k}: {v}" for k, v in est["basis"].items()),
             "memory_peak_items": f"the items of the peak phase ({est['peak_phase']})",
             "memory_install_gib": ("the install's device peak for a pipeline loaded on the host, h3plan.install(pipe, "
                                    "plan, device=\"cuda\"): " + " + ".join(est["phases"]["install"]["items"])),
             "memory_loaded_gib": ("the pipeline as loaded, before install, on the device (what a pipeline moved to "
                                   "the GPU whole before install holds, a placed text encoder's weights included; more "
                                   "than the plan's peak when the plan parks or quantises weights)"),
             "memory_host_gib": ("what the installed plan keeps in the host's memory per process, beside the "
                                 "process itself: " + ("; ".join(f"{k}: {v}" for k, v in est["host_basis"].items())
                                                       or "nothing")),
             "memory_host_items_gib": "memory_host_gib's items"}
    if est.get("text_encoder") is not None:  # the conditioner's placement (levers/text_encoder.py), with its reasons
        values["text_encoder"] = est["text_encoder"]
        basis["text_encoder"] = ("; ".join(est["text_encoder"]["reasons"])
                                 + " (memory.text_encoder; planning/text_encoder.py)")
    tables = TERM_OWNERS["adaln_tables"]  # adaln_table
    if getattr(decisions.get(tables), "setting", None) == "on":  # where the freed memory goes
        try:
            off = memory.estimate(sections, shape, {**decisions, tables: "off"})
        except ConfigError:  # a forced memory.text_encoder placement the AdaLN linears' bytes would not leave room for
            off = memory.estimate({**sections, "memory": {**(sections.get("memory") or {}), "text_encoder": "auto"}},
                                  shape, {**decisions, tables: "off"})
        values["memory_peak_gib_tables_off"] = off["peak_gib"]
        basis["memory_peak_gib_tables_off"] = (
            f"the same plan with levers.{tables}=off ({off['peak_phase']}): the tables free "
            f"{off['peak_gib'] - est['peak_gib']:.1f} GiB of this GPU's peak")
    why = memory.fit(est, gb, m["reserve_fraction"]) if gb else None
    if why and m["check"]:
        raise PlanningError(f"the plan does not fit one {_gpu(hw)} GPU: {why}")
    if why:  # memory.check=false: reported, never printed as if it fitted
        values["memory_does_not_fit"] = why
        basis["memory_does_not_fit"] = "memory.check=false: the estimate is reported, not refused"
    return values, basis


def _apart(sections: Mapping[str, Any]) -> str | None:
    """A VAE whose latents are not the transformer's input (vae=h3_tiny beside model=h3): no pipeline holds the
    two, so the plan sizes each alone; said in the plan, never silent."""
    if one_pipeline(sections):
        return None
    mdc, vdc = sections["model"]["diffusers_config"], sections["vae"]["diffusers_config"]
    return (f"vae {sections['vae']['name']} (latent_channels {vdc.get('latent_channels')}) and model "
            f"{sections['model']['name']} (in_channels {mdc.get('in_channels')}) make no pipeline: "
            f"the plan sizes each alone")


def _recipe_choice(module, ctx: Context, d) -> bool:
    """A lossy setting a lossless recipe asks for itself (a lever's own `policy`, e.g. recipe.vae=fp16)."""
    policy = getattr(module, "policy", None)
    return policy is not None and not policy(ctx, d.setting)


def resolve(cfg) -> Plan:
    """cfg: the composed Hydra config (DictConfig) or a plain dict with the same sections."""
    _check_config_argument(cfg)
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
        if (sections["recipe"]["policy"] == "lossless" and not decisions[lever].lossless
                and not _recipe_choice(module, ctx, decisions[lever])):
            raise AssertionError(f"internal: lossy {lever}={decisions[lever].setting} under a lossless policy")
    est = derive.estimates(sections, ctx.shape, decisions)
    fwd = predict.forward(sections, ctx.shape, est)
    settings = {k: d.setting for k, d in decisions.items()}
    cache = next((d for d in decisions.values() if terms({d.lever: d}).fewer_forwards), None)
    computed = cache.param("computed") if cache is not None else None
    spread = next((d for d in decisions.values() if terms({d.lever: d}).vae_spread), None)
    spread_params = dict(spread.params) if spread is not None else None
    sparse = next((d for d in decisions.values() if d.enabled and terms({d.lever: d}).sparse_blocks), None)
    mem, mem_basis = _memory(sections, ctx.shape, decisions)
    times = predict.call(sections, sequence, ctx.shape, fwd, settings, computed,
                         dense=sparse.param("dense_forwards") if sparse is not None else None,
                         parallel_decode=spread_params, text_encoder=mem.get("text_encoder"))
    if computed:
        times["computed_forwards"] = computed
        times.setdefault("basis", {})["computed_forwards"] = "step_cache: the forwards its schedule computes"
    if cache is not None and cache.param("fewest_computed") is not None:  # adaptive: a range
        most = REGISTRY[cache.lever].fewest_mask(cache.param("forwards"), cache.param("warmup"), cache.param("final"),
                                                 cache.param("max_skip"))
        rng = predict.call_range(sections, sequence, times, fwd, [i for i, m in enumerate(most) if not m],
                                 dense=sparse.param("dense_forwards") if sparse is not None else None)
        times.update({k: v for k, v in rng.items() if k != "basis"})
        times.setdefault("basis", {}).update(rng.get("basis", {}))
    derived = derive.merge(ctx.shape, {**est, **fwd, **times,
                                       "basis": {**est["basis"], **fwd["basis"], **times.get("basis", {})}})
    derived.update(mem, sequence=sequence)
    apart = _apart(sections)
    if apart:
        derived["components_apart"] = apart
    derived["basis"] = {**derived["basis"], **mem_basis, "sequence": "; ".join(f"{k}: {v}"
                                                                               for k, v in sequence_basis.items())}
    return make_plan(sections, derived, decisions.values(), notes=(([apart] if apart else [])
                                                                   + _notes(sections, decisions.values(),
                                                                            mem.get("memory_does_not_fit"))))


def _check_config_argument(cfg) -> None:
    """resolve's argument: a mapping of config sections (each a mapping), with the model among them."""
    hint = "h3plan.resolve_config(hardware=\"sm90\", recipe=\"bf16\") composes the packaged config from group choices"
    if not isinstance(cfg, Mapping):
        raise UsageError(f"h3plan.resolve takes the composed config (a DictConfig, or a dict of its sections), got "
                         f"{type(cfg).__name__}; {hint}")
    groups = [f"{k}={v!r}" for k, v in cfg.items() if k in PLAN_SECTIONS and not isinstance(v, Mapping)]
    if groups:
        raise UsageError(f"h3plan.resolve: {groups[0]} is a group choice, not a config section; {hint}")
    if "model" not in cfg:
        raise ConfigError("model", f"missing section: h3plan.resolve takes the whole composed config; {hint}")


def resolve_config(*positional, **groups) -> Plan:
    """Compose the packaged config with group choices and overrides, then resolve it (`h3plan.resolve_config`).

    resolve_config(hardware="sm107", recipe="nvfp4", parallel="u8", **{"parallel.seq_len": 104076})

    Raises H3PlanError (ConfigError, PlanningError) with the CLI's one-line message on bad input.
    """
    if positional:
        raise UsageError(f"h3plan.resolve_config takes group choices by name, e.g. resolve_config(hardware=\"sm90\", "
                         f"recipe=\"bf16\"); got {len(positional)} positional argument(s): {positional[0]!r}")
    for key in groups:
        top = key.partition(".")[0]
        if top in NOT_A_PLAN:
            raise UsageError(f"resolve_config({key}=...): {top} is the command line's, not the plan's: "
                             f"{NOT_A_PLAN[top]}")
    return resolve(compose([override(k, v) for k, v in groups.items()]))


_ACTION = "an action runs from the command line (python -m h3plan action=verify ...) on the plan it resolves"
NOT_A_PLAN = {"out": "plan.save(path) writes the plan", "format": "plan.to_json() and plan.to_yaml() give it",
              "detail": "plan.summary(detail=\"full\") prints every reason", "plan": "h3plan.Plan.load(path) reads one",
              "action": _ACTION, "verify": _ACTION, "bench": _ACTION, "calibrate": _ACTION, "tune": _ACTION}
"""The top-level config keys resolve_config refuses: they shape what the CLI does with a plan, never the plan."""

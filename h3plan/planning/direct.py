"""The packaged config composed without Hydra, for the command lines where that gives Hydra's own config.

Scope: config.yaml's defaults list as it stands (the schema, one option per group or none (`tier: null`), `_self_`),
group options that are plain files (no `@package` header; a defaults list only of the same group's options and
`_self_`, as a tuned hardware file has) or `# @package _global_` files whose defaults list is `/group/option@group`
entries of their own group, `override /group: option` entries of other groups (tier=quality: the choice changes
unless the command line names that group, as Hydra does) and `_self_` (vae=h3_tiny), found in conf/ and then in the
folders of a `hydra.searchpath=[file:///...]` override, and overrides of the forms `group=option` and `dotted.key=value`
(a key given twice is set twice, in order, as Hydra does) where the value is null, a bool, a decimal int or float, a
bare name, a file path, a flat list of those, or a flat `{name:value,...}` mapping of those but paths. That is every
plan a user types and most configs the tests compose. The merge is Hydra's own sequence of OmegaConf calls (its
ConfigLoaderImpl: the groups merged in defaults order onto an empty node, struct mode, then each key override through
`OmegaConf.update(merge=True)`), so the config is the same object Hydra builds, less its `hydra` node
(tests/cli/test_direct_compose.py compares the two). The merged groups are cached per choices and file stamps
(`_MERGED`); every call gets its own deep copy.

Fallback: `compose` returns None for anything else (a `+`/`~` prefix, a quoted or interpolated value, a sweep, a group
file with any other defaults entry or header, a search path folder that is not there, a repeated group) and for any
error but one, so that Hydra composes and words the error itself; `FALLBACKS` counts each with its reason.
The one: an OmegaConf error from a key override (an unknown key, a value its type or choices refuse) is raised as
`Refused` with that error as its cause: Hydra's own OmegaConf.update call raises the same error on the same node, and
planning/config.py words the two alike (tests/cli/test_direct_compose.py compares the lines). Skipping Hydra's import,
its config repository and its own `hydra` node is about a third of a cold plan (benchmarks/plan_speed.py).
"""

from __future__ import annotations

import copy
import os
import re
from collections import Counter
from typing import Any

from h3plan.facts import CONF

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_KEY = re.compile(rf"{_NAME}(?:\.{_NAME})*")
_OPTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_INT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)\.[0-9]+")
_PATH = re.compile(r"[A-Za-z0-9_./-]*[/.][A-Za-z0-9_./-]*")  # several of Hydra's tokens: it keeps the text
_WORDS = {"null": None, "true": True, "false": False}  # Hydra's grammar reads these in any case
_UNSURE = object()
_FOLDER = r"file:///[A-Za-z0-9_./-]*"  # absolute folders only
_SEARCHPATH = re.compile(rf"\[({_FOLDER}(?:,{_FOLDER})*)\]")
_GLOBAL = re.compile(r"\s*#\s*@package\s+_global_\s*\n(?!\s*#\s*@)")  # Hydra's header: its first `# @key value` lines
_PACKAGED = re.compile(rf"/({_OPTION.pattern})/({_OPTION.pattern})@({_OPTION.pattern})")  # /group/option@package


def _value(text: str) -> Any:
    """Hydra's reading of an unquoted override value, for the forms above; _UNSURE for any other."""
    if text.startswith("[") and text.endswith("]"):
        items = [_value(x) for x in text[1:-1].split(",")] if text != "[]" else []
        return _UNSURE if any(x is _UNSURE or isinstance(x, (list, dict)) for x in items) else items
    if text.startswith("{") and text.endswith("}"):
        pairs = [x.partition(":") for x in text[1:-1].split(",")]
        if any(not re.fullmatch(_NAME, k) or k.lower() in (*_WORDS, "inf", "nan") or not c for k, c, _ in pairs):
            return _UNSURE  # also an empty mapping
        out = {k: _value(v) for k, _, v in pairs}
        unsure = len(out) < len(pairs) or any(x is _UNSURE or isinstance(x, (list, dict))
                                              or (isinstance(x, str) and not re.fullmatch(_NAME, x))
                                              for x in out.values())
        return _UNSURE if unsure else out
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if re.fullmatch(_NAME, text) and text.lower() not in ("inf", "nan"):
        return text
    if _PATH.fullmatch(text) and re.search(r"[A-Za-z_/]", text) and not re.search(r"[eE][0-9+-]", text):
        return text  # a file name or path (out=, plan=); no exponent that Hydra might read as a float
    return _UNSURE


def _defaults(primary) -> list[tuple[str, str | None]] | None:
    """config.yaml's defaults as (group, option) with ("", name) for the schema and `_self_`; None for other forms."""
    out: list[tuple[str, str | None]] = []
    for d in primary.get("defaults", ()):
        if isinstance(d, str):
            out.append(("", d))
        elif len(d) == 1:
            (key, option), = d.items()
            if not key.startswith("override hydra/"):  # Hydra's own groups: its `hydra` node, dropped anyway
                if not (_OPTION.fullmatch(key) and (option is None or isinstance(option, str))):
                    return None
                out.append((key, option))  # None: a group no option is chosen for until the command line names one
        else:
            return None
    return out


def _read(path: str):
    """A group option's YAML as (its defaults list or None, its data without it, whether its header puts it in the
    `_global_` package), read by OmegaConf's YAML loader as OmegaConf.load reads it (merged once, not first built as a
    node and then copied); None for a file this module leaves to Hydra (any other header, not a mapping). Cached per
    file stamp."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    stamp = _stamp(path)
    if stamp is None or not os.path.isfile(path):
        return None
    if stamp in _FILES:
        return _FILES[stamp]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    glob = _GLOBAL.match(text) is not None
    header = re.search(r"^\s*#\s*@", text, re.M) and not glob
    data = None if header else yaml.load(text, Loader=get_yaml_loader())
    read = None
    if isinstance(data, dict):
        defaults = data.pop("defaults", None)
        read = None if defaults is not None and not isinstance(defaults, list) else (defaults, data, glob)
    if len(_FILES) >= 256:
        _FILES.clear()
    _FILES[stamp] = read
    return read


def _group_files(group: str, option: str, folders: list[str], depth: int = 0) -> list[tuple[str, dict, str]] | None:
    """(path, data, package) of every file Hydra merges for `group=option`, in its order: the option found in the
    first folder that has it (conf/, then the search path's), and where that file has a defaults list, the options it
    names and the file itself where it puts `_self_`, which it must name. A file in the group's package names the
    same group's options; a `_global_` file (package "") names `/group/option@group` of its own group. None for any
    other defaults entry (Hydra composes)."""
    path = next((p for p in (os.path.join(d, group, f"{option}.yaml") for d in folders) if os.path.isfile(p)), None)
    if path is None or depth >= 8:
        return None
    read = _read(path)
    if read is None:
        return None
    defaults, data, glob = read
    package = "" if glob else group
    if defaults is None:
        return [(path, data, package)]
    if "_self_" not in defaults:
        return None
    out: list[tuple[str, dict, str]] = []
    for d in defaults:
        if d == "_self_":
            out.append((path, data, package))
            continue
        if glob and _override_entry(d) is not None:
            continue  # another group's choice: compose() applies it before it reads that group's files
        if not isinstance(d, str):
            return None
        packaged = _PACKAGED.fullmatch(d) if glob else None
        if packaged is not None and packaged.group(1) == packaged.group(3) == group:
            inner = _group_files(group, packaged.group(2), folders, depth + 1)
            inner = inner if inner is not None and all(p == group for _, _, p in inner) else None
        else:
            inner = _group_files(group, d, folders, depth + 1) if not glob and _OPTION.fullmatch(d) else None
        if inner is None:
            return None
        out += inner
    return out


def _override_entry(d) -> tuple[str, str] | None:
    """(group, option) of a `{override /group: option}` defaults entry, else None."""
    if isinstance(d, dict) and len(d) == 1:
        (key, option), = d.items()
        m = re.fullmatch(rf"override /({_OPTION.pattern})", str(key))
        if m is not None and isinstance(option, str) and _OPTION.fullmatch(option):
            return m.group(1), option
    return None


def _chosen_overrides(group: str, option: str, folders: list[str]) -> list[tuple[str, str]] | None:
    """The `override /group: option` entries of the `_global_` file `group=option` (a tier: conf/tier/), in order;
    None where it has any other entry than those, the file's own group's options and `_self_` (Hydra composes)."""
    path = next((p for p in (os.path.join(d, group, f"{option}.yaml") for d in folders) if os.path.isfile(p)), None)
    read = _read(path) if path is not None else None
    if read is None:
        return None
    defaults, _, glob = read
    entries = [_override_entry(d) for d in defaults or ()]
    return [e for e in entries if e is not None] if glob else ([] if not any(entries) else None)


def _stamp(path: str) -> tuple[str, int, int] | None:
    """A file's identity for the cache below: an edited file (new mtime or size) is read again."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path, st.st_mtime_ns, st.st_size


_MERGED: dict[tuple, Any] = {}
"""The schema and group files merged (before struct mode and the key overrides), per group choices and file stamps:
a deep copy is about a tenth of the merge, and a process that plans many times (a sweep, predict, the tests) repeats
a few choices. Least recently used first; at most _MERGED_MAX entries."""
_MERGED_MAX = 32
_FILES: dict[tuple, Any] = {}


FALLBACKS: Counter[str] = Counter()
"""Why Hydra composed instead, counted per process (the reasons below)."""


class Refused(Exception):
    """A key override that OmegaConf refuses: `error` is OmegaConf's error (also the cause)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _to_hydra(reason: str) -> None:
    FALLBACKS[reason] += 1
    return None


def compose(overrides: list[str]):
    """The packaged config with `overrides` as Hydra composes it (its `hydra` node left out, `hardware.option` set),
    or None where Hydra must compose (see the module docstring). Runs under config.libyaml()."""
    from omegaconf import DictConfig, OmegaConf, flag_override
    from omegaconf.errors import OmegaConfBaseException

    from . import schema

    try:
        with open(os.path.join(CONF, "config.yaml"), encoding="utf-8") as f:
            primary = OmegaConf.create(f.read())
        defaults = _defaults(primary) if isinstance(primary, DictConfig) else None
        if defaults is None or not isinstance(primary, DictConfig):
            return _to_hydra("config.yaml's defaults list")
        choices = {g: o for g, o in defaults if g}
        keys: list[tuple[str, Any]] = []
        seen: set[str] = set()  # groups and the search path: once each
        folders = [CONF]
        for o in overrides:
            key, eq, text = o.partition("=")
            if key == "hydra.searchpath" and key not in seen:
                seen.add(key)
                listed = _SEARCHPATH.fullmatch(text)
                if listed is None:
                    return _to_hydra("a search path other than a list of file:// folders")
                folders += [f[len("file://"):] for f in listed.group(1).split(",")]
                if not all(map(os.path.isdir, folders)):
                    return _to_hydra("a search path folder that is not there")  # Hydra warns
                continue
            if not eq or not _KEY.fullmatch(key) or key in seen or key.split(".")[0] == "hydra":
                return _to_hydra("an override form other than key=value once per group")
            if key in choices:
                seen.add(key)
                if not _OPTION.fullmatch(text):
                    return _to_hydra("a group option that is not a plain name")
                choices[key] = text
                continue
            if os.path.isdir(os.path.join(CONF, key.split(".")[0])) and "." not in key:
                return _to_hydra("a group outside the defaults list")  # Hydra says how to add it
            value = _value(text)
            if value is _UNSURE:
                return _to_hydra("a value other than null, a bool, a decimal number, a name, a path or a flat list")
            keys.append((key, value))
        for g, option in list(choices.items()):  # a chosen file's `override /G: O`: the command line's G wins
            made = _chosen_overrides(g, option, folders) if option is not None else []
            if made is None:
                return _to_hydra("a group option that is not a plain file, or one whose defaults are not its group's "
                                 "options and _self_")
            for other, choice in made:
                if other not in choices or other == g or choices[other] is None:
                    return _to_hydra("an override of a group outside the defaults list")
                if other not in seen:
                    choices[other] = choice
        sources: dict[str, list[tuple[str, dict, str]]] = {}
        for g, option in choices.items():
            if option is None:  # no option chosen: nothing merged for the group
                sources[g] = []
                continue
            found = _group_files(g, option, folders)
            if found is None:
                return _to_hydra("a group option that is not a plain file, or one whose defaults are not its group's "
                                 "options and _self_")
            sources[g] = found
        files = [os.path.join(CONF, "config.yaml")] + [path for g, _ in defaults if g for path, _, _ in sources[g]]
        if len(set(files)) < len(files):
            return _to_hydra("a file merged twice")
        cached = (schema.H3PlanConfig, tuple(defaults), tuple(choices.items()), tuple(map(_stamp, files)))
        merged = _MERGED.pop(cached, None)
        if merged is None:
            merged = OmegaConf.create()
            with flag_override(merged, "no_deepcopy_set_nodes", True):
                for group, option in defaults:
                    if option == schema.SCHEMA_NAME and not group:
                        merged.merge_with(OmegaConf.structured(schema.H3PlanConfig))
                    elif option == "_self_" and not group:
                        own = OmegaConf.masked_copy(primary,
                                                    [str(k) for k in primary if k not in ("defaults", "hydra")])
                        merged.merge_with(own)
                    elif group:
                        for _, data, package in sources[group]:
                            merged.merge_with({package: data} if package else data)
                    else:
                        return _to_hydra("config.yaml's defaults list")
        _MERGED[cached] = merged  # most recent last
        while len(_MERGED) > _MERGED_MAX:
            del _MERGED[next(iter(_MERGED))]
        cfg = copy.deepcopy(merged)  # the cached node is never handed out: callers and the overrides below edit theirs
        OmegaConf.set_struct(cfg, True)
        for key, value in keys:
            try:
                OmegaConf.update(cfg, key, value, merge=True)
            except OmegaConfBaseException as e:
                raise Refused(e) from e
        cfg.hardware.option = choices["hardware"]
        name = inherited_name(str(choices["hardware"]), folders)
        if name is not None:
            cfg.hardware.name = name
        return cfg
    except Refused:
        raise
    except Exception:  # noqa: BLE001 - Hydra composes again and words the error its own way
        return _to_hydra("an error")


PROVENANCE = ("measured", "verified", "tuned")
"""The sections whose facts are where h3plan measured or ran: the hardware's name is what they are credited to."""


def inherited_name(option: str, folders: list[str]) -> str | None:
    """A hardware file of your own (not in conf/) that extends a packaged option through its defaults list and sets a
    `name` of its own, but carries none of the PROVENANCE sections nor another compute capability: every measured and
    verified fact it has is the packaged option's, so that option's name (sm90) names them; the plan prints
    `hardware=<option> (as sm90: ...)` and never says it measured or verified anything on the file's own name. None
    for any other file (its name stands), and for a file this module leaves to Hydra."""
    files = _group_files("hardware", option, folders)
    if not files:
        return None
    packaged = os.path.join(CONF, "hardware")
    base = [data for path, data, _ in files if os.path.dirname(path) == packaged]
    own = [data for path, data, _ in files if os.path.dirname(path) != packaged]
    if not base or not own or not any("name" in d for d in own) or any(k in d for d in own for k in PROVENANCE):
        return None
    name, cc = base[-1].get("name"), str(base[-1].get("compute_capability"))
    if any("compute_capability" in d and str(d["compute_capability"]) != cc for d in own):
        return None  # another GPU: its own name stands
    return None if name is None else str(name)

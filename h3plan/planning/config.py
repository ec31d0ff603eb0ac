"""The packaged config, composed from Python or the CLI, and the one-line translation of every error.

`compose(overrides)` composes conf/ (beside this package) with Hydra overrides; `condense(exc)` turns any
exception from composition, validation or planning into (one line, exit code): 2 for bad input, 1 for
an h3plan bug. The CLI prints that line; the Python API raises `ConfigError(line)` instead of Hydra's
own exceptions. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

from h3plan.errors import ConfigError, H3PlanError, unknown_key_line

from . import CONF, direct
from .request import video_overrides

CONFIG_PATH = CONF
CONFIG_NAME = "config"


def compose(overrides: list[str]):
    """The packaged config composed with `overrides` (Hydra syntax); bad input raises an H3PlanError with the
    CLI's one-line message. Hydra composes only what planning/direct.py leaves to it (and every error but a key
    override's OmegaConf error, the same error Hydra's composition raises)."""
    overrides = video_overrides(list(overrides))
    check_overrides(overrides)
    try:
        with libyaml():
            cfg = direct.compose(overrides)
    except direct.Refused as e:  # the OmegaConf error Hydra's composition raises too, worded as Hydra's is below
        raise _config_error(condense(e.error)[0]) from None
    if cfg is not None:
        return cfg
    from hydra import compose as hydra_compose, initialize_config_dir

    from . import schema

    schema.register()
    try:
        with _outside_running_hydra(), libyaml(), initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            cfg = hydra_compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)
    except H3PlanError:
        raise
    except Exception as e:  # noqa: BLE001 - Hydra's and OmegaConf's errors become one line
        line, code = condense(e)
        if code != 2:
            raise
        raise _config_error(line) from None
    from omegaconf import open_dict, read_write

    choices, searchpath = dict(cfg.hydra.runtime.choices), list(cfg.hydra.searchpath)
    with read_write(cfg), open_dict(cfg):  # what hydra's compose(return_hydra_config=False) does
        del cfg["hydra"]
    return record_choices(cfg, choices, searchpath)


def record_choices(cfg, choices, searchpath=()):
    """`cfg` with the group options it was composed from that its values do not carry (hardware.option), and the
    packaged hardware's name where a file of your own on `searchpath` (hydra.searchpath's entries) only inherits its
    measured and verified facts (direct.inherited_name)."""
    if choices.get("hardware") is not None:
        cfg.hardware.option = choices["hardware"]
        folders = [CONFIG_PATH] + [str(p)[len("file://"):] for p in searchpath if str(p).startswith("file://")]
        name = direct.inherited_name(choices["hardware"], folders)
        if name is not None:
            cfg.hardware.name = name
    return cfg


@contextlib.contextmanager
def libyaml():
    """OmegaConf's YAML loader with libyaml's C parser under it, while Hydra composes: the same resolvers, the same
    duplicate-key check, the same file and line in an error (libyaml words a syntax error its own way), a fifth of the
    parsing time of a plan's files. Where PyYAML was built without libyaml, OmegaConf's own loader runs."""
    import omegaconf._utils as utils
    import yaml

    if not getattr(yaml, "__with_libyaml__", False) or getattr(utils.get_yaml_loader, "libyaml", False):
        yield  # no libyaml, or already under it (compose() inside the CLI's own Hydra run: calibrate's closing line)
        return
    original = utils.get_yaml_loader

    def c_loader():
        pure = original()  # omegaconf's SafeLoader subclass: its resolvers and construct_mapping, per call as it does

        class Loader(yaml.cyaml.CParser, pure):
            def __init__(self, stream):
                yaml.cyaml.CParser.__init__(self, stream)
                yaml.constructor.SafeConstructor.__init__(self)
                yaml.resolver.Resolver.__init__(self)

        return Loader

    c_loader.libyaml = True  # type: ignore[attr-defined]
    utils.get_yaml_loader = c_loader
    try:
        yield
    finally:
        utils.get_yaml_loader = original


@contextlib.contextmanager
def _outside_running_hydra():
    """Inside a running Hydra job (the CLI's task: calibrate's closing line plans its hint) GlobalHydra is
    initialised and `initialize_config_dir` refuses; the job's instance is set aside and put back afterwards."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton

    running = Singleton._instances.pop(GlobalHydra, None) if GlobalHydra.instance().is_initialized() else None
    try:
        yield
    finally:
        if running is not None:
            Singleton._instances[GlobalHydra] = running


def groups() -> dict[str, list[str]]:
    """Config group -> its packaged options (conf/<group>/*.yaml)."""
    return {g: sorted(f[:-5] for f in os.listdir(os.path.join(CONFIG_PATH, g)) if f.endswith(".yaml"))
            for g in sorted(os.listdir(CONFIG_PATH)) if os.path.isdir(os.path.join(CONFIG_PATH, g))}


def _literal(v: Any) -> str:
    """A Python value as a Hydra override value: None -> null, bools lower case, lists and dicts in Hydra's syntax,
    strings quoted where Hydra's grammar would split or convert them."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_literal(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_literal(x)}" for k, x in v.items()) + "}"
    s = str(v)
    plain = re.fullmatch(r"[\w./:+-]*", s) and s.lower() not in ("null", "true", "false")
    return s if plain else "'" + s.replace("'", "\\'") + "'"


def _several(key: str, given: list[str], shown: str) -> ConfigError:
    """A group given several options (a list, or the group twice): one plan takes one option of each group."""
    return ConfigError(shown, f"one plan per call: pick one option ({', '.join(groups()[key])}); to plan several, call "
                              f"once per option or sweep: python -m h3plan -m {key}={','.join(given)}")


def check_overrides(overrides: list[str]) -> None:
    """What the command line says twice, where composition would keep one silently: a group's options
    (one_option_per_group) and the device's memory in GB and in GiB (memory_gib would win)."""
    one_option_per_group(overrides)
    given = {}
    for o in overrides:
        key, eq, value = o.lstrip("+~").partition("=")
        if eq and key in MEMORY_KEYS and value.lower() != "null":
            given[key] = value
    if len(given) > 1:
        raise ConfigError(" ".join(f"{k}={v}" for k, v in given.items()), "the device's memory given twice, in GB and "
                          "in GiB (memory_gib would win): give one of them")


MEMORY_KEYS = ("hardware.device.memory_gb", "hardware.device.memory_gib")


def one_option_per_group(overrides: list[str]) -> None:
    """A config group set to a list of options (`recipe=[nvfp4,fp8]`, which Hydra merges into one config) or set twice
    (`hardware=sm90 hardware=sm100`, where the last would win) is a ConfigError: a plan takes one option per group."""
    seen: dict[str, list[str]] = {}
    known = groups()
    for o in overrides:
        key, eq, value = o.lstrip("+~").partition("=")
        if not eq or key not in known:
            continue
        if value.startswith("[") and value.endswith("]"):
            items = [x.strip() for x in value[1:-1].split(",") if x.strip()]
            raise _several(key, items, f"{key}={value}")
        seen.setdefault(key, []).append(value)
    for key, given in seen.items():
        if len(given) > 1:
            raise _several(key, given, " ".join(f"{key}={v}" for v in given))


def override(key: str, value: Any) -> str:
    """One `key=value` override from a Python keyword argument (resolve_config). A config group takes one option
    name: anything else (a number, a list of options) is a ConfigError naming what is allowed."""
    if key in groups() and not isinstance(value, str):
        options = groups()[key]
        if isinstance(value, (list, tuple)):
            raise _several(key, list(map(str, value)), f"{key}={list(value)}")
        near = [o for o in options if o == f"sm{value}"]
        raise ConfigError(f"{key}={value!r}", "a config group takes an option name as a string"
                          + (f" ({key}={near[0]!r})" if near else "") + f"; available: {', '.join(options)}")
    return f"{key}={_literal(value)}"


def _config_error(line: str) -> H3PlanError:
    """The CLI's line as an exception whose str() is that very line (ConfigError when it starts with a key)."""
    key, sep, msg = line.partition(": ")
    return ConfigError(key, msg) if sep and " " not in key else H3PlanError(line)


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def allowed_keys(full_key: str) -> list[str]:
    """Field names of the schema node that holds `full_key` ([] when it is not a structured node)."""
    import dataclasses
    import typing

    from . import schema

    node: Any = schema.H3PlanConfig
    for part in full_key.split(".")[:-1]:
        if not dataclasses.is_dataclass(node):
            return []
        hints = typing.get_type_hints(node)
        if part not in hints:
            return []
        node = hints[part]
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def _omegaconf_line(e) -> str:
    key = str(getattr(e, "full_key", "") or "")
    msg = str(getattr(e, "msg", e)).splitlines()[0]
    if re.match(r"Key '.*' not in '.*'", msg):
        return unknown_key_line(key, allowed_keys(key))
    m = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", msg)
    if m:
        hint = " (write 'on'/'off' in quotes in YAML)" if m.group(1) in ("True", "False") else ""
        return f"{key}={m.group(1)}: not allowed; allowed: {m.group(2)}{hint}"
    return f"{key}: {msg}" if key else msg


def condense(e: BaseException) -> tuple[str, int]:
    """(one line, exit code): 2 for bad input, 1 for anything else (an h3plan bug)."""
    import yaml
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    def one(s: str) -> str:
        return " ".join(str(s).split())

    for x in _chain(e):
        if isinstance(x, H3PlanError):
            return one(x), 2
        if isinstance(x, MissingConfigException):
            missing = x.missing_cfg_file or ""
            if "/" in missing and x.options is not None:
                group, _, name = missing.rpartition("/")
                hint = (" (the joblib and submitit launchers: pip install -e '.[sweep]' in a checkout)"
                        if group == "hydra/launcher"
                        else "" if group.startswith("hydra") else
                        f"; a file of your own sits in a folder on the search path: /path/to/conf/{group}/{name}.yaml "
                        f"with hydra.searchpath=[file:///path/to/conf]")
                return f"{group}={name}: no such option; available: {', '.join(sorted(x.options))}{hint}", 2
            return one(str(x).splitlines()[0]), 2
        if isinstance(x, OverrideParseException):
            return f"cannot parse the override: {one(str(x).splitlines()[0])}", 2
        if isinstance(x, yaml.YAMLError):
            mark = getattr(x, "problem_mark", None)
            where = f" in {mark.name}, line {mark.line + 1}" if mark is not None else ""
            return f"malformed YAML{where}: {one(getattr(x, 'problem', None) or x)}", 2
        if isinstance(x, OmegaConfBaseException):
            return _omegaconf_line(x), 2
    if isinstance(e, HydraException):
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        if not lines:
            return type(e).__name__, 2
        # Hydra's numbered hints ("3. To sweep over it, add --multirun ...") carry the fix: keep them on the line
        hints = [re.sub(r"^\d+\.\s*", "", x) for x in lines[1:] if re.match(r"\d+\.\s", x)]
        return one("; ".join([lines[0]] + hints).replace("\\'", "'")), 2
    return f"internal error: {type(e).__name__}: {one(e)} (set HYDRA_FULL_ERROR=1 for the traceback)", 1

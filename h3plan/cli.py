"""Command line: `python -m h3plan hardware=sm107 recipe=nvfp4 parallel=u8` (or the `h3plan` script).

Composes the config with Hydra (conf/ beside this file), resolves the plan and prints it
(format=table|yaml|json; out=PATH writes it). action=verify|bench resolve the plan, then hand it to
h3plan.actions.<action>.run(cfg, plan) and exit with its return code. `-m` sweeps write every plan
into the sweep directory and print one summary (h3plan/sweep.py).

Errors from bad input (unknown option or key, impossible value, a forced lever that cannot apply,
malformed YAML) print one line on stderr and exit 2; set HYDRA_FULL_ERROR=1 for the traceback.
The plan path imports no torch.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import Any

# conf/ beside this file (h3plan/conf links to the repository's conf/; installs copy it in).
CONFIG_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
CONFIG_NAME = "config"
PROG = "h3plan"
_rc = 0
_failure: BaseException | None = None


class UsageError(ValueError):
    """Bad command-line input; str() is the one line to print."""


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(sys.argv[1:] if argv is None else argv))


def run(argv: list[str]) -> int:
    """Run the CLI in-process and return its exit code (never a traceback unless HYDRA_FULL_ERROR=1)."""
    global _rc, _failure
    from hydra._internal.utils import _run_hydra, get_args_parser

    from . import schema, sweep

    schema.register()
    sweep.strict_failure = None
    parser = get_args_parser()
    parser.prog = PROG

    def _error(message: str):
        raise UsageError(f"{message} (usage: python -m h3plan [key=value ...] [-m] [--help])")

    parser.error = _error
    user_full = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises; this function reports
    _rc, _failure = 0, None
    try:
        args = parser.parse_args(argv)
        _run_hydra(args=args, args_parser=parser, task_function=_task, config_path=CONFIG_PATH, config_name=CONFIG_NAME)
        if _failure is not None:
            raise _failure
        if sweep.strict_failure:
            print(f"{PROG}: {sweep.strict_failure}", file=sys.stderr)
            return 1
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BrokenPipeError:  # `python -m h3plan | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        if user_full == "1":
            raise
        line, code = condense(e)
        print(f"{PROG}: error: {line}" if code == 2 else f"{PROG}: {line}", file=sys.stderr)
        return code
    finally:
        if user_full is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_full
    return _rc


def _task(cfg) -> Any:
    global _failure
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.get().mode == RunMode.MULTIRUN:
        from . import sweep

        return sweep.run_job(cfg, HydraConfig.get())
    try:  # raised again by run() after Hydra returns: Hydra would log its own error line first
        return _plan_and_act(cfg)
    except Exception as e:  # noqa: BLE001
        _failure = e
        return None


def _plan_and_act(cfg) -> int:
    global _rc
    from . import planner

    plan = planner.resolve(cfg)
    action = cfg.action.name
    if cfg.out:
        write_plan(plan, cfg.out)
    if action != "plan":
        _rc = run_action(cfg, plan)
        return _rc
    fmt = cfg.format.name
    text = plan.to_yaml() if fmt == "yaml" else plan.to_json() + "\n" if fmt == "json" else render_table(plan)
    sys.stdout.write(text)
    if cfg.out and fmt == "table":
        print(f"plan written to {cfg.out}")
    return 0


def compose_config(overrides: list[str]):
    """The packaged config composed with `overrides` (Hydra syntax), for use from Python."""
    from hydra import compose, initialize_config_dir

    from . import schema

    schema.register()
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def write_plan(plan, path: str) -> None:
    text = plan.to_json() + "\n" if str(path).endswith(".json") else plan.to_yaml()
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"out={path}: cannot write the plan ({e.strerror})") from None


def run_action(cfg, plan) -> int:
    import importlib

    action = cfg.action.name
    name = f"h3plan.actions.{action}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name in (name, "h3plan.actions"):
            raise UsageError(f"action={action}: {name} is not part of this h3plan install") from None
        raise UsageError(f"action={action} needs the module {e.name!r}: pip install 'h3plan[runtime]'") from None
    return int(module.run(cfg, plan) or 0)


# ---------------------------------------------------------------- errors


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
        allowed = allowed_keys(key)
        return f"{key}: unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
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

    from .planner import PlanningError
    from .schema import ConfigError

    def one(s: str) -> str:
        return " ".join(str(s).split())

    for x in _chain(e):
        if isinstance(x, (UsageError, PlanningError, ConfigError)):
            return one(x), 2
        if isinstance(x, MissingConfigException):
            missing = x.missing_cfg_file or ""
            if "/" in missing and x.options is not None:
                group, _, name = missing.rpartition("/")
                hint = " (the joblib and submitit launchers: pip install 'h3plan[sweep]')" if group == "hydra/launcher" else ""
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
        return one(str(e).splitlines()[0] if str(e) else type(e).__name__), 2
    return f"internal error: {type(e).__name__}: {one(e)} (set HYDRA_FULL_ERROR=1 for the traceback)", 1


# ---------------------------------------------------------------- table


def _wrap(text: str, width: int, indent: int) -> list[str]:
    return textwrap.wrap(text, width=max(40, width - indent), break_long_words=False, break_on_hyphens=False) or [""]


def render_table(plan, width: int = 120) -> str:
    hw, r, p, m = (plan.get(k) for k in ("hardware", "recipe", "parallel", "model"))
    policy = "lossless" if r["policy"] == "lossless" else f"budget PSNR>={r['budget']['psnr_db_min']} dB SSIM>={r['budget']['ssim_min']}"
    lines = [
        f"h3plan  hardware={hw['name']} ({hw['arch']}, {hw['compute_capability']})  recipe={r['name']} ({policy})  "
        f"parallel={p['name']} (Ulysses {p['ulysses']}, {p['seq_len']:,} tokens)  model={m['name']}",
        "",
        f"{'lever':<21} {'setting':<12} {'lossless':<8}   why",
    ]
    pad = 21 + 1 + 12 + 1 + 8 + 3
    for d in plan.decisions:
        # the header and the notes carry the budget and the hardware-verified marker
        reasons = [x for x in d.reasons if not x.startswith("not hardware-verified") and " allows lossy levers within " not in x] or list(d.reasons[:1])
        mark = "*" if not d.hardware_verified else " "
        head = f"{d.lever:<21} {d.setting:<12} {'yes' if d.lossless else 'no':<8} {mark} "
        body = [w for x in reasons for w in _wrap(("- " if len(reasons) > 1 else "") + x, width, pad)]
        lines.append(head + body[0])
        lines += [" " * pad + w for w in body[1:]]
    lines += ["", f"{'derived':<32} {'value':<14} basis"]
    from .derive import ORDER

    basis, derived = plan.derived_value("basis", {}), plan.to_dict()["derived"]
    for k in [k for k in ORDER if k in derived] + sorted(set(derived) - set(ORDER) - {"basis"}):
        v = derived[k]
        val = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else ("n/a" if v is None else str(v))
        body = _wrap(basis.get(k, ""), width, 48)
        lines.append(f"{k:<32} {val:<14} {body[0]}".rstrip())
        lines += [" " * 48 + w for w in body[1:]]
    lines.append("")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"

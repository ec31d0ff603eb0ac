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

import contextlib
import os
import re
import sys
from typing import Any

from . import __version__
from .actions import ACTIONS, gpu_only, run_action
from .errors import H3PlanError, UsageError
from .levers import MEMORY_SPECS, SPECS
from .planning.config import (CONFIG_NAME, CONFIG_PATH, check_overrides, compose, condense, libyaml,
                              record_choices)
from .planning.action_configs import BenchConfig, CalibrateConfig, TuneConfig, VerifyConfig
from .planning.memory import MemoryConfig
from .planning.request import FIELDS, video_overrides
from .planning.render import _request_lines, _short, _wrap, render_summary, render_table  # noqa: F401 (cli.render_*)

PROG = "h3plan"
_rc = 0
_failure: BaseException | None = None


def main(argv: list[str] | None = None) -> None:
    """The console script: run, then flush stdout here, so that a reader that closed the pipe early (`| head -1`)
    ends the command quietly with 0 instead of a BrokenPipeError at the interpreter's exit (Python's own recipe)."""
    try:
        code = run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = closed_pipe()
    sys.exit(code)


def closed_pipe() -> int:
    """stdout's reader is gone: point stdout at /dev/null (nothing else is written, nor flushed at exit); exit 0."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def run(argv: list[str]) -> int:
    """Run the CLI in-process and return its exit code (never a traceback unless HYDRA_FULL_ERROR=1)."""
    global _rc, _failure
    if "--version" in argv or "-V" in argv:
        print(f"{PROG} {__version__}")
        return 0
    if "--help" in argv or "-h" in argv:
        sys.stdout.write(help_text())
        return 0
    import warnings

    def _one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"{PROG}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    warnings_were = warnings.showwarning
    warnings.showwarning = _one_line_warning  # Hydra's UserWarnings (a missing hydra.searchpath entry): one line
    user_full = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises; this function reports
    _rc, _failure = 0, None
    try:
        plain = _plain_argv(argv)
        if plain:  # a plan without Hydra's job machinery nor its parser (planning/direct.py: nor Hydra)
            cfg = compose(argv)
            if cfg.action.name == "plan":
                return _plan_and_act(cfg, argv)
            _refuse_without_gpu(cfg, argv)
        parser = _parser()
        args = parser.parse_args(argv)
        if not plain and _plain_run(args):  # a plan without Hydra's job machinery: one composition
            cfg = compose(args.overrides)
            if cfg.action.name == "plan":
                return _plan_and_act(cfg, args.overrides)
        from hydra._internal.utils import _run_hydra

        from .planning import schema

        schema.register()
        from . import sweep

        sweep.strict_failure = None
        args.overrides = video_overrides(args.overrides)
        check_overrides(args.overrides)
        _check_launcher(args.overrides)
        if args.multirun and any(o.startswith("plan=") for o in args.overrides):
            raise UsageError("plan=FILE reads one saved plan: a sweep (-m) plans its own combinations")
        with _one_composition(args), libyaml():
            _run_hydra(args=args, args_parser=parser, task_function=_task, config_path=CONFIG_PATH,
                       config_name=CONFIG_NAME)
        if _failure is not None:
            raise _failure
        if sweep.strict_failure:
            print(f"{PROG}: {sweep.strict_failure}", file=sys.stderr)
            return 1
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BrokenPipeError:  # `python -m h3plan | head`: stop quietly
        return closed_pipe()
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        if user_full == "1":
            raise
        line, code = condense(e)
        if code == 2:
            line += _fixed_command(argv, e)
        print(f"{PROG}: error: {line}" if code == 2 else f"{PROG}: {line}", file=sys.stderr)
        return code
    finally:
        warnings.showwarning = warnings_were
        if user_full is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = user_full
    return _rc


def _parser():
    """Hydra's command-line parser, its usage errors one line."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog = PROG

    def _error(message: str):
        raise UsageError(f"{message} (usage: python -m h3plan [key=value ...] [-m] [--help])")

    parser.error = _error
    return parser


def _plain_argv(argv: list[str]) -> bool:
    """Overrides only (no argument starts with `-`, so Hydra's parser would hand argv back as its overrides), none of
    them Hydra's own: `_plain_run` of the parsed line, known without importing Hydra."""
    return not any(a.startswith("-") for a in argv) and not any(
        o.lstrip("+~").startswith(("hydra.", "hydra/", "hydra=")) for o in argv)


_HYDRA_FLAGS = ("hydra_help", "cfg", "resolve", "package", "run", "multirun", "shell_completion", "config_path",
                "config_name", "config_dir", "experimental_rerun", "info")


def _plain_run(args) -> bool:
    """A command line that only sets h3plan's own keys and groups: no Hydra flag (-m, --cfg, --config-dir, ...) and
    no hydra.* or hydra/ override. Its plan (action=plan) needs Hydra's composition only, not its job runner (which
    for this config writes nothing: hydra.run.dir=., no output subdir, no logging), and skipping the runner saves
    about a tenth of a cold plan (benchmarks/plan_speed.py)."""
    return not any(getattr(args, f, None) for f in _HYDRA_FLAGS) and not any(
        o.lstrip("+~").startswith(("hydra.", "hydra/", "hydra=")) for o in args.overrides)


def _check_launcher(overrides: list[str]) -> None:
    """hydra/launcher=submitit_slurm submits through Slurm's srun: on a machine without it submitit raises a
    RuntimeError deep inside Hydra's launcher, which would read as an h3plan bug. It is the user's setup: say so.
    (Without the plugin installed Hydra's own "no such option" line, with the install hint, comes first.)"""
    import shutil

    if (any(re.fullmatch(r"[+~]*hydra/launcher=submitit_slurm", o) for o in overrides) and _submitit_installed()
            and shutil.which("srun") is None):
        raise UsageError("hydra/launcher=submitit_slurm: no Slurm on this machine (srun is not on PATH); sweep from a "
                         "Slurm login node, or here with hydra/launcher=joblib (or without hydra/launcher)")


def _submitit_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None


@contextlib.contextmanager
def _one_composition(args):
    """Hydra 1.3 composes the whole config once only to read `hydra.mode` (`Hydra.get_mode`), then again to run:
    a plan paid for two compositions. h3plan's config leaves hydra.mode unset (tests/cli/test_cli_speed.py checks
    that), and for such a config Hydra's own answer is None ("what -m says"), so it is answered without
    composing unless the command line could set the mode: an override of hydra.mode, a hydra/ group or the
    search path, or another config (--config-dir, --config-name)."""
    from hydra._internal.hydra import Hydra

    def could_set_mode(o: str) -> bool:
        key = o.lstrip("+~")
        return key.startswith(("hydra.mode", "hydra/", "hydra.searchpath", "hydra="))

    if args.config_dir is not None or args.config_name is not None or any(map(could_set_mode, args.overrides)):
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = original


def _fix_of(e: BaseException) -> dict[str, str]:
    while e is not None:
        if getattr(e, "fix", None):
            return e.fix
        e = e.__cause__ or e.__context__
    return {}


def _fixed_command(argv: list[str], e: BaseException, tries: int = 4) -> str:
    """`; this works: python -m h3plan ...`: argv with the error's fix applied, planned here to prove it (each
    further error's fix applied in turn); "" when there is no fix, or the fixed command still fails."""
    import re
    import shlex

    from .planner import resolve

    fix, args = _fix_of(e), list(argv)
    if not fix or any(a.startswith("-") for a in args):  # plain overrides only: no sweep, no Hydra flags
        return ""
    for _ in range(tries):
        for key, value in fix.items():
            hit = [i for i, a in enumerate(args) if re.match(rf"(\+\+|\+)?{re.escape(key)}=", a)]
            for i in hit:
                args[i] = f"{args[i].partition('=')[0]}={value}"
            if not hit:
                args.append(f"{key}={value}")
        try:
            resolve(compose(args))
        except H3PlanError as again:
            fix = _fix_of(again)
            if not fix:
                return ""
            continue
        return f"; this works: python -m {PROG} {shlex.join(args)}"
    return ""


def _task(cfg) -> Any:
    global _failure
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    record_choices(cfg, HydraConfig.get().runtime.choices, HydraConfig.get().searchpath)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        from . import sweep

        return sweep.run_job(cfg, HydraConfig.get())
    try:  # raised again by run() after Hydra returns: Hydra would log its own error line first
        return _plan_and_act(cfg, list(HydraConfig.get().overrides.task))
    except Exception as e:  # noqa: BLE001
        _failure = e
        return None


def _plan_and_act(cfg, overrides: list[str]) -> int:
    """Plan (or read plan=FILE) and print it or run the action; `overrides`: the command line's (plan=FILE's check)."""
    global _rc
    from . import planner

    _uncached_for_calibrate(cfg)
    plan, cfg = _saved_plan(cfg, overrides) if cfg.plan else (planner.resolve(cfg), cfg)
    action = cfg.action.name
    if cfg.out:
        write_plan(plan, cfg.out)
    if action != "plan":
        _rc = run_action(cfg, plan)
        return _rc
    fmt = cfg.format.name
    table = render_table if cfg.detail.name == "full" else render_summary
    text = plan.to_yaml() if fmt == "yaml" else plan.to_json() + "\n" if fmt == "json" else table(plan)
    sys.stdout.write(text)
    if cfg.out and fmt == "table":
        print(f"plan written to {cfg.out}")
    if cfg.plan and fmt == "table":
        print(f"plan read from {cfg.plan} and checked: its config plans these settings again")
    return 0


CALIBRATED_LEVERS = tuple(n for n, s in SPECS.items() if s.recipe_section)
"""calibrate targets that measure a lossy lever's own candidates against the plan without it."""


def _uncached_for_calibrate(cfg) -> None:
    """calibrate.target=step_cache / sparse_attention measures its candidates against the plan without the lever (the
    uncached, dense call): that lever's auto plans off, whatever its budget's evidence says."""
    target = cfg.action.name == "calibrate" and cfg.calibrate.target
    if target in CALIBRATED_LEVERS and getattr(cfg.levers[target], "name", cfg.levers[target]) == "auto":
        cfg.levers[target] = "off"


def _refuse_without_gpu(cfg, overrides: list[str]) -> None:
    """An action that needs a GPU, on a machine that has none (actions/gpu_only.py): refused from the composed config,
    before Hydra's job runner and the action's imports (run_action refuses the same on every other path)."""
    if not gpu_only.no_gpu_here():
        return
    from . import planner

    _uncached_for_calibrate(cfg)

    plan = _saved_plan(cfg, overrides)[0] if cfg.plan else planner.resolve(cfg)
    why = gpu_only.refusal(cfg.action.name, cfg, plan)
    if why is not None:
        raise UsageError(why)


def _saved_plan(cfg, overrides: list[str]):
    """plan=FILE: the saved plan, read and checked by Plan.load (planned again from its own config, the file's
    settings kept), instead of a plan from the command line's groups, and the config with the plan's sections (an
    action builds the plan's model, not the default one). A group or section override beside it would be ignored:
    refused, with the command that plans it."""
    from .planner import Plan
    from .planning.schema import PLAN_SECTIONS

    given = [o for o in overrides if re.split(r"[.=/]", o.lstrip("+~"), maxsplit=1)[0] in PLAN_SECTIONS]
    if given:
        raise UsageError(f"plan={cfg.plan} is a saved plan, planned already: {' '.join(given)} would be ignored; plan "
                         f"anew without plan= (python -m {PROG} {' '.join(given)} out=plan.yaml)")
    from omegaconf import OmegaConf

    plan = Plan.load(cfg.plan)
    return plan, OmegaConf.merge(cfg, {s: plan.get(s) for s in PLAN_SECTIONS})


def help_text(width: int = 110) -> str:
    """--help: usage, the config groups and their options, every lever with its settings (from the registry)."""
    groups = sorted(d for d in os.listdir(CONFIG_PATH) if os.path.isdir(os.path.join(CONFIG_PATH, d)))
    lines = [f"usage: python -m {PROG} [group=option ...] [key=value ...] [-m] [--help] [--version]", "",
             "Resolve a plan for MiniMax-H3 inference and print it (every lever, its setting and why).", "",
             "config groups (group=option):"]
    for g in groups:
        opts = sorted(f[:-5] for f in os.listdir(os.path.join(CONFIG_PATH, g)) if f.endswith(".yaml"))
        lines.append(f"  {g + '=':<12} {' | '.join(opts)}")
    lines += ["", "levers (levers.<name>=<setting>; auto, the default, decides and says why; lossy settings marked *):"]
    memory_levers = ((f"memory.{n}", s) for n, s in MEMORY_SPECS.items())  # set by memory.<name>, not levers.<name>
    for key, spec in [*SPECS.items(), *memory_levers]:
        settings = " | ".join(s + ("" if lossless else "*") for s, lossless in spec.settings.items())
        lines.append(f"  {key:<21} auto | {settings}")
        lines += [" " * 24 + w for w in _wrap(spec.summary, width, 24)]
    import dataclasses

    memory = " ".join(f"memory.{f.name}" for f in dataclasses.fields(MemoryConfig))
    keys = [(f"action=plan|{'|'.join(ACTIONS)}", "verify: prove the plan against diffusers' eager forward; bench: time "
                                                 "it; calibrate: a static FP8 scale table, checked on held-out inputs; "
                                                 "tune: measure this GPU at the plan's shapes and write a tuned "
                                                 "hardware file"),
            ("format=table|yaml|json", "out=PATH writes the plan (.json -> JSON, else YAML); a sweep prints its "
                                       "summary in that format"),
            (" ".join(f"video.{k}=" for k in FIELDS), "the request over the video preset: S (text + audio + video "
                                                      "rows) comes from it (video.seconds or video.frames: the other "
                                                      "is nulled)"),
            ("plan=FILE", "a saved plan (out= wrote it): read, check (planned again from its config) and print it, or "
                          "act on it (action=verify|bench)"),
            ("parallel.seq_len=N", "plan for N tokens directly; it wins over the video request, and the plan says so"),
            (memory, "how the pipeline holds its models, for the peak-memory estimate (h3plan/planning/memory.py "
                     "MemoryConfig)"),
            ("detail=summary|full", "table: the summary and one line per lever (default), or every reason, its sources "
                                    "and the derived numbers"),
            *_action_keys(),
            ("-m a=x,y b=z", "sweep every combination (strict=true: exit 1 if any is invalid)")]
    lines += ["", "other keys:"]
    for key, what in keys:
        body = _wrap(what, width, 31)
        if len(key) <= 28:
            lines.append(f"  {key:<28} {body[0]}")
            body = body[1:]
        else:
            lines += ["  " + k for k in _wrap(key, width, 2)]
        lines += [" " * 31 + w for w in body]
    lines += ["",
              f"examples:\n  python -m {PROG} hardware=sm107 recipe=nvfp4 parallel=u8\n"
              f"  python -m {PROG} recipe=fp8 levers.attention=fa4 format=yaml\n"
              f"  python -m {PROG} video.height=704 video.width=1280 video.seconds=10 parallel=u2\n"
              f"  python -m {PROG} action=verify model=h3_tiny\n"
              f"  python -m {PROG} action=calibrate recipe=fp8 model=h3_tiny", "",
              "Hydra's own options: --hydra-help, --cfg job, --info."]
    return "\n".join(lines) + "\n"


def _action_keys() -> list[tuple[str, str]]:
    """(its keys, what it is) for each action section, from its dataclass (planning/action_configs.py): a key with
    choices lists them (bench.target=block|pipeline), a nested section its own keys (bench.pipeline.*)."""
    import dataclasses
    import enum
    import typing

    def keys(prefix: str, cls) -> list[str]:
        out = []
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                out += keys(f"{prefix}{f.name}.", tp)
            elif isinstance(tp, type) and issubclass(tp, enum.Enum):
                out.append(f"{prefix}{f.name}={'|'.join(m.value for m in tp)}")
            else:
                out.append(f"{prefix}{f.name}=")
        return out

    rows = []
    for name, cls in (("verify", VerifyConfig), ("bench", BenchConfig), ("calibrate", CalibrateConfig),
                      ("tune", TuneConfig)):
        doc = (cls.__doc__ or "").strip()
        what = doc.split("\n")[0] if doc and not doc.startswith(cls.__name__ + "(") else f"action={name}"
        rows.append((" ".join(keys(f"{name}.", cls)), f"the keys of {what}"))
    return rows


def write_plan(plan, path: str) -> None:
    """out=PATH: Plan.save (JSON for .json in any case, else YAML); an unwritable path is one line naming out=."""
    try:
        plan.save(path)
    except H3PlanError as e:
        why = getattr(e.__cause__, "strerror", None) or e
        raise UsageError(f"out={path}: cannot write the plan ({why})") from None

"""h3plan's errors: every mistake a user can make surfaces as one of these, with a one-line message.

The CLI prints `h3plan: error: <message>` and exits 2 for any H3PlanError; the Python API raises them
as they are. Anything else that escapes is a bug in h3plan ("internal error", exit 1). Torch-free.
"""

from __future__ import annotations


class H3PlanError(ValueError):
    """Bad input from the user (config, plan file, request, model); str() is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ConfigError(H3PlanError):
    """A configuration value that composition or the schema rules out; names the key. `fix`: overrides
    (key -> value) that mend it, where one is clear; the CLI turns them into the command that works."""

    def __init__(self, key: str, message: str, fix: dict[str, str] | None = None):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.fix = dict(fix or {})


class PlanningError(H3PlanError):
    """No valid plan for this config; `.reasons` lists every reason of the failing lever."""

    def __init__(self, message: str, reasons: list[str] | None = None):
        super().__init__(message)
        self.reasons = list(reasons or [str(self)])


class PlanFileError(H3PlanError):
    """A plan file (YAML / JSON) that cannot be read back as a Plan; names the file."""


class UsageError(H3PlanError):
    """A command or call that cannot run as given (wrong action for this machine, missing package ...)."""


class InstallError(H3PlanError):
    """A plan that does not fit the model it is installed into (other widths, other heads, another class)."""


class H3PlanWarning(UserWarning):
    """Something h3plan did that the user must know but that is no error (a saved plan's hand edits replaced); str() is
    one line, and the CLI prints it as `h3plan: warning: ...`."""


def runtime_missing(e: ModuleNotFoundError, who: str) -> UsageError | None:
    """The UsageError for `who` (h3plan.install ...) when `e` is a missing torch / diffusers / triton, the packages
    the install side imports and planning never does; None for any other missing module (a bug: re-raise it)."""
    missing = (e.name or "").partition(".")[0]
    if missing not in ("torch", "diffusers", "triton"):
        return None
    return UsageError(f"{who} needs {missing}, which is not installed here (pip install torch diffusers==0.42.1); "
                      "planning needs neither: h3plan.resolve_config(...), python -m h3plan")


__all__ = ["H3PlanError", "ConfigError", "PlanningError", "PlanFileError", "UsageError", "InstallError",
           "H3PlanWarning"]


def unknown_key_line(key: str, allowed: list[str]) -> str:
    """`key: unknown key (did you mean <near>?); allowed: ...` (the near miss only when one is close)."""
    import difflib

    leaf = key.rpartition(".")[2]
    near = difflib.get_close_matches(leaf, allowed, n=1, cutoff=0.75)
    parent = key.rpartition(".")[0]
    hint = f" (did you mean {parent + '.' if parent else ''}{near[0]}?)" if near else ""
    return f"{key}: unknown key{hint}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")

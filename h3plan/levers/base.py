"""What every lever shares: the decision context, forced-vs-auto resolution, the lossless policy and
the hardware-verified flag.

A lever module supplies `blockers(ctx, setting) -> [reason, ...]` (why a setting cannot apply; empty
when it can) and `auto(ctx) -> (setting, reasons, params)`; `resolve` turns them into a Decision.
A forced setting with blockers raises LeverError listing them; `auto` must never pick a blocked or
(under a lossless policy) lossy setting, which `resolve` asserts. Pure: no torch, no GPU imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..plan import Decision, make_decision
from ..schema import LEVER_SETTINGS

ULYSSES_LEVERS = ("ulysses_padding", "ulysses_overlap", "a2a_fp8_codes")


class LeverError(ValueError):
    """A lever setting that cannot apply; str() is one line naming the lever and every reason."""

    def __init__(self, lever: str, setting: str, reasons: list[str]):
        self.lever, self.setting, self.reasons = lever, setting, list(reasons)
        super().__init__(f"levers.{lever}={setting} cannot apply: " + "; ".join(self.reasons))


@dataclass(frozen=True)
class Context:
    """Everything a lever may read: config sections (plain dicts), shape numbers, earlier decisions."""

    hardware: Mapping[str, Any]
    recipe: Mapping[str, Any]
    parallel: Mapping[str, Any]
    model: Mapping[str, Any]
    vae: Mapping[str, Any]
    levers: Mapping[str, str]
    shape: Mapping[str, Any]
    decisions: Mapping[str, Decision] = field(default_factory=lambda: MappingProxyType({}))

    def requested(self, lever: str) -> str:
        return str(self.levers.get(lever, "auto"))

    def setting(self, lever: str) -> str:
        """The setting an earlier lever resolved to (levers decide in registry order)."""
        return self.decisions[lever].setting

    def decision(self, lever: str) -> Decision:
        return self.decisions[lever]

    @property
    def hw(self) -> str:
        return self.hardware["name"]

    @property
    def lossless_only(self) -> bool:
        return self.recipe["policy"] == "lossless"

    @property
    def degree(self) -> int:
        return self.parallel["ulysses"]

    @property
    def seq_len(self) -> int:
        return self.parallel["seq_len"]

    @property
    def rows_per_rank(self) -> int:
        return self.shape["local_rows"]

    @property
    def tuning(self) -> Mapping[str, Any]:
        return self.hardware["tuning"]

    def budget_text(self) -> str:
        b = self.recipe["budget"]
        return f"recipe {self.recipe['name']} allows lossy levers within PSNR >= {b['psnr_db_min']} dB, SSIM >= {b['ssim_min']}"


def policy_blockers(ctx: Context, lever: str, setting: str, lossless: Mapping[str, bool]) -> list[str]:
    if ctx.lossless_only and not lossless[setting]:
        return [f"recipe {ctx.recipe['name']} has policy lossless and {lever}={setting} is lossy"]
    return []


def hardware_verified(ctx: Context, lever: str, setting: str) -> tuple[bool, str | None]:
    v = ctx.hardware["verified"]
    if setting not in v["settings"].get(lever, []):
        return False, f"not hardware-verified: {setting} has never run on {ctx.hw} by h3plan (hardware.verified)"
    if lever in ULYSSES_LEVERS and ctx.degree > v["max_ulysses_degree"]:
        return False, f"not hardware-verified: Ulysses degree {ctx.degree} has never run on {ctx.hw} (at most {v['max_ulysses_degree']})"
    return True, None


def resolve(
    ctx: Context,
    lever: str,
    *,
    lossless: Mapping[str, bool],
    blockers: Callable[[Context, str], list[str]],
    auto: Callable[[Context], tuple[str, list[str], dict]],
    params: Callable[[Context, str], dict] | None = None,
    explain: Callable[[Context, str], list[str]] | None = None,
) -> Decision:
    """Forced: validate and explain. Auto: pick, then assert the pick is allowed."""
    requested = ctx.requested(lever)
    if requested != "auto":
        if requested not in LEVER_SETTINGS[lever]:
            raise LeverError(lever, requested, ["allowed: auto, " + ", ".join(LEVER_SETTINGS[lever])])
        problems = blockers(ctx, requested) + policy_blockers(ctx, lever, requested, lossless)
        if problems:
            raise LeverError(lever, requested, problems)
        setting, forced = requested, True
        reasons = [f"forced by levers.{lever}={requested}"] + (explain(ctx, requested) if explain else [])
        extra = params(ctx, requested) if params else {}
    else:
        setting, reasons, extra = auto(ctx)
        forced = False
        problems = blockers(ctx, setting) + policy_blockers(ctx, lever, setting, lossless)
        assert not problems, f"internal: auto picked {lever}={setting} that cannot apply: {problems}"
    ok, why = hardware_verified(ctx, lever, setting)
    if why:
        reasons = list(reasons) + [why]
    return make_decision(lever, setting, lossless[setting], reasons, forced=forced, params=extra, hardware_verified=ok)


def speedup_runs(xs) -> str:
    """Measured A/B speedups as the reasons print them: "1.054x, 1.042x"."""
    return ", ".join(f"{x:.3f}x" for x in xs)


def faster_in_every_run(xs) -> bool:
    """The measured levers' rule: a setting wins only if every recorded run timed it faster (> 1.0x)."""
    return min(xs) > 1.0


def nearest_ulysses_point(hardware: Mapping[str, Any], kind: str, degree: int, seq_len: int) -> Mapping[str, Any] | None:
    """hardware.measured.ulysses.<kind> ("a2a" or "overlap") at exactly this degree, nearest in log S; None
    when this degree was never measured (another degree's numbers are not borrowed)."""
    import math

    points = [p for p in hardware["measured"]["ulysses"][kind] if p["degree"] == degree]
    return min(points, key=lambda p: (abs(math.log(p["seq_len"] / seq_len)), p["seq_len"])) if points else None


def nearest_point(hardware: Mapping[str, Any], seq_len: int, heads: int, backend: str) -> Mapping[str, Any] | None:
    """The measured attention point closest in (log S, log heads) that has a value for `backend`."""
    import math

    points = [p for p in hardware["measured"]["attention"] if p.get(backend) is not None]
    if not points:
        return None
    return min(points, key=lambda p: (abs(math.log(p["seq_len"] / seq_len)) + abs(math.log(p["heads"] / heads)), p["seq_len"], p["heads"]))

"""The regret of auto's choices against an exhaustive sweep of the levers whose auto picks from measurements
(attention backend, VAE tile geometry, decode precision): every combination of their settings is planned with the
same overrides (a combination the policy refuses is left out, with its reason), each scored by the plan's own
predicted call time, which rests on the hardware file's measurements (h3plan/planning/predict.py); regret = auto's
call time / the fastest allowed combination's - 1. Torch-free: it runs wherever a tuned file can be read.

What it proves: auto picks the measured fastest wherever the policy leaves a choice. What it does not: that the
measurements predict the timed pipeline (benchmarks/pipeline.py against the prediction does that).
"""

from __future__ import annotations

import itertools
from typing import Any

from h3plan.errors import H3PlanError
from h3plan.levers import SPECS
from h3plan.planner import resolve
from h3plan.planning.config import compose

from .roles import BACKEND, DECODE_PRECISION, DECODE_TILES

SWEPT = (BACKEND, DECODE_PRECISION, DECODE_TILES)
TARGET = 0.02  # auto's call time at most 2% over the fastest allowed combination's


def sweep(overrides: list[str], levers: tuple[str, ...] = SWEPT) -> dict[str, Any]:
    """{auto: its settings and call time, arms: every combination (allowed or refused), best, regret}."""
    auto = resolve(compose(overrides))
    key = "call_s_est" if auto.derived_value("call_s_est") is not None else "forward_s_est"
    arms = []
    for combo in itertools.product(*(list(SPECS[lv].settings) for lv in levers)):
        forced = [f"levers.{lv}={s}" for lv, s in zip(levers, combo)]
        arm: dict[str, Any] = {"settings": dict(zip(levers, combo))}
        try:
            p = resolve(compose(overrides + forced))
        except H3PlanError as e:
            arm["refused"] = str(e)
        else:
            arm["seconds"] = p.derived_value(key)
        arms.append(arm)
    scored = [a for a in arms if a.get("seconds") is not None]
    best = min(scored, key=lambda a: a["seconds"]) if scored else None
    mine = auto.derived_value(key)
    regret = None if best is None or mine is None else mine / best["seconds"] - 1
    settings = {lv: auto.decision(lv).setting for lv in levers}
    return {"overrides": overrides, "scored_by": key, "auto": {"settings": settings, "seconds": mine},
            "best": best, "regret": regret, "target": TARGET, "arms": arms}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| plan | auto | auto s | fastest allowed | its s | regret | met |", "|---|---|---:|---|---:|---:|---|"]
    for r in results:
        a, b = r["auto"], r["best"] or {"settings": {}, "seconds": None}
        fmt = lambda d: ", ".join(f"{k}={v}" for k, v in d.items())  # noqa: E731
        g = r["regret"]
        pct, met = ("-", "-") if g is None else (f"{g:.2%}", "yes" if g <= r["target"] else "NO")
        lines.append(f"| {' '.join(r['overrides'])} | {fmt(a['settings'])} | {a['seconds']} | {fmt(b['settings'])} | "
                     f"{b['seconds']} | {pct} | {met} |")
    return "\n".join(lines) + "\n"

"""The checks the pipeline bench declares before it runs, each recorded in its row as PASS or FAIL (the record's
`checks`: one entry per check, with the rule as declared and the numbers it was decided on). Pure Python.

- overhead: a step-cache row's whole call against the forwards it computed: E2E <= OVERHEAD x (for each kind of
  forward the call computed, dense or with sparse attention, their count x their median + the rest of the call).
  Every mode: first_block's skipped forwards still run its first block and the decision, a cost the check counts
  like any other.
- extrapolation: a whole-call row (bench.pipeline.whole) against what a short call extrapolates: the whole call's wall
  time within EXTRAPOLATION of forwards x the short call's median forward + the short call's rest (how every row
  without a whole call gets its E2E).
- bitwise: a plan's frames against the row they must equal bit for bit (its same-backend reference; the stock-bits
  plan: diffusers eager). A comparison that could not run (no frames from either row) is a FAIL, never a pass.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

OVERHEAD = 1.03
EXTRAPOLATION = 0.01

RULES = {
    "overhead": f"step cache: E2E <= {OVERHEAD} x (per kind of computed forward, dense or sparse: their count x their "
                "median, + rest of the call)",
    "extrapolation": f"the whole call's wall within {EXTRAPOLATION:.0%} of forwards x the short call's median "
                     "forward + its rest",
    "bitwise": "the plan's frames equal the frames of the row it must match, bit for bit",
}


def verdict(name: str, passed: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "rule": RULES[name], "result": "PASS" if passed else "FAIL", "detail": detail}


def overhead(full: Mapping[str, Any], kinds: Sequence[tuple[int, float]], rest: float | None) -> dict[str, Any]:
    """`full`: a step-cache row's whole call (e2e_s, computed, forwards); `kinds`: (count, median time) of each kind of
    computed forward (dense; with sparse attention); rest: the rest of the call. No computed forward timed: FAIL (the
    bound cannot be formed)."""
    if not kinds or rest is None:
        return verdict("overhead", False, f"E2E {full['e2e_s']:.2f} s: no computed forward or rest timed, no bound")
    base = sum(n * t for n, t in kinds) + rest
    bound = OVERHEAD * base
    ok = full["e2e_s"] <= bound
    terms = " + ".join(f"{n} x {t:.3f} s" for n, t in kinds)
    return verdict("overhead", ok, f"E2E {full['e2e_s']:.2f} s {'<=' if ok else '>'} {OVERHEAD} x "
                                   f"({terms} + rest {rest:.2f} s) = {bound:.2f} s ({full['e2e_s'] / base:.3f}x)")


def extrapolation(forwards: int, short_forward: float | None, short_rest: float | None, wall: float) -> dict[str, Any]:
    """The whole call's `wall` against forwards x the short call's median forward + its rest."""
    if short_forward is None or short_rest is None:
        return verdict("extrapolation", False,
                       f"whole call {wall:.2f} s: the short call timed no forward, no extrapolation")
    est = forwards * short_forward + short_rest
    err = est / wall - 1
    return verdict("extrapolation", abs(err) <= EXTRAPOLATION,
                   f"{forwards} x {short_forward:.3f} s + rest {short_rest:.2f} s = {est:.2f} s against the whole call "
                   f"{wall:.2f} s ({err:+.2%})")


def bitwise(compared: Mapping[str, Any] | None, against: str) -> dict[str, Any]:
    """`compared`: the frames' comparison (its `bitwise`), None when there was nothing to compare."""
    if not compared or compared.get("bitwise") is None:
        return verdict("bitwise", False, f"not compared against {against}: no frames from one of the rows")
    ok = bool(compared["bitwise"])
    return verdict("bitwise", ok, f"{'equal to' if ok else 'differs from'} {against}" + (
        "" if ok or compared.get("psnr_db") is None else f" (PSNR {compared['psnr_db']:.1f} dB)"))


def results(checks) -> str:
    """`overhead FAIL, bitwise PASS`: a row's checks in one cell."""
    return ", ".join(f"{c['name']} {c['result']}" for c in checks or ())

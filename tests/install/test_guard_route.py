"""One way to count a per-call route (runtime/guards.count_route): every fallback in h3plan is counted through it
(run_guarded calls it), never by a counters.fallback / counters.fused call of its own."""

import ast
from pathlib import Path

import torch

from h3plan.install import counters, fallback_reasons, reset_counters
from h3plan.runtime.guards import count_route, run_guarded

H3PLAN = Path(__file__).resolve().parents[2] / "h3plan"
ALLOWED = {"runtime/counters.py", "runtime/guards.py"}  # the counters, and the one helper that counts a route


def test_count_route_counts_fused_and_fallback_with_the_reason():
    reset_counters()
    assert count_route("zz_test", None) is True
    assert count_route("zz_test", "too short") is False
    assert counters()["zz_test.fused"] == 1 and counters()["zz_test.fallback"] == 1
    assert fallback_reasons()["zz_test"] == {"too short": 1}


def test_run_guarded_counts_a_raising_check_as_a_fallback():
    reset_counters()

    def check():
        raise ValueError("bad stride")

    out = run_guarded("zz_test", check, lambda: "fused", lambda: "eager")
    assert out == "eager" and fallback_reasons()["zz_test"] == {"ValueError in check: bad stride": 1}
    x = torch.ones(2, requires_grad=True)
    assert run_guarded("zz_test", lambda: None, lambda: "fused", lambda: "eager", (x,)) == "eager"


def test_no_fallback_is_counted_by_hand():
    hand = []
    for f in sorted(H3PLAN.rglob("*.py")):
        rel = f.relative_to(H3PLAN).as_posix()
        if rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("runtime.counters"):
                hand += [f"{rel}:{node.lineno} imports counters.{a.name}"
                         for a in node.names if a.name in ("fallback", "fused")]
    assert not hand, "count a route through h3plan.runtime.guards.count_route or run_guarded: " + "; ".join(hand)

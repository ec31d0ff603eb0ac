"""diffusers' own MiniMax-H3 transformer LoRA tests, from a diffusers checkout, with an h3plan plan in every model.

    python tests/diffusers_lora_suite.py /path/to/diffusers                                    # the bf16 plan
    python tests/diffusers_lora_suite.py /path/to/diffusers --recipe fp8 --expect-refusals     # see below

Copies the checkout's tests/ (only: its conftest would put the checkout's src/ ahead of the installed diffusers) to a
temporary folder and runs `tests/models/transformers/test_models_transformer_minimax_h3.py -k LoRA` (LoraTesterMixin)
there twice, each in its own process, against the installed diffusers: as shipped, then with every
MiniMaxH3Transformer3DModel the tests build getting `h3plan.install(model, h3plan.plan_for(model, recipe,
hardware="sm90"))` right after its __init__ (the pytest plugin below). Prints each test's outcome without and with the
plan, the installs it made and the levers they swapped; exits 1 when a test that passes without the plan does not pass
with it, or ran with no plan installed. A test whose LoRA the plan refuses (h3plan's one-line InstallError: "the
installed plan bypasses ...") is `refused`; under `--recipe fp8` the tests' LoRAs target the quantised block linears,
so that is the outcome to expect there, and `--expect-refusals` counts it as the plan's documented answer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/models/transformers/test_models_transformer_minimax_h3.py"
REFUSAL = "h3plan.errors.InstallError: "  # then "<method>: the installed plan bypasses ..." (install/lora.py)


class InstallPlan:
    """pytest plugin: each test's outcome, and (recipe given) a plan installed into every MiniMaxH3Transformer3DModel
    built during the session."""

    def __init__(self, recipe: str | None):
        self.recipe, self.current = recipe, None
        self.results: dict[str, dict] = {}
        self.plans: dict[str, object] = {}

    def pytest_sessionstart(self, session):
        if self.recipe is None:
            return
        import functools

        import h3plan
        from diffusers import MiniMaxH3Transformer3DModel

        init = MiniMaxH3Transformer3DModel.__init__

        @functools.wraps(init)
        def installed(model, *args, **kwargs):
            init(model, *args, **kwargs)
            if type(model) is not MiniMaxH3Transformer3DModel:
                return
            key = json.dumps(dict(model.config), sort_keys=True, default=str)
            if key not in self.plans:
                self.plans[key] = h3plan.plan_for(model, self.recipe, hardware="sm90")
            report = h3plan.install(model, self.plans[key])
            entry = self.results.setdefault(self.current, {})
            entry["installs"] = entry.get("installs", 0) + 1
            entry["levers"] = sorted(set(entry.get("levers", [])) | set(report.swapped_levers()))

        MiniMaxH3Transformer3DModel.__init__ = installed  # type: ignore[method-assign]

    @pytest.hookimpl(tryfirst=True)  # before the fixtures build their models
    def pytest_runtest_setup(self, item):
        self.current = item.nodeid
        self.results.setdefault(item.nodeid, {})

    def pytest_runtest_logreport(self, report):
        entry = self.results.setdefault(report.nodeid, {})
        if report.when == "call" or report.outcome != "passed":
            outcome = report.outcome
            if getattr(report, "wasxfail", None) is not None:
                outcome = "xpassed" if report.passed else "xfailed"
            if entry.get("outcome") in (None, "passed"):
                entry["outcome"] = outcome
            if (report.failed or outcome == "xfailed") and "error" not in entry:
                crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
                entry["error"] = (crash or str(report.longrepr)).strip().splitlines()[0][:300]
                if entry["error"].startswith(REFUSAL) and "the installed plan bypasses" in entry["error"]:
                    entry["outcome"] = "refused"


def child(folder: str, recipe: str | None, out: str, keyword: str) -> int:
    plugin = InstallPlan(recipe)
    os.chdir(folder)
    code = pytest.main([TESTS, "-k", keyword, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-W", "ignore"],
                       plugins=[plugin])
    Path(out).write_text(json.dumps(plugin.results, indent=1))
    return int(code)


def run(folder: str, recipe: str | None, keyword: str) -> tuple[dict, float]:
    out = os.path.join(folder, f"results-{recipe or 'stock'}.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t = time.monotonic()
    cmd = [sys.executable, __file__, "--child", folder, "--out", out, "-k", keyword]
    cmd += ["--recipe", recipe] if recipe else ["--recipe", ""]
    subprocess.run(cmd, env=env, check=False)
    return json.loads(Path(out).read_text()), time.monotonic() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", nargs="?", help="a diffusers checkout (its tests/ folder is what is used)")
    ap.add_argument("--recipe", default="bf16", help="the plan's recipe (plan_for(model, recipe, hardware='sm90'))")
    ap.add_argument("-k", dest="keyword", default="LoRA", help="pytest -k expression (default: the LoRA tests)")
    ap.add_argument("--expect-refusals", action="store_true", help="a LoRA the plan refuses in its one line is the "
                                                                    "answer expected (a quantising recipe)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child, a.recipe or None, a.out, a.keyword)
    if not a.checkout or not (Path(a.checkout) / TESTS).is_file():
        print(f"diffusers_lora_suite.py: error: give a diffusers checkout holding {TESTS}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="h3plan-diffusers-") as tmp:
        shutil.copytree(Path(a.checkout) / "tests", Path(tmp) / "tests")
        stock, t_stock = run(tmp, None, a.keyword)
        planned, t_plan = run(tmp, a.recipe, a.keyword)
    bad = []
    print(f"{'test':<70} {'stock':>8} {a.recipe + ' plan':>9} installs  levers / error")
    for test in sorted(set(stock) | set(planned)):
        s, p = stock.get(test, {}), planned.get(test, {})
        so, po = s.get("outcome", "-"), p.get("outcome", "-")
        ok = po == so or (so == "xfailed" and po in ("xpassed", "passed")) or so in ("skipped", "-")
        ok = ok or (po == "refused" and a.expect_refusals)
        if not ok or (po in ("passed", "xpassed") and not p.get("installs")):
            bad.append(test)
        detail = p.get("error") or ", ".join(p.get("levers", []))
        print(f"{test.split('::', 1)[-1][:70]:<70} {so:>8} {po:>9} {p.get('installs', 0):>8}  {detail}")
    print(f"stock {t_stock:.0f} s, with the {a.recipe} plan {t_plan:.0f} s (each a process of its own, collection "
          "included)")
    refused = sum(planned.get(t, {}).get("outcome") == "refused" for t in planned)
    if bad:
        print(f"{len(bad)} test(s) pass without the plan and not with it, or ran with no plan installed",
              file=sys.stderr)
        return 1
    print(f"every test that passes on stock diffusers passes with the {a.recipe} plan installed into each model"
          + (f", or has its LoRA refused in h3plan's one line ({refused})" if refused else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

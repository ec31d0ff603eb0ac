"""A script under benchmarks/ runs with benchmarks/ first on sys.path, so a file there named like an importable
top-level module would be imported in that module's place by anything that imports it (diffusers imports the
`kernels` package whenever it is installed, as the test extras install it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _shadowed(name: str) -> str | None:
    if name in sys.stdlib_module_names:
        return "the standard library"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    if Path(spec.origin).resolve().is_relative_to(BENCH.resolve()):
        return None
    return spec.origin


def test_no_benchmark_script_shadows_an_importable_module():
    clashes = {p.name: where for p in sorted(BENCH.glob("*.py")) if (where := _shadowed(p.stem))}
    assert not clashes, f"benchmarks/ scripts named like importable modules (rename them): {clashes}"


def test_the_check_sees_a_clash():
    assert _shadowed("kernels") is not None or importlib.util.find_spec("kernels") is None
    assert _shadowed("json") == "the standard library"

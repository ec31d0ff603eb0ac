"""The measuring apparatus stays light.

- its share: the lines of h3plan/actions/bench/ and benchmarks/ (every .py: probes, anchors, cases) at most 25% of
  the lines of h3plan/ and benchmarks/ together;
- benchmarks/ reaches h3plan through the public API only: `h3plan` (its `__all__`) and h3plan.actions.bench, whose
  `ops` names the internals a probe times or patches, once: a refactor of the internals then fails this CPU suite
  (which imports `ops`) instead of a script nobody runs on a CPU.
"""

import ast
from pathlib import Path

import h3plan

ROOT = Path(__file__).resolve().parents[2]
MAX_SHARE = 0.25


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def share() -> tuple[int, int]:
    """(apparatus lines, library + benchmarks lines)."""
    lib, bench = _lines((ROOT / "h3plan").rglob("*.py")), _lines((ROOT / "benchmarks").rglob("*.py"))
    return _lines((ROOT / "h3plan" / "actions" / "bench").rglob("*.py")) + bench, lib + bench


def test_the_apparatus_is_at_most_a_quarter_of_the_lines():
    apparatus, total = share()
    assert apparatus <= MAX_SHARE * total, (
        f"actions/bench + benchmarks/ are {apparatus} of {total} lines ({apparatus / total:.1%} > {MAX_SHARE:.0%}): "
        "prune a probe no doc cites (benchmarks/README.md lists the removed ones) or share a helper")


BENCH = "h3plan.actions.bench"


def public(module: str, name: str | None = None) -> bool:
    """`import module` (name None) or `from module import name`: h3plan, one of its `__all__`, or the apparatus
    (h3plan.actions.bench and its modules: the timer, the harness, `ops`, the library internals benchmarks/ reaches)."""
    full = module if name is None else f"{module}.{name}"
    if module == "h3plan" and name is not None:
        return name in h3plan.__all__
    return full == "h3plan" or full == BENCH or full.startswith(BENCH + ".")


def private_imports(path: Path) -> list[str]:
    """`line: import` for every import of h3plan in `path` (module or function level) that is not public."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bad += [f"{node.lineno}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] == "h3plan" and not public(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "h3plan":
            bad += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                    if not public(node.module, a.name)]
    return sorted(bad, key=lambda b: int(b.split(":")[0]))


def test_benchmarks_import_only_the_public_api_and_actions_bench():
    bad = {str(p.relative_to(ROOT)): b for p in sorted((ROOT / "benchmarks").rglob("*.py"))
           if (b := private_imports(p))}
    assert not bad, "benchmarks/ imports h3plan internals (route them through h3plan or h3plan.actions.bench): " + \
        "; ".join(f"{p} {', '.join(b)}" for p, b in bad.items())


def test_the_import_check_catches_an_internal(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import h3plan\nfrom h3plan import install, cli\nfrom h3plan.actions.bench import median_ms\n"
                      "from h3plan.actions import bench, verify\nfrom h3plan.actions.bench.ops import swiglu\n"
                      "def f():\n    from h3plan.runtime.kernels import swiglu\n    import h3plan.planner\n")
    assert private_imports(script) == ["2: from h3plan import cli", "4: from h3plan.actions import verify",
                                       "7: from h3plan.runtime.kernels import swiglu", "8: import h3plan.planner"]


def test_ops_imports_and_names_exactly_what_benchmarks_use():
    """`ops` imports (a renamed kernel or module fails here, on a CPU), and lists no internal that no script uses."""
    from h3plan.actions.bench import ops

    assert all(getattr(ops, name) is not None for name in ops.__all__)
    used = {a.name for p in (ROOT / "benchmarks").rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module == f"{BENCH}.ops" for a in node.names}
    assert used == set(ops.__all__), f"used, not in ops: {sorted(used - set(ops.__all__))}; " \
        f"in ops, unused: {sorted(set(ops.__all__) - used)}"


def test_configured_is_the_cli_composition_as_plain_data_and_its_plan():
    from h3plan.actions.bench import configured

    cfg, plan = configured(["hardware=sm90", "recipe=fp8", "parallel.seq_len=37820"])
    assert type(cfg) is dict and cfg["recipe"]["name"] == "fp8" and "bench" in cfg
    assert plan.get("recipe")["name"] == "fp8" and plan.get("parallel")["seq_len"] == 37820

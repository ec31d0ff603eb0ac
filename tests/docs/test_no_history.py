"""Comments say what the code does and why, not how it came to be: no comment or docstring line in h3plan/ and no
comment in conf/ names a work item of this project ("issue 34", "#44"), a work session ("session 11"), a date
("2026-12-01") or a run log under benchmarks/results/logs/. A measurement's story lives in docs/measurements.md or
beside its result; the rest is in `git log`.

Data are not comments: a reason string, a YAML value (a result's provenance, an upstream "TRT-LLM #19738") and a
results path that carries a word like "session" in its file name stay as they are."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HISTORY = re.compile(
    r"\bissues? \d+"                      # a work item: "issue 34", "issues 3 and 4"
    r"|(?<![\w&#/])#\d{1,3}\b"            # "#44" (an upstream citation carries its project and a longer number)
    r"|(?<![\w/-])sessions?[ -]?\d+"      # "session 11", "Session 16's" (not a results folder named nvfp4-session11)
    r"|\b20\d\d-[01]\d\b"                 # a date: 2026-12-01
    r"|\bresults/logs\b",                 # a run log
    re.I)

# The lead is rewriting these files in the redesign and cleans their comments there.
LEAD_OWNED = ("h3plan/levers/sparse_attention.py", "h3plan/levers/step_cache.py", "h3plan/planning/render.py",
              "h3plan/planning/schema.py", "h3plan/cli.py", "h3plan/actions/calibrate_", "conf/config.yaml",
              "conf/tier/", "conf/recipe/")


def python_prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every docstring line (a string statement: module, class, function and
    field docstrings)."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
           if t.type == tokenize.COMMENT]
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        for stmt in getattr(node, "body", []) if isinstance(getattr(node, "body", None), list) else []:
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                out += [(stmt.lineno + i, line) for i, line in enumerate(lines[stmt.lineno - 1:stmt.end_lineno])]
    return out


def yaml_comment(line: str) -> str | None:
    """The comment of one YAML line: from a `#` at the line's start or after a blank, outside a quoted scalar."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"" and (i == 0 or line[i - 1] in " \t[{,:"):
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[i:]
    return None


def history_lines() -> list[str]:
    bad = []
    for path in sorted((ROOT / "h3plan").rglob("*.py")) + sorted((ROOT / "conf").rglob("*.yaml")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(LEAD_OWNED):
            continue
        text = path.read_text()
        if path.suffix == ".py":
            rows = python_prose(text)
        else:
            rows = [(i, c) for i, line in enumerate(text.splitlines(), 1) if (c := yaml_comment(line)) is not None]
        bad += [f"{rel}:{i}: {t.strip()}" for i, t in rows if HISTORY.search(t)]
    return sorted(set(bad))


def test_no_comment_tells_work_history():
    bad = history_lines()
    assert not bad, "\n".join(bad)


def test_the_patterns_tell_history_from_data():
    said = ["# issue 34: at most 2%", "# the fix of #44", "(session 11, call 4)", "Session 16's row",
            "2026-12-01: whole-model compile", "(benchmarks/results/logs/overlap-h200x2.log)"]
    assert all(HISTORY.search(s) for s in said)
    kept = ["(TRT-LLM #21275)", "sglang #33828", "benchmarks/results/probes/nvfp4-session11/ncu.md",
            "docs/sources.md#trtllm-seed", "the bench's session: its models", "torch 2.13"]
    assert not any(HISTORY.search(s) for s in kept)
    assert yaml_comment('a: ["off", "on"]   # proved by tests/gpu') == "# proved by tests/gpu"
    assert yaml_comment('source: "benchmarks/results/x.json (run 2026-12-01)"') is None
    assert yaml_comment("  # a comment line") == "# a comment line"
    assert python_prose('"""Doc: issue 3."""\nx = "issue 4"  # why\n') == [(2, "# why"), (1, '"""Doc: issue 3."""')]

"""'Nothing else lists backends' (docs/architecture.md, how to add an attention backend): no planning module spells
a backend's name; they read the registry (BACKENDS, DEFAULT, BF16, FP8)."""

import ast
from pathlib import Path

from h3plan.facts.attention import BACKENDS

PLANNING = Path(__file__).resolve().parents[2] / "h3plan" / "planning"


def test_no_planning_module_names_a_backend():
    named = []
    for f in sorted(PLANNING.glob("*.py")):
        tree = ast.parse(f.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        named += [f"{f.name}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in BACKENDS and id(n) not in docs]
    assert not named, "read the registry (h3plan.facts.attention) instead: " + "; ".join(named)

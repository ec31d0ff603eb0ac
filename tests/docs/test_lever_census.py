"""A lever is one module plus its kernel: outside h3plan/levers/, h3plan/runtime/ (the kernels) and conf/, no Python
file should name a lever; planning, install, verify and the bench reach it through the registry (h3plan.levers:
REGISTRY, SPECS, the derived tables). This census counts, for every lever of h3plan.levers.NAMES and
MEMORY_NAMES, the Python files of h3plan/ and benchmarks/ (tests/ aside) that name it and holds each count to a
committed ceiling: a count may fall (lower its ceiling in the same change), never rise. The goal of every ceiling
is 0; a lever not listed has ceiling 0, so a new lever touches levers/, its kernel, conf/ and tests only.

A file names a lever where the name is an identifier (a variable, attribute, argument, keyword, function or
import; not another package's function: `re.compile`) or a token of a key-like string (no whitespace:
"step_cache", "vae_ops.swiglu", f"levers.ring={x}"). Comments, docstrings and prose strings (messages with spaces,
an f-string judged whole) are not counted."""

import ast
import re
from pathlib import Path

from h3plan.levers import MEMORY_NAMES, NAMES as LEVER_NAMES

NAMES = LEVER_NAMES + MEMORY_NAMES  # the memory levers (text_encoder) too: every name the registry holds

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("h3plan", "benchmarks")
EXEMPT = ("h3plan/levers/", "h3plan/runtime/", "h3plan/conf/")

# lever -> the most files outside its module and kernel that may name it (goal: 0 each)
CEILING = {
    "adaln_table": 1, "attention": 31, "fp8_scales": 1,
    "qk_norm_rope": 6, "modulation": 7, "gated_residual": 5, "swiglu": 9, "fp8_act_quant": 2,
    "ring": 3, "sparse_attention": 1, "compile": 6, "vae_parallel": 2,
    # diffusers' pipeline names its conditioner component `text_encoder` too (pipe.text_encoder, the component specs):
    # the files that handle that component count here with the ones that read the placement
    "text_encoder": 17,
}

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _doc_strings(tree: ast.AST) -> set[int]:
    """id() of every string that is a statement of its own: module, class, function and field docstrings."""
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def names_in(source: str) -> set[str]:
    """The identifiers and key-like string tokens of a Python source, comments and docstrings left out."""
    tree = ast.parse(source)
    docs = _doc_strings(tree)
    docs |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}  # judged whole, below
    modules = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
               if not a.name.startswith("h3plan")}  # another package's function (re.compile, torch.compile) is no lever
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules:
            continue
        if isinstance(n, ast.JoinedStr):  # an f-string: its literal parts, each field a placeholder
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)
            if not any(c.isspace() for c in text):
                out.update(TOKEN.findall(text))
            continue
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.update(TOKEN.findall(n.name))
            if n.asname:
                out.add(n.asname)
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.update(TOKEN.findall(n.module))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value and not any(c.isspace() for c in n.value):
                out.update(TOKEN.findall(n.value))
    return out


def census() -> dict[str, list[str]]:
    """lever -> the files outside levers/, runtime/ and conf/ that name it."""
    out: dict[str, list[str]] = {name: [] for name in NAMES}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(EXEMPT):
                continue
            named = names_in(path.read_text())
            for name in NAMES:
                if name in named:
                    out[name].append(rel)
    return out


def test_no_lever_is_named_in_more_files_than_its_ceiling():
    risen = {name: files for name, files in census().items() if len(files) > CEILING.get(name, 0)}
    assert not risen, "named outside levers/, runtime/ and conf/ in more files than the ceiling (reach it through " \
        "the registry instead): " + "; ".join(f"{n} in {len(f)} > {CEILING.get(n, 0)}: {', '.join(f)}"
                                              for n, f in risen.items())


def test_every_ceiling_is_the_count_itself():
    """A ceiling above its count would let a later change name the lever again unnoticed: lower it to the count."""
    fallen = {name: len(files) for name, files in census().items() if len(files) < CEILING.get(name, 0)}
    assert not fallen, "lower these ceilings to their counts: " + ", ".join(f"{n} {CEILING[n]} -> {c}"
                                                                           for n, c in fallen.items())


def test_the_ceilings_name_registered_levers():
    assert set(CEILING) <= set(NAMES), f"ceilings for levers no longer registered: {sorted(set(CEILING) - set(NAMES))}"


def test_the_census_counts_identifiers_and_keys_not_prose():
    src = ('"""step_cache in a docstring"""\n# ring in a comment\nx = "attention mask given"\n'
           'y = opts.swiglu\nz = "vae_ops.qk_norm_rope"\nfrom h3plan.levers import compile\n'
           'w = f"gemm_quant={w} quantised"\nv = f"levers.{x}.fused"\nu = f"vae_tiles={w}"\n'
           'import re\nt = re.compile("x")\n')
    assert names_in(src) & set(NAMES) == {"swiglu", "vae_ops", "qk_norm_rope", "compile", "vae_tiles"}

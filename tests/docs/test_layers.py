"""The import graph follows docs/architecture.md's layer list: no module imports from a higher layer, deferred
(function-level) or not, and h3plan/ has no import circle but the lever registry's own (one inside h3plan/levers/).

The layer order is read from the doc's "Layers, lowest first" paragraph, the one place it is written: each
layer is a comma-separated run of `names` between "->"; a name is a folder under h3plan/ or a module at the top of
h3plan/ (dotted: the folders are the tiers), and a module belongs to its longest listed prefix. Edges come from every
`import` / `from ... import` in h3plan/ (ast, module and function level); the package root `h3plan` (the public names)
sits above every layer, and an import of it (its `__version__`) is left out, since the root is initialised before any of
its modules.

Function-level imports of h3plan modules defer a heavy package only: the imported module loads a package of
a heavier tier of HEAVY than the importing module does (each counted from its module-level imports, transitively, with
the packages above it): a torch-free module defers torch, a module free of Hydra and OmegaConf defers them too.
Everything else is imported at module level."""

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "h3plan"

# Circles owned by another open item; each entry must still exist (delete it once the circle is gone).
KNOWN_CIRCLES: set[frozenset[str]] = set()


def layers() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    para = re.search(r"Layers, lowest first.*?:\n(.*?)\n\n", text, re.S).group(1)
    out = [re.findall(r"`([\w.]+)`", part) for part in para.split("->")]
    assert all(out), f"an empty layer in the doc's layer list: {para!r}"
    return out


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


# The packages a deferred import may keep out, in two tiers: the runtime extra (pyproject.toml), which the plan path
# never loads (tests/cli/test_cli_speed.py), and the config stack, Hydra and OmegaConf, which `import h3plan`
# (h3plan/__init__.py) and the CLI's --version and --help leave out.
RUNTIME = ("torch", "triton", "diffusers", "numpy", "transformers")
CONFIG = ("hydra", "omegaconf")
HEAVY = RUNTIME + CONFIG


def tier(packages: set[str]) -> int:
    """0: none of HEAVY; 1: the config stack; 2: a runtime package."""
    return 2 if packages & set(RUNTIME) else 1 if packages & set(CONFIG) else 0


def imports(mods: dict[str, Path]) -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported module, line, deferred)]: every import, an h3plan module (`from pkg import name` counts
    pkg.name where that is a module) or an outside package's dotted name; deferred: inside a function."""
    out: dict[str, list[tuple[str, int, bool]]] = defaultdict(list)
    for name, path in mods.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(node, deferred):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if isinstance(child, ast.Import):
                        targets = [a.name for a in child.names]
                    else:
                        parent = base.split(".")[: len(base.split(".")) - child.level + 1] if child.level else []
                        mod = ".".join(parent + ([child.module] if child.module else []))
                        targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in child.names]
                    out[name] += [(t, child.lineno, deferred) for t in targets]
                visit(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text()), False)
    return out


def h3plan_module(target: str, mods) -> str | None:
    """The h3plan module an import names (its longest prefix that is one), None for an outside package."""
    if target != "h3plan" and not target.startswith("h3plan."):
        return None
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def edges(mods: dict[str, Path]) -> dict[str, set[tuple[str, int]]]:
    """module -> {(imported h3plan module, line)}, module and function level."""
    out: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, found in imports(mods).items():
        for target, line, _ in found:
            t = h3plan_module(target, mods)
            if t and t != name and t != "h3plan":
                out[name].add((t, line))
    return out


def loads(found: dict[str, list[tuple[str, int, bool]]], mods) -> dict[str, set[str]]:
    """module -> the HEAVY packages importing it loads: its module-level imports, transitively, and those of the
    packages above it (Python initialises `a` and `a.b` before `a.b.c`)."""

    def above(m):
        parts = m.split(".")
        return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in mods]

    direct = {m: set() for m in mods}
    heavy = {m: set() for m in mods}
    for m in mods:
        direct[m].update(above(m))
        for target, _, deferred in found.get(m, ()):
            t = h3plan_module(target, mods)
            if deferred:
                continue
            if t:
                direct[m].update([t, *above(t)])
            elif target.split(".")[0] in HEAVY:
                heavy[m].add(target.split(".")[0])
    out = {}
    for m in mods:
        seen, todo, got = set(), [m], set()
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                got |= heavy[n]
                todo += direct[n]
        out[m] = got
    return out


def needless_deferrals(found: dict[str, list[tuple[str, int, bool]]], mods) -> list[str]:
    """Each function-level import of an h3plan module that defers no heavy package: the imported module is in the
    importing module's tier or a lighter one (a module that loads torch defers nothing)."""
    heavy = loads(found, mods)
    bad = []
    for m, rows in sorted(found.items()):
        for line, t in sorted({(line, h3plan_module(target, mods)) for target, line, deferred in rows if deferred}):
            if t and t != m and tier(heavy[t]) <= tier(heavy[m]):
                why = (f"{m} loads {', '.join(sorted(heavy[m]))} already" if heavy[m] else
                       f"{t} loads no {'/'.join(HEAVY)}")
                bad.append(f"{mods[m].relative_to(ROOT)}:{line} imports {t} in a function ({why}): "
                           f"import it at module level")
    return bad


def layer_of(name: str, order: list[list[str]]) -> int:
    if name == "h3plan":  # the package root: the public names, above every layer
        return len(order)
    best, rank = "", None
    for i, layer in enumerate(order):
        for entry in layer:
            full = f"h3plan.{entry}"
            if (name == full or name.startswith(full + ".")) and len(full) > len(best):
                best, rank = full, i
    assert rank is not None, f"{name} is in no layer of docs/architecture.md's layer list"
    return rank


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def upward(found: dict[str, set[tuple[str, int]]], order: list[list[str]]) -> list[str]:
    """Each import of a module in a higher layer than the importing one."""
    return [f"{m}:{line} imports {t} (layer {layer_of(t, order)} above {layer_of(m, order)})"
            for m, targets in sorted(found.items()) for t, line in sorted(targets)
            if layer_of(t, order) > layer_of(m, order)]


def test_no_module_imports_from_a_higher_layer():
    up = upward(edges(modules()), layers())
    assert not up, "\n".join(up)


def test_the_layers_are_folders():
    """Each name of the layer list is a folder of h3plan/ or a module at its top, never a module inside a folder."""
    names = [n for layer in layers() for n in layer]
    bad = [n for n in names if not (PKG / n.replace(".", "/")).is_dir()
           and not ("." not in n and (PKG / f"{n}.py").is_file())]
    assert not bad, f"not a folder of h3plan/ nor a top-level module: {bad}"
    assert len(names) == len(set(names)), names


def test_no_import_circles_but_the_lever_registry():
    graph = {m: {t for t, _ in ts} for m, ts in edges(modules()).items()}
    found = circles(graph)
    bad = [sorted(c) for c in found
           if c not in KNOWN_CIRCLES and not all(m == "h3plan.levers" or m.startswith("h3plan.levers.") for m in c)]
    assert not bad, bad
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"fixed: delete these from KNOWN_CIRCLES: {gone}"


def test_function_level_imports_defer_a_heavy_package_only():
    mods = modules()
    bad = needless_deferrals(imports(mods), mods)
    assert not bad, "\n".join(bad)


def test_the_plan_side_loads_no_heavy_package():
    """What the deferrals buy: `import h3plan` and the CLI module load none of HEAVY, the plan side no runtime
    package (ast only: the subprocess tests check sys.modules after a real plan)."""
    mods = modules()
    heavy = loads(imports(mods), mods)
    light = ["h3plan", "h3plan.cli", "h3plan.planning.config", "h3plan.levers", "h3plan.actions"]
    assert {m: sorted(heavy[m]) for m in light} == {m: [] for m in light}
    plan_side = ["h3plan.planner", "h3plan.sweep", "h3plan.from_model", "h3plan.install", "h3plan.actions.verify"]
    assert {m: sorted(heavy[m] & set(RUNTIME)) for m in plan_side} == {m: [] for m in plan_side}
    assert "torch" in heavy["h3plan.install.installer"] and "hydra" in heavy["h3plan.sweep"]


def test_the_checks_can_fail():
    order = layers()
    assert layer_of("h3plan.errors", order) < layer_of("h3plan.levers.base", order) < layer_of("h3plan.planner", order)
    assert (layer_of("h3plan.planner", order) < layer_of("h3plan.install.installer", order)
            < layer_of("h3plan.cli", order))
    assert layer_of("h3plan.facts.attention.spec", order) < layer_of("h3plan.levers.attention", order) < layer_of(
        "h3plan.planning.schema", order) < layer_of("h3plan.runtime.guards", order) < layer_of(
        "h3plan.runtime.kernels.fp8", order) < layer_of("h3plan.runtime.quant.fp8", order) < layer_of(
        "h3plan.install.vae.block", order) < layer_of("h3plan.actions.verify", order)
    fake = {"h3plan.facts.hardware": {("h3plan.planning.schema", 3)},  # a folder importing one above it
            "h3plan.runtime.quant.fp8": {("h3plan.runtime.parallel.comm", 4)},  # the same layer
            "h3plan.install.vae.block": {("h3plan.install.options", 5)}}  # the same folder
    assert upward(fake, order) == [f"h3plan.facts.hardware:3 imports h3plan.planning.schema (layer "
                                   f"{layer_of('h3plan.planning.schema', order)} above "
                                   f"{layer_of('h3plan.facts', order)})"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    names = ("h3plan.light", "h3plan.other", "h3plan.gpu", "h3plan.conf", "h3plan.conf2")
    mods = {m: ROOT / f"{m.replace('.', '/')}.py" for m in names}
    found = {"h3plan.light": [("h3plan.gpu", 3, True), ("h3plan.other", 4, True)],  # the second defers nothing
             "h3plan.gpu": [("torch", 1, False), ("h3plan.other", 5, True)],  # torch is loaded already
             "h3plan.other": [("h3plan.gpu.x", 6, True), ("h3plan.conf", 7, True)],  # both defer a heavier tier
             "h3plan.conf": [("omegaconf", 1, False), ("h3plan.gpu", 8, True)],  # the config tier defers torch
             "h3plan.conf2": [("hydra.core", 1, False), ("h3plan.conf", 9, True)]}  # same tier: nothing deferred
    assert [line.split(" imports ")[0] for line in needless_deferrals(found, mods)] == [
        "h3plan/conf2.py:9", "h3plan/gpu.py:5", "h3plan/light.py:4"]

"""The benchmarks/ scripts as modules, for the tests that call their functions: they are files run by path (python
benchmarks/vae.py ...), not a package, so a test loads one by its path in the checkout."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str):
    """The module of the script at `relpath` (from the checkout's root, e.g. "benchmarks/vae.py"), executed once per
    call."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

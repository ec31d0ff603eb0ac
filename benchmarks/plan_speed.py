"""How long a cold `python -m h3plan` plan takes on this machine, and why (no GPU).

    python benchmarks/plan_speed.py [--runs 7] [hardware=sm90 recipe=bf16 parallel=u1 ...]

Prints the median and the fastest wall time of `runs` fresh interpreters and their median CPU time, the Hydra compositions one plan
pays for (Hydra 1.3 on its own composes twice; h3plan's CLI once) and `python -X importtime`'s cumulative
import cost of h3plan.cli and h3plan.planning.schema. On a loaded machine compare two trees measured the same way,
one after the other, rather than against a number taken elsewhere.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COUNT = """
import contextlib, io, sys
from hydra._internal.hydra import Hydra
from h3plan import cli
calls = []
original = Hydra.compose_config
def counting(self, *a, **k):
    calls.append(1)
    return original(self, *a, **k)
Hydra.compose_config = counting
with contextlib.redirect_stdout(io.StringIO()):
    rc = cli.run(sys.argv[1:])
print(rc, len(calls))
"""


def _import_us(module: str) -> int:
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], cwd=REPO,
                         capture_output=True, text=True, check=True).stderr
    for line in err.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise RuntimeError(f"no importtime line for {module}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("overrides", nargs="*", default=["hardware=sm90", "recipe=bf16", "parallel=u1"])
    a = ap.parse_args()
    walls, cpus = [], []
    for _ in range(a.runs):
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "h3plan", *a.overrides], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - t0)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    rc, compositions = subprocess.run([sys.executable, "-c", COUNT, *a.overrides], cwd=REPO, capture_output=True,
                                      text=True, check=True).stdout.split()
    print(f"python -m h3plan {' '.join(a.overrides)}: median {statistics.median(walls):.3f} s, fastest {min(walls):.3f} s "
          f"over {a.runs} cold runs (CPU {statistics.median(cpus):.3f} s, less sensitive to a loaded machine); {compositions} Hydra composition(s) per plan (exit {rc}); import h3plan.cli "
          f"{_import_us('h3plan.cli') / 1e3:.0f} ms, h3plan.planning.schema {_import_us('h3plan.planning.schema') / 1e3:.0f} ms (cumulative)")


if __name__ == "__main__":
    main()

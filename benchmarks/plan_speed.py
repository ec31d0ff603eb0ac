"""How long a cold `python -m h3plan` plan takes on this machine, and why (no GPU).

    python benchmarks/plan_speed.py [--runs 7] [--against /path/to/other/tree] [--out FILE.md] [--json FILE] [hardware=sm90 ...]

Prints the median and the fastest wall time of `runs` fresh interpreters and their median CPU time, the Hydra
compositions one plan pays for (Hydra 1.3 on its own composes twice; h3plan's CLI once) and `python -X importtime`'s
cumulative import cost of h3plan.cli and h3plan.planning.schema. On a loaded machine compare two trees measured the
same way:
`--against` times another checkout (`git archive <rev> | tar -x -C /tmp/base`) in the same loop, one run of each in
turn, so both see the same load. `--out` appends the result, the load average and the machine to a markdown file;
`--json` writes every run's (wall, CPU) seconds. A plain plan composes without Hydra (h3plan/planning/direct.py), so
it counts 0 Hydra compositions. Whether Python may write bytecode caches (PYTHONDONTWRITEBYTECODE) is printed: without
them every cold run compiles h3plan's own modules again.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
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


def _one(tree: Path, overrides: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one cold plan run in `tree` (`-m` puts the working folder first on sys.path)."""
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "h3plan", *overrides], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def _summary(name: str, runs: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    return (f"{name}: wall median {statistics.median(walls):.3f} s, fastest {min(walls):.3f} s; CPU median "
            f"{statistics.median(cpus):.3f} s, least {min(cpus):.3f} s ({len(runs)} cold runs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--against", type=Path, help="another checkout, timed in the same loop (one run each in turn)")
    ap.add_argument("--out", type=Path, help="append the result to this markdown file")
    ap.add_argument("--json", type=Path, help="write every run's (wall s, CPU s) and the summary to this JSON file")
    ap.add_argument("overrides", nargs="*", default=["hardware=sm90", "recipe=bf16", "parallel=u1"])
    a = ap.parse_args()
    trees = [("this tree", REPO)] + ([(f"--against {a.against}", a.against.resolve())] if a.against else [])
    load_before = os.getloadavg()
    runs: dict[str, list] = {name: [] for name, _ in trees}
    for i in range(a.runs):
        for name, tree in trees if i % 2 == 0 else trees[::-1]:
            runs[name].append(_one(tree, a.overrides))
    load_after = os.getloadavg()
    rc, compositions = subprocess.run([sys.executable, "-c", COUNT, *a.overrides], cwd=REPO, capture_output=True,
                                      text=True, check=True).stdout.split()
    lines = [_summary(name, runs[name]) for name, _ in trees]
    lines.append(f"{compositions} Hydra composition(s) per plan (exit {rc}); import h3plan.cli "
                 f"{_import_us('h3plan.cli') / 1e3:.0f} ms, h3plan.planning.schema "
                 f"{_import_us('h3plan.planning.schema') / 1e3:.0f} ms (cumulative)")
    pyc = "off (PYTHONDONTWRITEBYTECODE)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "on"
    lines.append(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} CPUs; "
                 f"python {sys.version.split()[0]}; bytecode caches {pyc}")
    print(f"python -m h3plan {' '.join(a.overrides)}")
    print("\n".join(lines))
    if a.json:
        a.json.write_text(json.dumps({"command": f"python -m h3plan {' '.join(a.overrides)}",
                                      "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "bytecode_caches": pyc,
                                      "load_average": [load_before[0], load_after[0]], "cpus": os.cpu_count(),
                                      "runs": {name: [{"wall_s": round(w, 4), "cpu_s": round(c, 4)}
                                                      for w, c in runs[name]]
                                               for name, _ in trees},
                                      "summary": lines}, indent=1) + "\n")
    if a.out:
        with a.out.open("a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python -m h3plan "
                    f"{' '.join(a.overrides)}`\n\n"
                    + "".join(f"- {x}\n" for x in lines))


if __name__ == "__main__":
    main()

"""Block benchmark: diffusers eager vs an h3plan plan on one GPU (`action=bench`, h3plan/actions/bench/).

    python benchmarks/block.py recipe=bf16            # H200: appends to benchmarks/results/block-h200.*
    python benchmarks/block.py recipe=fp8 'bench.seq_lens=[37820]' bench.out_dir=/tmp/r

The same as `python -m h3plan action=bench hardware=sm90 parallel=u1 bench.out_dir=<checkout>/benchmarks/results
<overrides>` from this checkout (the CLI alone writes to a run folder of its own); later overrides win.
benchmarks/run_h200.sh runs it for the bf16 and the fp8 plan in one device call.
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's h3plan

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

if __name__ == "__main__":  # `python -m h3plan action=bench ...`, in this process
    sys.argv = ["python -m h3plan", "action=bench", "hardware=sm90", "parallel=u1", f"bench.out_dir={RESULTS}",
                *sys.argv[1:]]
    runpy.run_module("h3plan", run_name="__main__", alter_sys=True)

"""Block benchmark: diffusers eager vs an h3plan plan on one GPU (`action=bench`, h3plan/actions/bench/).

    python benchmarks/block.py recipe=bf16            # H200: appends to benchmarks/results/block-h200.*
    python benchmarks/block.py recipe=fp8 'bench.seq_lens=[37820]' bench.out_dir=/tmp/r

The same as `python -m h3plan action=bench hardware=sm90 parallel=u1 <overrides>` from this checkout;
later overrides win. benchmarks/run_h200.sh runs it for the bf16 and the fp8 plan in one device call.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's h3plan

from h3plan import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli.run(["action=bench", "hardware=sm90", "parallel=u1", *sys.argv[1:]]))

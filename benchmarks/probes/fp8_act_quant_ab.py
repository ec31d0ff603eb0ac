"""Probe (H200): the installed FP8 block with fp8_act_quant=tensor against fp8_act_quant=row, one process.

One real-width MiniMaxH3TransformerBlock (hidden 5376, 56 x 128 heads, ffn 14336) per S; three arms interleaved
round by round: diffusers eager, the installed recipe=fp8 plan with levers.fp8_act_quant=tensor, and the same
plan with row. Records per S: median ms, tensor / row (the number hardware.measured.fp8_act_quant.block
takes, one entry per run of this probe), relative error of each plan against eager, and the call counters of
one forward of each plan (row must show fp8_act_quant fused 4, fallback 0).

Usage: python benchmarks/probes/fp8_act_quant_ab.py OUT [S ...]   (default S: 19000 37820; writes
OUT/fp8-act-quant-h200.json after every S)
"""
import copy
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(Path(__file__).resolve().parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from h3plan.actions.bench import Clock, interleaved  # noqa: E402

from h3plan.actions import bench as inputs  # noqa: E402
from h3plan.actions.bench import capture_block_inputs, configured, rel_error, run_stack  # noqa: E402
from h3plan import install  # noqa: E402
from h3plan import counters, reset_counters  # noqa: E402

ROUNDS, WARM = 10, 2
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SEQS = [int(s) for s in sys.argv[2:]] or [19000, 37820]


def main():
    Path(OUT).mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS, "block": []}
    base = ["hardware=sm90", "parallel=u1", "recipe=fp8"]
    cfg = configured(base)[0]
    eager = inputs.build_model(cfg["model"]["diffusers_config"], blocks=1, device="cuda", dtype="bf16", seed=0)
    for S in SEQS:
        models, settings = {}, {}
        for arm in ("tensor", "row"):
            plan = configured(base + [f"parallel.seq_len={S}", f"levers.fp8_act_quant={arm}"])[1]
            settings[arm] = {d.lever: d.setting for d in plan.decisions if d.enabled}
            models[arm] = copy.deepcopy(eager)
            install(models[arm], plan)
        block_in = capture_block_inputs(torch, eager,
                                        inputs.packed_inputs(cfg["model"]["diffusers_config"], S, device="cuda"))
        arms = {"eager": lambda: run_stack(eager.transformer_blocks, *block_in),
                "tensor": lambda: models["tensor"].transformer_blocks[0](*block_in),
                "row": lambda: models["row"].transformer_blocks[0](*block_in)}
        rec = {"S": S, "settings": settings, "counters": {}, "rel_error_vs_eager": {}}
        with torch.no_grad():
            ref = arms["eager"]()
            for arm in ("tensor", "row"):
                reset_counters()
                out = arms[arm]()
                torch.cuda.synchronize()
                rec["counters"][arm] = str(counters())
                rec["rel_error_vs_eager"][arm] = rel_error(torch, out, ref)[0]
                del out
            del ref
            t = interleaved(Clock(), arms, WARM, ROUNDS)
        med = {k: statistics.median(v) for k, v in t.items()}
        rec.update(ms=med, speedup_row_vs_tensor=med["tensor"] / med["row"], raw_ms=t)
        print("block", {k: v for k, v in rec.items() if k not in ("raw_ms", "settings")}, flush=True)
        result["block"].append(rec)
        with open(os.path.join(OUT, "fp8-act-quant-h200.json"), "w") as f:
            json.dump(result, f, indent=1)
        del models, block_in, arms
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Probe (H200): the FA4 tile inside the real-width block, one process, interleaved: the lossless bf16 plan with
FA4's default tile against the same plan with the measured (192, 128) tile (`levers.fa4_tile=default` vs `tuned`),
each round running eager, A and B once; the two plans must give the same bits. This is the in-block version of the
attention-only A/B in attention-tuning-h200.md, whose two runs at 37,820 disagreed. The attention call's
placement (in the plan, back to back, after a forward) is timed by action=bench itself
(h3plan/actions/bench/measure.py).

Usage: python block_ab.py OUT_DIR [S ...]   (default S: 37820 19000)
"""
import copy
import json
import os
import statistics
import sys
import time

import torch

from h3plan import install
from h3plan.actions import bench as inputs
from h3plan.actions.bench import roles
from h3plan.actions.bench import Clock, capture_block_inputs, configured, interleaved, run_stack

ROUNDS, WARM = 12, 2
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SEQS = [int(s) for s in sys.argv[2:]] or [37820, 19000]
RESULT = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS, "tile": [],
          "placement": []}


def save():
    with open(os.path.join(OUT, "block-ab.json"), "w") as f:
        json.dump(RESULT, f, indent=1)


def plan_for(*overrides):
    return configured(["hardware=sm90", "parallel=u1", *overrides])


def interleave(fns: dict, rounds=ROUNDS):
    return interleaved(Clock(), fns, WARM, rounds)


def med(x):
    return statistics.median(x)


def tile_ab(cfg, eager, S):
    _, pa = plan_for("recipe=bf16", f"levers.{roles.FA4_TILE}=default", f"parallel.seq_len={S}")
    _, pb = plan_for("recipe=bf16", f"levers.{roles.FA4_TILE}=tuned", f"parallel.seq_len={S}")
    ma, mb = copy.deepcopy(eager), copy.deepcopy(eager)
    install(ma, pa)
    install(mb, pb)
    block_in = capture_block_inputs(torch, eager,
                                    inputs.packed_inputs(cfg["model"]["diffusers_config"], S, device="cuda"))
    with torch.no_grad():
        oa, ob = run_stack(ma.transformer_blocks, *block_in), run_stack(mb.transformer_blocks, *block_in)
        same = bool(torch.equal(oa.view(torch.int16), ob.view(torch.int16)))
        del oa, ob
        t = interleave({"eager": lambda: run_stack(eager.transformer_blocks, *block_in),
                        "default_tile": lambda: run_stack(ma.transformer_blocks, *block_in),
                        "tuned_tile": lambda: run_stack(mb.transformer_blocks, *block_in)})
    e = med(t["eager"])
    rec = {"S": S, "bitwise_default_vs_tuned": same, "eager_ms": e, "default_ms": med(t["default_tile"]),
           "tuned_ms": med(t["tuned_tile"]), "speedup_default": e / med(t["default_tile"]),
           "speedup_tuned": e / med(t["tuned_tile"]), "tuned_vs_default": med(t["default_tile"]) / med(t["tuned_tile"]),
           # per round: does the tuned tile beat the default in that round?
           "rounds_tuned_faster": sum(b < a for a, b in zip(t["default_tile"], t["tuned_tile"])), "raw": t}
    print("tile", {k: v for k, v in rec.items() if k != "raw"}, flush=True)
    RESULT["tile"].append(rec)
    save()
    del ma, mb, block_in
    torch.cuda.empty_cache()


def main():
    cfg, _ = plan_for("recipe=bf16")
    eager = inputs.build_model(cfg["model"]["diffusers_config"], blocks=1, device="cuda", dtype="bf16", seed=0)
    t0 = time.monotonic()
    for S in SEQS:
        for fn, args in ((tile_ab, ()),):
            try:
                fn(cfg, eager, S, *args)
            except Exception as exc:  # noqa: BLE001 -- recorded; the other sections still run
                print(f"{fn.__name__} S={S} {args}: {type(exc).__name__}: {exc}", flush=True)
                RESULT.setdefault("errors", []).append(f"{fn.__name__} S={S} {args}: {type(exc).__name__}: {exc}")
                save()
        print(f"S={S} done at {time.monotonic() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()

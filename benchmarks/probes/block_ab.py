"""Probe (H200): two questions about the real-width block, one process, everything interleaved.

1. tile: the lossless bf16 plan with FA4's default tile against the same plan with the measured
   (192, 128) tile (`levers.fa4_tile=default` vs `tuned`), each round running eager, A and B once; the
   two plans must give the same bits. This is the in-block version of the attention-only A/B in
   attention-tuning-h200.md, whose two runs at 37,820 disagreed.
2. placement: the plan's attention call timed three ways: inside the plan's forward (after the QKV
   GEMMs), back to back on clones of its arguments (the bench's "standalone"), and standalone with a
   whole plan forward run untimed just before each call (the same kind of work ahead of it, so the
   same power state). If "after a forward" matches "in plan", the plan adds nothing to the call.

Usage: python block_ab.py OUT_DIR [S ...]   (default S: 37820 19000)
"""
import copy
import json
import os
import statistics
import sys
import time

import torch
from _cuda_timing import events, interleaved_ms

from h3plan.actions import inputs
from h3plan.actions.bench.measure import capture_block_inputs, plan_backend, run_stack
from h3plan.actions.bench.timing import BackendTimer
from h3plan.planning.config import compose as compose_config
from h3plan.install import install
from h3plan.planner import resolve

ROUNDS, WARM = 12, 2
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SEQS = [int(s) for s in sys.argv[2:]] or [37820, 19000]
RESULT = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS, "tile": [], "placement": []}


def save():
    with open(os.path.join(OUT, "block-ab.json"), "w") as f:
        json.dump(RESULT, f, indent=1)


def plan_for(*overrides):
    cfg = compose_config(["hardware=sm90", "parallel=u1", *overrides])
    return cfg, resolve(cfg)


def interleave(fns: dict, rounds=ROUNDS):
    return interleaved_ms(fns, rounds, WARM)


def med(x):
    return statistics.median(x)


def tile_ab(cfg, eager, S):
    _, pa = plan_for("recipe=bf16", "levers.fa4_tile=default", f"parallel.seq_len={S}")
    _, pb = plan_for("recipe=bf16", "levers.fa4_tile=tuned", f"parallel.seq_len={S}")
    ma, mb = copy.deepcopy(eager), copy.deepcopy(eager)
    install(ma, pa)
    install(mb, pb)
    block_in = capture_block_inputs(torch, eager, inputs.packed_inputs(cfg["model"]["diffusers_config"], S, device="cuda"))
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


def placement(cfg, eager, S, recipe):
    _, plan = plan_for(f"recipe={recipe}", f"parallel.seq_len={S}")
    m = copy.deepcopy(eager)
    install(m, plan)
    backend = plan_backend(m)
    timer = BackendTimer(torch, True)
    timer.attach(backend)
    block_in = capture_block_inputs(torch, eager, inputs.packed_inputs(cfg["model"]["diffusers_config"], S, device="cuda"))
    fwd = lambda: run_stack(m.transformer_blocks, *block_in)  # noqa: E731
    with torch.no_grad():
        timer.capture = True
        fwd()
        _, args, kwargs = timer.captured
        call = timer.original(backend)
        alone = lambda: call(*args, **kwargs)  # noqa: E731
        for _ in range(WARM):
            fwd()
            alone()
        torch.cuda.synchronize()
        timer.drain_ms()
        in_plan, b2b, after = [], [], []
        for _ in range(ROUNDS):  # round: forward (in-plan event), forward + standalone call, 3 calls back to back
            fwd()
            fwd()
            after.append(events(alone))
            for _ in range(3):
                b2b.append(events(alone))
            torch.cuda.synchronize()
        ts = timer.drain_ms()
        in_plan = ts[1::2]  # the second forward of each round: it follows a whole forward, like `after`
    timer.detach()
    b2b = [a.elapsed_time(b) for a, b in b2b][2::3]  # the third call of each run: after two attention calls
    after = [a.elapsed_time(b) for a, b in after]
    rec = {"S": S, "recipe": recipe, "backend": plan.decision("attention").setting, "in_plan_ms": med(in_plan),
           "standalone_back_to_back_ms": med(b2b), "standalone_after_forward_ms": med(after),
           "in_plan_speed_vs_back_to_back": med(b2b) / med(in_plan),
           "in_plan_speed_vs_after_forward": med(after) / med(in_plan)}
    print("placement", rec, flush=True)
    RESULT["placement"].append(rec)
    save()
    del m, block_in
    torch.cuda.empty_cache()


def main():
    cfg, _ = plan_for("recipe=bf16")
    eager = inputs.build_model(cfg["model"]["diffusers_config"], blocks=1, device="cuda", dtype="bf16", seed=0)
    t0 = time.monotonic()
    for S in SEQS:
        for fn, args in ((tile_ab, ()), (placement, ("fp8",)), (placement, ("bf16",))):
            try:
                fn(cfg, eager, S, *args)
            except Exception as exc:  # noqa: BLE001 -- recorded; the other sections still run
                print(f"{fn.__name__} S={S} {args}: {type(exc).__name__}: {exc}", flush=True)
                RESULT.setdefault("errors", []).append(f"{fn.__name__} S={S} {args}: {type(exc).__name__}: {exc}")
                save()
        print(f"S={S} done at {time.monotonic() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()

"""h3plan's Ulysses plans against diffusers' own context parallelism, side by side in one run.

    torchrun --standalone --nproc-per-node=2 benchmarks/parallel.py --out DIR [--seq-lens 19000,37820] [--blocks 2]

A whole MiniMaxH3Transformer3DModel at real width with `--blocks` blocks (seeded weights, the packed layout
of h3plan's verify), the same on every rank. Settings, timed in interleaved rounds (CUDA events, median;
a barrier before each call so the ranks start together):

  eager_1gpu           diffusers' default model on one GPU (every rank runs it alone)
  plan_u1_<recipe>     the sm90 plan at degree 1 on one GPU
  diffusers_cp         diffusers' best multi-GPU setting: set_attention_backend("_native_cudnn"),
                       enable_parallelism(ContextParallelConfig(ulysses_degree=U)),
                       compile_repeated_blocks(fullgraph=True)
  plan_u<U>_<recipe>   the sm90 plan at degree U over the world group
  plan_r<R>u<U/R>_<r>  with --ring R: ring R x Ulysses U/R over the same ranks (lossy: budget recipes)
  plan_u1_<r>+compile  diffusers' regional compile over the installed degree-1 plan of each recipe (the compile
                       lever's evidence; `--no-compile-plans` leaves it out)

Writes parallel-<tag>.json ({"records": [{gpus, S, plan, plan_ms, plan_u1_ms, diffusers_cp_ms,
diffusers_cp_config, scaling_vs_u1, speedup_vs_diffusers_cp, speedup_vs_eager_1gpu, bitwise_vs_u1,
rel_vs_u1}], "times": {...}}) and a markdown table. Rank 0 writes.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CP_CONFIG = ("ContextParallelConfig(ulysses_degree={U}) + set_attention_backend('_native_cudnn') + "
             "compile_repeated_blocks(fullgraph=True)")


def _plan(recipe, U, S, ring=1, **over):
    import h3plan

    return h3plan.resolve_config(recipe=recipe, parallel=f"u{U}",
                                 **{"parallel.seq_len": S, "parallel.ring": ring}, **over)


def _allows(recipe, U, S, **over) -> bool:
    from h3plan import PlanningError

    try:
        _plan(recipe, U, S, **over)
        return True
    except PlanningError:
        return False


# each exchange an arm forces -> whether it runs without the overlap (the projection exchanges do)
EXCHANGES = {"packed": False, "projection": True, "projection_split": True}
ARMS = tuple(f"+{k}" for k in sorted(EXCHANGES, key=len, reverse=True))  # longest first: suffixes overlap


def _exchange(name, recipe, U, S) -> str | None:
    for a in ARMS:
        if name.endswith(a):
            return a[1:]
    if name.startswith("plan_r"):
        return None
    from h3plan.actions.bench import roles

    return _plan(recipe, U, S).decision(roles.EXCHANGE).setting


def _settings(base, S, U, group, recipes, compile_plans, ring=1, exchange_arm=False):
    """name -> model (built on the shared base by deepcopy), and name -> setup note."""
    import torch

    import h3plan
    from h3plan.actions.bench import TIMESTEP, roles

    made, notes = {}, {}

    def add(name, make):
        t0 = time.time()
        try:
            made[name] = make()
            notes[name] = f"setup {time.time() - t0:.1f} s"
        except Exception as e:  # noqa: BLE001 - recorded, the other settings still run
            notes[name] = "FAILED: " + "".join(traceback.format_exception_only(e)).strip()[:300]

    add("eager_1gpu", lambda: base)

    def plan(recipe, u, compiled=False, r=1, **over):
        m = copy.deepcopy(base)
        h3plan.install(m, _plan(recipe, u, S, r, **over), **({"group": group} if u * r > 1 else {}))
        h3plan.prepare(m, timesteps=[TIMESTEP])  # adaln_table: packed_inputs' timesteps (no-op without a table)
        if compiled:
            m.compile_repeated_blocks(fullgraph=True)
        return m

    for r in recipes:
        add(f"plan_u1_{r}", lambda r=r: plan(r, 1))
    if compile_plans:
        for r in recipes:
            add(f"plan_u1_{r}+compile", lambda r=r: plan(r, 1, True))

    def cp():
        from diffusers import ContextParallelConfig

        m = copy.deepcopy(base)
        m.set_attention_backend("_native_cudnn")
        # a length the degree does not divide needs diffusers' ulysses_anything (as the pipeline bench's best)
        m.enable_parallelism(config=ContextParallelConfig(ulysses_degree=U,
                                                          **({"ulysses_anything": True} if S % U else {})))
        m.compile_repeated_blocks(fullgraph=True)
        return m

    add("diffusers_cp", cp)
    for r in recipes:
        add(f"plan_u{U}_{r}", lambda r=r: plan(r, U))
        if exchange_arm:  # every exchange the plan did not pick, forced where the recipe allows it
            picked = _plan(r, U, S).decision(roles.EXCHANGE).setting
            for setting, no_overlap in EXCHANGES.items():
                over = {f"levers.{roles.EXCHANGE}": setting}
                if no_overlap:
                    over[f"levers.{roles.OVERLAP}"] = "off"
                name = f"plan_u{U}_{r}+{setting}"
                if setting == picked:
                    continue
                if not _allows(r, U, S, **over):
                    notes[name] = f"skipped: recipe {r} refuses ulysses_exchange={setting}"
                else:
                    add(name, lambda r=r, over=over: plan(r, U, **over))
        if ring > 1:  # ring x Ulysses over the same world: lossy, so budget recipes only
            name = f"plan_r{ring}u{U // ring}_{r}"
            if _plan(r, 1, S).lossless:
                notes[name] = f"skipped: recipe {r} is lossless and the ring is not bitwise (the plan refuses it)"
            else:
                add(name, lambda r=r: plan(r, U // ring, r=ring))
    torch.cuda.synchronize()
    return made, notes


def _time(fns, rounds, warm, barrier):
    from h3plan.actions.bench import Clock, interleaved

    return {k: statistics.median(v) for k, v in interleaved(Clock(), fns, warm, rounds, before=barrier).items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-lens", default="19000,37820")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--recipes", default="bf16,fp8")
    ap.add_argument("--no-compile-plans", action="store_true")
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--ring", type=int, default=1, help="also time ring R x Ulysses U/R over the same ranks (R > 1)")
    ap.add_argument("--exchange-arm", action="store_true",
                    help="also time each recipe's degree-U plan with ulysses_exchange=projection forced")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one forward of every plan (per-category GPU time, "
                         "benchmarks/probes/block_profile.py)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    from h3plan.actions.bench import build_model, packed_inputs

    dist.init_process_group("nccl")
    rank, U = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    recipes = args.recipes.split(",")
    dc = _plan("bf16", 1, 19000).get("model")["diffusers_config"]
    base = build_model(dc, blocks=args.blocks, device="cuda", dtype="bf16", seed=0)
    doc = {"gpus": U, "blocks": args.blocks, "rounds": args.rounds, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "records": [], "times": {}, "notes": {}}
    for S in (int(s) for s in args.seq_lens.split(",")):
        models, notes = _settings(base, S, U, group, recipes, not args.no_compile_plans, args.ring, args.exchange_arm)
        x = packed_inputs(dc, S, seed=1234, device="cuda")
        fns, outs = {}, {}
        with torch.no_grad():
            for k, m in models.items():
                try:
                    outs[k] = m(**x).sample  # also the compile warm-up
                    fns[k] = (lambda m=m: m(**x).sample)
                except Exception as e:  # noqa: BLE001
                    notes[k] = "RUN FAILED: " + "".join(traceback.format_exception_only(e)).strip()[:300]
            t = _time(fns, args.rounds, args.warmup, dist.barrier)
        doc["times"][S], doc["notes"][S] = t, notes
        if args.profile:
            sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))
            from block_profile import profiled_call

            for k in [k for k in fns if k.startswith("plan_") and not k.endswith("+compile")]:
                dist.barrier()
                doc.setdefault("profile", {}).setdefault(str(S), {})[k] = prof = profiled_call(fns[k])
                if rank == 0:
                    print(f"profile S={S} {k}: busy {prof['busy_ms']:.2f} ms, span {prof['span_ms']:.2f} ms; "
                          + ", ".join(f"{c} {v:.2f}" for c, v in prof["by_category_ms"].items()), flush=True)
        for r in recipes:
            c, p = f"plan_u1_{r}+compile", f"plan_u1_{r}"
            if c in t and p in t:
                a, b = outs[c], outs[p]
                doc.setdefault("compile", []).append({"recipe": r, "S": S, "plan_ms": round(t[p], 3),
                                                      "compiled_ms": round(t[c], 3), "speedup": round(t[p] / t[c], 3),
                                                      "bitwise": bool(torch.equal(a, b)),
                                                      "rel": float((a.float() - b.float()).norm() / b.float().norm())})
        cp = t.get("diffusers_cp")
        for r in recipes:
            one = t.get(f"plan_u1_{r}")
            for name in (f"plan_u{U}_{r}", *(f"plan_u{U}_{r}{a}" for a in ARMS),
                         f"plan_r{args.ring}u{U // args.ring}_{r}"):
                if name not in t:
                    continue
                a, b = outs[name], outs[f"plan_u1_{r}"] if f"plan_u1_{r}" in outs else None
                label = name.split("_")[1] + next((a for a in ARMS if name.endswith(a)), "")
                rec = {"gpus": U, "S": S, "plan": f"sm90/{r}/{label}",
                       "exchange": None if U == 1 else _exchange(name, r, U, S),
                       "plan_ms": round(t[name], 3), "plan_u1_ms": one and round(one, 3),
                       "eager_1gpu_ms": round(t["eager_1gpu"], 3), "diffusers_cp_ms": cp and round(cp, 3),
                       "diffusers_cp_config": CP_CONFIG.format(U=U) + (" with ulysses_anything=True" if S % U else ""),
                       "scaling_vs_u1": one and round(one / t[name], 3),
                       "speedup_vs_diffusers_cp": cp and round(cp / t[name], 3),
                       "speedup_vs_eager_1gpu": round(t["eager_1gpu"] / t[name], 3),
                       "bitwise_vs_u1": b is not None and bool(torch.equal(a, b)),
                       "rel_vs_u1": None if b is None else float((a.float() - b.float()).norm() / b.float().norm())}
                doc["records"].append(rec)
                if rank == 0:
                    print(json.dumps(rec), flush=True)
        del models, fns, outs
        torch.cuda.empty_cache()
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"parallel-{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / f"parallel-{args.tag}.md").write_text(markdown(doc))
        print(markdown(doc))
    dist.destroy_process_group()
    return 0


def markdown(doc) -> str:
    lines = [f"# Ulysses plans vs diffusers' context parallel ({doc['gpus']} x {doc['device']}, {doc['blocks']} "
             f"real-width blocks, median of {doc['rounds']} interleaved rounds)", "",
             "| S | plan | exchange | plan ms | plan u1 ms | diffusers CP ms | eager 1 GPU ms | scaling vs u1 | vs "
             "diffusers CP | vs eager 1 GPU | bitwise vs u1 |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["records"]:
        f = (lambda v, d=1: "n/a" if v is None else f"{v:.{d}f}")
        lines.append(f"| {r['S']:,} | {r['plan']} | {r.get('exchange') or 'n/a'} | {f(r['plan_ms'])} | "
                     f"{f(r['plan_u1_ms'])} | {f(r['diffusers_cp_ms'])} | {f(r['eager_1gpu_ms'])} | "
                     f"{f(r['scaling_vs_u1'], 2)}x | {f(r['speedup_vs_diffusers_cp'], 2)}x | "
                     f"{f(r['speedup_vs_eager_1gpu'], 2)}x | "
                     f"{'yes' if r['bitwise_vs_u1'] else 'no (rel %.1e)' % (r['rel_vs_u1'] or 0)} |")
    lines += ["", f"diffusers CP: {CP_CONFIG.format(U=doc['gpus'])}.", ""]
    if any(r["plan_u1_ms"] and not r["bitwise_vs_u1"] for r in doc["records"]
           if not r["plan"].split("/")[-1].startswith("r")):
        lines += ["A Ulysses row that is not bitwise vs u1 here has a degree-1 plan that compiles (the `compile` "
                  "lever: regional where measured faster); degree > 1 never compiles, and compiled blocks round their "
                  "own way. With the same compile setting the degrees agree bit for bit "
                  "(tests/gpu/test_install_ulysses_nccl.py).", ""]
    if doc.get("compile"):
        lines += ["Regional compile over the installed degree-1 plan (the `compile` lever's evidence):", "",
                  "| recipe | S | plan ms | compiled ms | plain / compiled | bitwise |",
                  "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {c.get('recipe', 'bf16')} | {c['S']:,} | {c['plan_ms']:.1f} | {c['compiled_ms']:.1f} | "
                  f"{c['speedup']:.3f}x | {'yes' if c['bitwise'] else 'no (rel %.1e)' % c['rel']} |"
                  for c in doc["compile"]]
        lines.append("")
    for S, notes in doc["notes"].items():
        bad = {k: v for k, v in notes.items() if "FAIL" in v}
        if bad:
            lines.append(f"- S={S}: " + "; ".join(f"{k}: {v}" for k, v in bad.items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""Peak GPU memory of diffusers' MiniMaxH3ModularPipeline under h3plan plans, with and without adaln_table, against
h3plan.planning.memory's estimate, and the 80 GB fit under a per-process cap (one GPU).

    . /tmp/h3site/env.sh && python benchmarks/memory.py --steps 3 --out benchmarks/results --tag h200

Per recipe (bf16, fp8), on one pipeline at real width (seeded weights, benchmarks' usual build):
- tables off / on: `h3plan.install(pipe, plan)`, diffusers' denoise step (run_block "denoise") for `--steps`
  (num_inference_steps; steps - 1 forwards), torch.cuda.max_memory_allocated over the call, wall time, the
  adaln_table counters, latents bitwise against the tables-off row; `--decode all` adds the decode (frames too);
- cap: the tables-on plan resolved for `hardware.device.memory_gb=<cap>` (the planner's fit check), the whole
  `pipe(...)` (denoise + decode, output_type="pt") under torch.cuda.set_per_process_memory_fraction(cap GB /
  the device's memory): passed or the OOM text.
Rows go to <out>/memory-<tag>.json and .md: plan, estimate (the plan's peak and the phase estimate of what ran),
measured peak, time, counters, cap run. Cheap by default: 3 steps (2 forwards) per row, one decode per recipe.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GiB = 2**30


def _plan(recipe, steps, tables, gb=None, extra=()):
    import h3plan

    kw = {"hardware": "sm90", "recipe": recipe, "parallel": "u1", "video": "t2v_768x1344_5s",
          "pipeline.num_inference_steps": steps, "levers.adaln_table": tables}
    if gb is not None:
        kw["hardware.device.memory_gb"] = gb
    kw.update(dict(extra))
    return h3plan.resolve_config(**kw)


def _estimate(plan, phase):
    from h3plan.planning import memory

    sections = {k: plan.get(k) for k in ("model", "vae", "recipe", "hardware", "video", "pipeline", "memory", "parallel")}
    shape = {k: plan.derived_value(k) for k in ("seq_len", "ulysses_degree", "batch", "local_rows")}
    e = memory.estimate(sections, shape, {d.lever: d.setting for d in plan.decisions})
    return e["peak_gib"], e["phases"][phase]["gib"]


def _run(torch, pipe, plan, args, prompt, *, decode):
    import h3plan
    from h3plan.actions.pipeline_build import run_block
    from h3plan.runtime.counters import counters, reset_counters

    h, w, f = args.video
    h3plan.install(pipe, plan)
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        reset_counters()
        t0 = time.perf_counter()
        gen = torch.Generator("cpu").manual_seed(0)
        if decode:
            frames = pipe(**prompt, height=h, width=w, num_frames=f, num_inference_steps=args.steps, generator=gen,
                          output_type="pt", output="videos")
            latents = None
        else:
            st = run_block(pipe, "denoise", **prompt, height=h, width=w, num_frames=f, num_inference_steps=args.steps,
                           generator=gen)
            latents, frames = st.get("latents"), None
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        c = {k: v for k, v in counters().items() if k.startswith("adaln_table")}
        return {"seconds": round(seconds, 3), "peak_gib": round(torch.cuda.max_memory_allocated() / GiB, 3),
                "reserved_gib": round(torch.cuda.max_memory_reserved() / GiB, 3), "counters": c,
                "latents": None if latents is None else latents.cpu(), "frames": None if frames is None else frames.cpu()}
    finally:
        h3plan.uninstall(pipe)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--steps", type=int, default=3, help="num_inference_steps of every call (steps - 1 forwards)")
    ap.add_argument("--video", default="768x1344x124", type=lambda s: tuple(int(x) for x in s.split("x")))
    ap.add_argument("--layers", type=int, default=None, help="transformer layers (default: all 50)")
    ap.add_argument("--text-tokens", type=int, default=110)
    ap.add_argument("--cap-gb", type=float, default=80.0, help="per-process cap in vendor GB (1e9 bytes)")
    ap.add_argument("--decode", choices=("cap", "all", "none"), default="cap")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="h200")
    args = ap.parse_args(argv)

    import torch
    from omegaconf import OmegaConf

    from h3plan.actions.pipeline_build import build_pipeline, prompt_inputs
    from h3plan.planning.config import compose

    c = compose([])
    pipe = build_pipeline(OmegaConf.to_container(c.model.diffusers_config), OmegaConf.to_container(c.vae.diffusers_config),
                          layers=args.layers, device="cuda")
    prompt = prompt_inputs(pipe, args.text_tokens)
    total = torch.cuda.get_device_properties(0).total_memory
    rows = []
    for recipe in args.recipes:
        ref = None
        for tables in ("off", "on"):
            plan = _plan(recipe, args.steps, tables)
            decode = args.decode == "all"
            row = {"recipe": recipe, "adaln_table": tables, "cap_gb": None, "steps": args.steps, "decode": decode,
                   "estimate_peak_gib": plan.derived_value("memory_peak_gib_per_gpu"),
                   "estimate_phase_gib": _estimate(plan, "decode" if decode else "denoise")[1]}
            try:
                r = _run(torch, pipe, plan, args, prompt, decode=decode)
                out = r.pop("latents") if r["latents"] is not None else r.pop("frames")
                r.pop("latents", None), r.pop("frames", None)
                row.update(r)
                if tables == "off":
                    ref = out
                else:
                    row["bitwise_vs_tables_off"] = bool(ref is not None and torch.equal(out, ref))
                row["estimate_ratio"] = round(row["estimate_phase_gib"] / row["peak_gib"], 3)
            except Exception as e:  # noqa: BLE001 - recorded; the other rows still run
                row["error"] = "".join(traceback.format_exception_only(e)).strip()[:400]
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.decode == "none":
            continue
        row = {"recipe": recipe, "adaln_table": "on", "cap_gb": args.cap_gb, "steps": args.steps, "decode": True}
        try:
            plan = _plan(recipe, args.steps, "on", gb=args.cap_gb)
            row.update(estimate_peak_gib=plan.derived_value("memory_peak_gib_per_gpu"),
                       estimate_phase_gib=max(_estimate(plan, p)[1] for p in ("denoise", "decode")))
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * 1e9 / total))
            r = _run(torch, pipe, plan, args, prompt, decode=True)
            r.pop("latents"), r.pop("frames")
            row.update(r, cap_passed=True, estimate_ratio=round(row["estimate_phase_gib"] / r["peak_gib"], 3))
        except Exception as e:  # noqa: BLE001 - an OOM under the cap is the result
            row.update(cap_passed=False, error="".join(traceback.format_exception_only(e)).strip()[:400])
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0), "total_gib": round(total / GiB, 2), "video": "x".join(map(str, args.video)),
            "layers": args.layers or 50, "text_tokens": args.text_tokens, "script": "benchmarks/memory.py"}
    (out / f"memory-{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"# Peak memory of pipe(...) per plan ({meta['device']}, {meta['video']}, {meta['layers']} layers, {args.steps} steps)", "",
             "| recipe | adaln_table | cap | what ran | estimate (plan peak / phase) GiB | measured peak GiB | ratio | time s | "
             "adaln_table counters | bitwise vs tables off | cap run |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r['adaln_table']} | {r['cap_gb'] or '-'} | {'pipe(...)' if r['decode'] else 'denoise'} | "
                     f"{r.get('estimate_peak_gib', '-')} / {r.get('estimate_phase_gib', '-')} | {r.get('peak_gib', '-')} | "
                     f"{r.get('estimate_ratio', '-')} | {r.get('seconds', '-')} | {r.get('counters', '-')} | "
                     f"{r.get('bitwise_vs_tables_off', '-')} | {r.get('cap_passed', '-') if r['cap_gb'] else '-'} "
                     f"{('(' + r['error'][:120] + ')') if r.get('error') else ''}|")
    (out / f"memory-{args.tag}.md").write_text("\n".join(lines) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

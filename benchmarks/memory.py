"""Peak GPU memory of diffusers' MiniMaxH3ModularPipeline under h3plan plans, with and without adaln_table, against
h3plan.planning.memory's estimate, and the 80 GB fit under a per-process cap (one GPU).

    . /tmp/h3site/env.sh && python benchmarks/memory.py --steps 3 --decode all --out benchmarks/results --tag h200

Per recipe (bf16, fp8), on one pipeline at real width (seeded weights, benchmarks' usual build):
- tables off / on: `h3plan.install(pipe, plan)`, diffusers' denoise step (run_block "denoise") for `--steps`
  (num_inference_steps; steps - 1 forwards), torch.cuda.max_memory_allocated over the call, wall time, the
  adaln_table counters, latents bitwise against the tables-off row; `--decode all` adds the decode (frames too);
- cap: the tables-on plan resolved for `hardware.device.memory_gb=<cap>` (the planner's fit check), then the whole
  `pipe(...)` (denoise + decode, output_type="pt") in a fresh process, as an 80 GB card runs it: the pipeline rests
  on the host (as diffusers' from_pretrained loads it; an 80 GB card cannot hold it as loaded, 72.7 GiB of 74.5),
  and `h3plan.install(pipe, plan, device="cuda")` moves it to the device at install, a tensor at a time (the AdaLN
  linears only streamed, then parked in pinned host memory). The child builds the pipeline exactly as the rows
  above do (on the device, uncapped: the same CUDA-seeded weights, so the frames compare bitwise), moves every
  component to the host, empties the device (nothing allocated, the cache released), and only then holds itself
  to torch.cuda.set_per_process_memory_fraction(cap GB / the device's memory) for the install and the call:
  passed or the OOM text, the install's device peak against the plan's, frames bitwise against the tables-off
  row with `--decode all`.
The resting memory before install, after install, the denoise peak and the whole call's peak are recorded per row;
the transformer forwards are timed by CUDA events (a warm-up call per recipe first).
Rows go to <out>/memory-<tag>.json and .md: plan, estimate (the plan's peak and the phase estimate of what ran),
measured peak, time, counters, cap run. Cheap by default: 3 steps (2 forwards) per row, one decode per recipe.

The cap rows with their tables-off references only (about 7 minutes on one H200; one recipe about 4):

    python benchmarks/memory.py --steps 3 --decode all --cap-references --no-warmup --out benchmarks/results/logs --tag h200-cap-run

Another workflow and the text encoder: `--workflow ref2va` (the ref2va_768x1344_5s plan, one seeded image
reference, the transformer_ref partition; fl2va: the first and last keyframe) and `--text-encoder host` (the plan's
memory.text_encoder; the call is pipe(prompt="...") through diffusers' text encoder step and the seeded Qwen3-VL at
the packaged widths, actions/text_encoder_build.py, placed by install: install/text_encoder.py). Either runs the whole
call (--decode all, or --cap-only). `--cap-only`: the cap rows alone, no uncapped rows. The 80 GB run of t2va and
ref2va with the text encoder on the host (one cap row each, bf16; about 4-5 minutes each):

    python benchmarks/memory.py --recipes bf16 --cap-only --workflow ref2va --text-encoder host --out benchmarks/results --tag h200-cap-ref2va

`--text-encoder-weight-sets N`: the seeded conditioner keeps its 64 decoder layers at their widths, sharing N layers'
weights (text_encoder_build.share_decoder_weights), for a host with less memory than the whole seeded pipeline
resting on it (the one-GPU H200 machine: 128 GiB, against 62 + 62 + 9.7 GiB). At memory.text_encoder=host the device
holds one layer at a time either way, and diffusers' hidden_states[50] still exists (a conditioner cut to fewer than
51 layers is refused by diffusers' text step).
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GiB = 2**30


VIDEOS = {"t2va": {"video": "t2v_768x1344_5s"}, "ref2va": {"video": "ref2va_768x1344_5s"},
          # the plans' requests
          "fl2va": {"video": "t2v_768x1344_5s", "video.task": "fl2va", "video.keyframes": ["first", "last"]}}
WORKFLOW = {"workflow": "t2va", "text_encoder": "none"}  # main() sets them from --workflow / --text-encoder


def _plan(recipe, steps, tables, gb=None, extra=()):
    import h3plan
    from h3plan.actions.bench import roles

    kw = {"hardware": "sm90", "recipe": recipe, "parallel": "u1", **VIDEOS[WORKFLOW["workflow"]],
          "pipeline.num_inference_steps": steps, f"levers.{roles.ADALN_TABLES}": tables}
    if WORKFLOW["text_encoder"] != "none":
        kw["memory.text_encoder"] = WORKFLOW["text_encoder"]
    if gb is not None:
        kw["hardware.device.memory_gb"] = gb
    kw.update(dict(extra))
    return h3plan.resolve_config(**kw)


def _build(c, args, device="cuda"):
    """(pipe, prompt, media): the t2va denoise + decode pipeline with seeded prompt_embeds, or, for another workflow
    or with the text encoder, diffusers' auto blocks (with its text encoder step and a prompt string)."""
    from h3plan.actions.bench import (build_pipeline, placed_text_encoder, prompt_inputs, prompt_text, workflow_blocks,
                                      workflow_inputs)

    te, wf = WORKFLOW["text_encoder"] != "none", WORKFLOW["workflow"]
    if not te and wf == "t2va":
        pipe = build_pipeline(c["model"]["diffusers_config"], c["vae"]["diffusers_config"], layers=args.layers,
                              device=device)
        return pipe, prompt_inputs(pipe, args.text_tokens), {}
    # the conditioner is built first on the device and placed on the host (build_pipeline: 62 GiB of it beside the
    # transformer's float32 staging does not fit an H200), then unplaced: install places it by the plan
    pipe = build_pipeline(c["model"]["diffusers_config"], c["vae"]["diffusers_config"], vae_name=c["vae"]["name"],
                          layers=args.layers, device=device, blocks=workflow_blocks(text_encoder=te),
                          partitions=("transformer_ref",) if wf == "ref2va" else ("transformer",),
                          text_encoder=c["model"]["text_encoder_default"] if te else None,
                          text_encoder_placement="host" if te else None,
                          text_encoder_weight_sets=args.text_encoder_weight_sets)
    if te:
        placed_text_encoder(pipe.text_encoder).restore()
    h, w, _ = args.video
    prompt = {"prompt": prompt_text(args.text_tokens)} if te else prompt_inputs(pipe, args.text_tokens)
    return pipe, prompt, workflow_inputs(pipe, wf, h, w, seed=0, keyframes=("first", "last"))


def _estimate(plan, phase):
    from h3plan.actions.bench.ops import memory

    sections = {k: plan.get(k) for k in ("model", "vae", "recipe", "hardware", "video", "pipeline",
                                         "memory", "parallel")}
    shape = {k: plan.derived_value(k) for k in ("seq_len", "ulysses_degree", "batch", "local_rows")}
    e = memory.estimate(sections, shape, {d.lever: d.setting for d in plan.decisions})
    return e["peak_gib"], e["phases"][phase]["gib"]


def _phase_estimate(plan, decode):
    """The estimate of what ran: the denoise phase, or the whole call's peak (the largest phase) with the decode."""
    phases = ((("denoise", "decode") if decode else ("denoise",))
              + (("encode",) if WORKFLOW["text_encoder"] != "none" else ()))
    return max(_estimate(plan, p)[1] for p in phases)


def _run(torch, pipe, plan, args, prompt, *, decode, cap=None, keep=False, device=None, media=None):
    """One call under `plan`. cap: a per-process memory fraction held from before install until after the call;
    it is lifted before uninstall, which puts the parked weights back (a state only the bench returns to). keep:
    leave the plan installed (a child that exits after its one call). device: install(pipe, plan, device=) of a
    pipeline resting on the host."""
    import h3plan
    from h3plan.actions.bench import Clock, ForwardTimer, roles
    from h3plan.actions.bench import run_block
    from h3plan import counters, reset_counters

    h, w, f = args.video
    if cap is not None:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap)
    resting = torch.cuda.memory_allocated() / GiB
    denoise_peak, host = [0.0], Clock(torch, torch.device("cpu"))  # host: the wall clock around install and the call
    try:
        torch.cuda.reset_peak_memory_stats()
        install_ms, _ = host.timed(lambda: (h3plan.install(pipe, plan, device=device), torch.cuda.synchronize()))
        install_s, install_peak = install_ms / 1e3, torch.cuda.max_memory_allocated() / GiB
        from h3plan.actions.bench import denoiser

        t, fwd_timer = denoiser(pipe, WORKFLOW["workflow"]), ForwardTimer(torch, True)
        fwd_timer.on = True

        def post(*a):
            fwd_timer.post(*a)
            denoise_peak[0] = torch.cuda.max_memory_allocated() / GiB

        handles = [t.register_forward_pre_hook(fwd_timer.pre), t.register_forward_hook(post)]
        try:
            torch.cuda.synchronize()
            installed = torch.cuda.memory_allocated() / GiB
            torch.cuda.reset_peak_memory_stats()
            reset_counters()

            def call():
                gen = torch.Generator("cpu").manual_seed(0)
                if decode:
                    return None, pipe(**prompt, **(media or {}), height=h, width=w, num_frames=f,
                                      num_inference_steps=args.steps,
                                      generator=gen, output_type="pt", output="videos")
                st = run_block(pipe, "denoise", **prompt, height=h, width=w, num_frames=f,
                               num_inference_steps=args.steps, generator=gen)
                return st.get("latents"), None

            ms, (latents, frames) = host.timed(lambda: (call(), torch.cuda.synchronize())[0])
            seconds = ms / 1e3
        finally:
            for hd in handles:
                hd.remove()
        c = {k: v for k, v in counters().items() if k.startswith(roles.counter(roles.ADALN_TABLES))}
        fwd = fwd_timer.seconds()
        return {"seconds": round(seconds, 3), "forward_s": [round(x, 4) for x in fwd],
                "resting_gib": round(resting, 3), "installed_gib": round(installed, 3),
                "install_peak_gib": round(install_peak, 3), "install_s": round(install_s, 2),
                "denoise_peak_gib": round(denoise_peak[0], 3),
                "peak_gib": round(torch.cuda.max_memory_allocated() / GiB, 3),
                "reserved_gib": round(torch.cuda.max_memory_reserved() / GiB, 3), "counters": c,
                "latents": None if latents is None else latents.cpu(),
                "frames": None if frames is None else frames.cpu()}
    finally:
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
        if not keep:
            h3plan.uninstall(pipe)
            torch.cuda.empty_cache()


def _cap_row(args, recipe, frames_path: Path):
    """The tables-on plan resolved for hardware.device.memory_gb=cap (the planner's fit check), then the whole
    pipe(...) in a child process (module docstring: the pipeline on the host, the cap from before install, nothing
    else on the device): passed, or the OOM text; its frames go to frames_path."""
    import subprocess

    from h3plan.actions.bench import roles

    row = {"recipe": recipe, roles.ADALN_TABLES: "on", "cap_gb": args.cap_gb, "steps": args.steps, "decode": True}
    try:
        plan = _plan(recipe, args.steps, "on", gb=args.cap_gb)
        row.update(estimate_peak_gib=plan.derived_value("memory_peak_gib_per_gpu"),
                   estimate_phase_gib=_phase_estimate(plan, True),
                   estimate_install_gib=plan.derived_value("memory_install_gib"))
    except Exception as e:  # noqa: BLE001 - the planner's refusal is the result
        return {**row, "cap_passed": False, "error": "".join(traceback.format_exception_only(e)).strip()[:400]}
    if args.text_encoder_weight_sets is not None:
        row["text_encoder_weight_sets"] = args.text_encoder_weight_sets
    proc = subprocess.run([sys.executable, __file__, *_child_argv(args, recipe, frames_path)],
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = [ln for ln in proc.stderr.strip().splitlines()
                if "Error" in ln] or proc.stderr.strip().splitlines() or ["no output"]
        return {**row, "cap_passed": False, "error": tail[-1][:400]}
    r = json.loads(lines[-1])
    return {**row, **r, "cap_passed": True, "estimate_ratio": round(row["estimate_phase_gib"] / r["peak_gib"], 3)}


def _child_argv(args, recipe, frames_path) -> list[str]:
    """The arguments of the cap row's child process: one capped call of `recipe`, the parent's request."""
    argv = ["--cap-child", recipe, "--steps", str(args.steps), "--video", "x".join(map(str, args.video)),
            "--text-tokens", str(args.text_tokens), "--cap-gb", str(args.cap_gb), "--frames-out", str(frames_path),
            "--workflow", WORKFLOW["workflow"], "--text-encoder", WORKFLOW["text_encoder"]]
    if args.layers:
        argv += ["--layers", str(args.layers)]
    if args.text_encoder_weight_sets is not None:
        argv += ["--text-encoder-weight-sets", str(args.text_encoder_weight_sets)]
    return argv


def _cap_child(args) -> int:
    import torch

    from h3plan.actions.bench import configured

    c = configured([])[0]
    # the rows' own build (CUDA-seeded weights: the frames compare bitwise), uncapped; then the pipeline rests on the
    # host as from_pretrained loads it, and the device holds nothing but the prompt (1 MB) when the cap begins
    pipe, prompt, media = _build(c, args)
    for name in ("transformer", "transformer_ref", "vae", "audio_vae", "text_encoder"):
        comp = getattr(pipe, name, None) if name in pipe.component_names else None
        if comp is not None:
            comp.to("cpu")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    plan = _plan(args.cap_child, args.steps, "on", gb=args.cap_gb)
    cap = min(1.0, args.cap_gb * 1e9 / torch.cuda.get_device_properties(0).total_memory)
    reserved = torch.cuda.memory_reserved() / GiB
    r = _run(torch, pipe, plan, args, prompt, decode=True, cap=cap, keep=True, device="cuda", media=media)
    r["reserved_before_install_gib"] = round(reserved, 3)
    r.pop("latents")
    torch.save(r.pop("frames"), args.frames_out)
    print(json.dumps(r), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--steps", type=int, default=3, help="num_inference_steps of every call (steps - 1 forwards)")
    ap.add_argument("--video", default="768x1344x124", type=lambda s: tuple(int(x) for x in s.split("x")))
    ap.add_argument("--layers", type=int, default=None, help="transformer layers (default: all 50)")
    ap.add_argument("--text-tokens", type=int, default=110)
    ap.add_argument("--cap-gb", type=float, default=80.0, help="per-process cap in vendor GB (1e9 bytes)")
    ap.add_argument("--decode", choices=("cap", "all", "none"), default="cap")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="one denoise call per recipe (tables off, 2 steps) before the rows")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--cap-references", action="store_true",
                    help="after the cap runs, only the tables-off rows (the frames the cap runs are checked against)")
    ap.add_argument("--workflow", choices=("t2va", "fl2va", "ref2va"), default="t2va",
                    help="the request (the plan's video preset, VIDEOS) and its seeded media")
    ap.add_argument("--text-encoder", choices=("none", "resident", "offload_after", "host"), default="none",
                    help="the plan's memory.text_encoder: the call runs the prompt through the seeded Qwen3-VL")
    ap.add_argument("--text-encoder-weight-sets", type=int, default=None, metavar="N",
                    help="the seeded conditioner's decoder layers share N layers' weights (default: every layer its "
                         "own): a host smaller than the whole pipeline resting on it; the rows record N")
    ap.add_argument("--cap-only", action="store_true", help="the cap rows alone (no uncapped rows)")
    ap.add_argument("--cap-child", metavar="RECIPE", help=argparse.SUPPRESS)  # one capped call in a fresh process
    ap.add_argument("--frames-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    WORKFLOW.update(workflow=args.workflow, text_encoder=args.text_encoder)
    if args.cap_child:  # the cap row's one call: always the whole pipe(...)
        return _cap_child(args)
    if (args.workflow != "t2va" or args.text_encoder != "none") and args.decode != "all" and not args.cap_only:
        ap.error("--workflow other than t2va and --text-encoder run the whole call: add --decode all or --cap-only")

    import torch

    from h3plan.actions.bench import configured, roles

    import tempfile

    total = torch.cuda.get_device_properties(0).total_memory
    meta = {"device": torch.cuda.get_device_name(0), "total_gib": round(total / GiB, 2),
            "video": "x".join(map(str, args.video)),
            "layers": args.layers or 50, "text_tokens": args.text_tokens, "steps": args.steps,
            "script": "benchmarks/memory.py",
            "workflow": args.workflow, "text_encoder": args.text_encoder,
            **({"text_encoder_weight_sets": args.text_encoder_weight_sets}
               if args.text_encoder_weight_sets is not None else {})}
    tmp = Path(tempfile.mkdtemp())
    caps = {}
    # each cap run first, in a fresh process, as a user's 80 GB card starts (nothing else on it)
    if args.decode != "none":
        for recipe in args.recipes:
            caps[recipe] = _cap_row(args, recipe, tmp / f"{recipe}.pt")
            print(json.dumps(caps[recipe]), flush=True)
    if args.cap_only:
        rows = list(caps.values())
        _write(args, meta, rows)
        return 0 if all(r.get("cap_passed") for r in rows) else 1
    c = configured([])[0]
    pipe, prompt, media = _build(c, args)
    # the first call compiles and autotunes; every row after it runs warm
    if args.warmup and WORKFLOW == {"workflow": "t2va", "text_encoder": "none"}:
        h, w, f = args.video
        from h3plan.actions.bench import run_block
        import h3plan
        for recipe in args.recipes:
            h3plan.install(pipe, _plan(recipe, 2, "off"))
            run_block(pipe, "denoise", **prompt, height=h, width=w, num_frames=f, num_inference_steps=2,
                      generator=torch.Generator("cpu").manual_seed(0))
            h3plan.uninstall(pipe)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    rows = []
    refs = {}
    for recipe in args.recipes:
        ref = None
        for tables in ("off",) if args.cap_references else ("off", "on"):
            plan = _plan(recipe, args.steps, tables)
            decode = args.decode == "all"
            row = {"recipe": recipe, roles.ADALN_TABLES: tables, "cap_gb": None, "steps": args.steps, "decode": decode,
                   "estimate_peak_gib": plan.derived_value("memory_peak_gib_per_gpu"),
                   "estimate_phase_gib": _phase_estimate(plan, decode)}
            try:
                r = _run(torch, pipe, plan, args, prompt, decode=decode, media=media)
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
            _write(args, meta, rows)
        refs[recipe] = ref
    for recipe, row in caps.items():
        f = tmp / f"{recipe}.pt"
        if args.decode == "all" and refs.get(recipe) is not None and f.exists():  # against the tables-off row's frames
            row["bitwise_vs_tables_off"] = bool(torch.equal(torch.load(f), refs[recipe]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    _write(args, meta, rows)
    return 0 if all("error" not in r for r in rows) else 1


def _conditioner_line(meta) -> list[str]:
    if meta.get("text_encoder", "none") == "none":
        return []
    n = meta.get("text_encoder_weight_sets")
    shared = (f", its decoder layers sharing {n} layers' weights (--text-encoder-weight-sets: what the host holds; "
              "at memory.text_encoder=host the device holds one layer at a time at the real width either way)"
              if n else "")
    return [f"Workflow {meta['workflow']}: pipe(prompt=...) through the seeded Qwen3-VL at memory.text_encoder="
            f"{meta['text_encoder']}{shared}.", ""]


def _write(args, meta, rows):
    """<out>/memory-<tag>.json and .md, rewritten after every row (a run cut short keeps its rows)."""
    from h3plan.actions.bench import roles

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"memory-{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"# Peak memory of pipe(...) per plan ({meta['device']}, {meta['video']}, {meta['layers']} layers, "
             f"{args.steps} steps)", "",
             "Ratio: the estimate of what ran over the measured peak (torch.cuda.max_memory_allocated over the call). "
             "Forwards: the transformer forwards by CUDA events.", "", *_conditioner_line(meta),
             "| recipe | adaln_table | cap | what ran | estimate (plan peak / phase) GiB | resting / installed GiB | "
             "install peak GiB (estimate) | denoise peak GiB | measured peak GiB | ratio | time s | forwards s | "
             "adaln_table counters | bitwise vs tables off | cap run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r[roles.ADALN_TABLES]} | {r['cap_gb'] or '-'} | "
                     f"{'pipe(...)' if r['decode'] else 'denoise'} | {r.get('estimate_peak_gib', '-')} / "
                     f"{r.get('estimate_phase_gib', '-')} | {r.get('resting_gib', '-')} / "
                     f"{r.get('installed_gib', '-')} | {r.get('install_peak_gib', '-')} "
                     f"({r.get('estimate_install_gib', '-')}) | {r.get('denoise_peak_gib', '-')} | "
                     f"{r.get('peak_gib', '-')} | {r.get('estimate_ratio', '-')} | {r.get('seconds', '-')} | "
                     f"{round(sum(r.get('forward_s') or [0]), 3)} | {r.get('counters', '-')} | "
                     f"{r.get('bitwise_vs_tables_off', '-')} | {r.get('cap_passed', '-') if r['cap_gb'] else '-'} "
                     f"{('(' + r['error'][:120] + ')') if r.get('error') else ''}|")
    (out / f"memory-{args.tag}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())

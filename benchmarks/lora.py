"""A LoRA shaped like the published Turbo adapter, with the bf16 and fp8 plans installed, on one GPU.

    python benchmarks/lora.py --out benchmarks/results --tag h200          # 512x896x124, 8 layers, 3 timed forwards
    python benchmarks/lora.py model=h3_tiny vae=h3_tiny_pipe --video 32x32x124 --layers 2 --out /tmp/r   # CPU smoke

The seeded pipeline (--layers blocks) takes seeded LoRAs of the lightx2v Turbo shape (h3plan/facts/lora.py TURBO)
through `pipe.load_lora_weights`; each row runs diffusers' denoise step (`run_block(pipe, "denoise")`: the pipeline
less its decode, which no LoRA reaches; diffusers' way to keep the latents), 1 warm-up + --steps forwards, each timed.
Rows (plans from the positional overrides, + recipe=fp8): bf16 plan without LoRA; with LoRA a loaded after install
(load timed; then b loaded and set_adapters between them timed, median of 5); `reference`: diffusers' eager blocks
with the plan's attention backend and LoRA a (bitwise expected); diffusers eager with LoRA a; fp8 plan without LoRA
(LoRA a after install: its refusal recorded); fp8 with LoRA a the way the refusal names (uninstall, load + fuse +
unload, install: timed); diffusers eager on the same fused weights. Writes <out>/lora-<tag>.json (appends) and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's h3plan
PAIRS = [("bf16 + lora a", "reference + lora a"), ("bf16 + lora a", "eager + lora a"), ("bf16 + lora a", "bf16"),
         ("fp8 + lora a fused", "eager + lora a fused"), ("fp8 + lora a fused", "fp8")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of both plans, e.g. hardware=sm90")
    ap.add_argument("--video", default="512x896x124", help="HEIGHTxWIDTHxFRAMES")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="timed forwards per call (after one warm-up)")
    ap.add_argument("--text-tokens", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default=None)
    a = ap.parse_args(argv)

    import torch

    import h3plan
    from h3plan.actions.bench import (LORA_SHAPES, Clock, ForwardTimer, build_pipeline, configured, denoiser,
                                      device_tag, prompt_inputs, run_block, same_backend_plan, seeded_lora)

    from h3plan.actions.bench.harness import CPU_MAX_HIDDEN

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (cfg, bf16), (_, fp8) = configured(a.overrides), configured(a.overrides + ["recipe=fp8"])
    if dev.type == "cpu" and cfg["model"]["diffusers_config"]["hidden_size"] > CPU_MAX_HIDDEN:
        print("lora.py: error: real widths need a CUDA GPU; on the CPU: model=h3_tiny vae=h3_tiny_pipe",
              file=sys.stderr)
        return 2
    pipe = build_pipeline(cfg["model"]["diffusers_config"], cfg["vae"]["diffusers_config"], vae_name=cfg["vae"]["name"],
                          layers=a.layers, device=dev, dtype="bf16", seed=0)
    t, (h, w, f), n = denoiser(pipe), (int(v) for v in a.video.split("x")), a.steps + 2  # + warm-up + terminal sigma
    x = {**prompt_inputs(pipe, a.text_tokens), "height": h, "width": w, "num_frames": f}
    timer, host, rows, out = ForwardTimer(torch, dev.type == "cuda"), Clock(torch, torch.device("cpu")), [], {}
    t.register_forward_pre_hook(timer.pre)
    t.register_forward_hook(timer.post)
    lora = {k: seeded_lora(t, LORA_SHAPES["turbo"], seed=s) for k, s in (("turbo_a", 1), ("turbo_b", 2))}

    def timed(fn) -> float:
        return host.timed(lambda: (timer.sync(), fn(), timer.sync()))[0] / 1e3

    def call(name, **extra):
        timer.spans, timer.on = [], True
        st = run_block(pipe, "denoise", **x, num_inference_steps=n, generator=torch.Generator("cpu").manual_seed(0))
        timer.on, secs = False, timer.seconds()[1:]
        out[name] = (st.get("latents"), st.get("audio_latents"))
        rows.append({"row": name, "forward_s": statistics.median(secs), "forwards_s": secs,
                     "counters": dict(h3plan.counters()), **extra})
        h3plan.reset_counters()
        print(f"{name}: forward {rows[-1]['forward_s']:.4f} s", flush=True)

    def fused_fp8():
        h3plan.uninstall(pipe)
        pipe.load_lora_weights(lora["turbo_a"], adapter_name="turbo_a")
        pipe.fuse_lora()
        pipe.unload_lora_weights()
        h3plan.install(pipe, fp8, num_inference_steps=n)

    try:
        h3plan.install(pipe, bf16, num_inference_steps=n)
        call("bf16")
        load_s = timed(lambda: pipe.load_lora_weights(lora["turbo_a"], adapter_name="turbo_a"))
        call("bf16 + lora a", load_after_install_s=load_s)
        pipe.load_lora_weights(lora["turbo_b"], adapter_name="turbo_b")
        rows[-1]["set_adapters_s"] = {k: statistics.median(timed(lambda k=k: pipe.set_adapters(k)) for _ in range(5))
                                      for k in ("turbo_b", "turbo_a")}
        h3plan.uninstall(pipe)
        pipe.delete_adapters("turbo_b")
        h3plan.install(t, same_backend_plan(bf16))
        call("reference + lora a")
        h3plan.uninstall(t)
        call("eager + lora a")
        pipe.unload_lora_weights()
        h3plan.install(pipe, fp8, num_inference_steps=n)
        try:
            pipe.load_lora_weights(lora["turbo_a"], adapter_name="turbo_a")
            refusal = "none: the LoRA loaded"
        except h3plan.InstallError as e:
            refusal = str(e)
        call("fp8", refusal=refusal)
        call("fp8 + lora a fused", way_s=timed(fused_fp8))
        h3plan.uninstall(pipe)
        call("eager + lora a fused")
    finally:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        write(rows, out, a, a.tag or device_tag(name), name, torch)
    return 0


def write(rows, out, a, tag, device, torch) -> None:
    import diffusers

    def compare(p, q):  # over the video and audio latents
        u, v = (torch.cat([z.float().flatten().cpu() for z in out[k]]) for k in (p, q))
        return {"bitwise": bool(torch.equal(u, v)), "max_abs": (u - v).abs().max().item(),
                "rel_l2": ((u - v).norm() / v.norm()).item()}

    fwd = {r["row"]: r["forward_s"] for r in rows}
    latents = {f"{p} vs {q}": compare(p, q) for p, q in PAIRS if p in out and q in out}
    speed = {p: fwd[p] / fwd[q] for p, q in (PAIRS[2], PAIRS[4]) if p in fwd and q in fwd}
    refusal = next((r["refusal"] for r in rows if "refusal" in r), "")
    checks = {  # declared before the run, each recorded PASS or FAIL
        "bf16 + lora a: latents bitwise equal to the reference + lora a's":
            latents.get(" vs ".join(PAIRS[0]), {}).get("bitwise"),
        "fp8: LoRA a after install refused in one h3plan line": "bypasses" in refusal and "\n" not in refusal}
    run = {"run": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device": device, "torch": torch.__version__,
           "diffusers": diffusers.__version__, "video": a.video, "layers": a.layers, "steps": a.steps,
           "text_tokens": a.text_tokens, "overrides": a.overrides, "lora": "h3plan/facts/lora.py TURBO, seeded",
           "timing": "CUDA events per forward; host clock for load / switch / way" if device != "cpu" else "host clock",
           "rows": rows, "latents": latents, "lora_forward_ratio": speed,
           "checks": {k: "PASS" if v else "FAIL" for k, v in checks.items()}}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"lora-{tag}.json")
    doc = json.loads(Path(path).read_text()) if os.path.exists(path) else {"kind": "lora", "runs": []}
    doc["runs"].append(run)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    md = [f"# LoRA with a plan installed: run {run['run']} ({device}, {a.video}, {a.layers} layers; earlier runs: the "
          "JSON)", "", "| row | forward s | timed, refused |", "|---|---:|---|"]
    skip = ("row", "forward_s", "forwards_s", "counters")
    md += [f"| {r['row']} | {r['forward_s']:.4f} | {json.dumps({k: v for k, v in r.items() if k not in skip})} |"
           for r in rows]
    md += ["", "| latents | bitwise | max abs | rel l2 |", "|---|---|---:|---:|"]
    md += [f"| {k} | {v['bitwise']} | {v['max_abs']:.3g} | {v['rel_l2']:.3g} |" for k, v in latents.items()]
    md += ["", "forward with / without the LoRA: " + ", ".join(f"{k} {v:.3f}x" for k, v in speed.items()), ""]
    md += [f"- {k}: {v}" for k, v in run["checks"].items()]
    Path(path[:-5] + ".md").write_text("\n".join(md) + "\n")
    print(f"wrote {path} and .md")


if __name__ == "__main__":
    sys.exit(main())

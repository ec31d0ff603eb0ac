"""VAE decode benchmark: diffusers eager vs an h3plan plan in AutoencoderKLMiniMaxH3, one GPU.

    python benchmarks/vae.py --out benchmarks/results                     # H200: vae-h200.json / .md
    python benchmarks/vae.py --out /tmp/r --latents 1x24x4x48x84 --plans "hardware=sm90 recipe=bf16 levers.vae_ops=fused"

The released config (conf/vae/h3.yaml) with seeded fp32 weights: diffusers' initialisation, except the
residual scales and register tokens (zeros in diffusers' init, so the blocks would change nothing) drawn
from N(0, 0.1). `requires_grad_(False)` and `vae.decode(z)` in `torch.no_grad()`, no autocast: the decode as
diffusers' pipeline runs it, the VAE in its own dtype.
Per (latent, plan): the eager side is diffusers' decode with the plan's tile geometry (a tiles-only
plan: the geometry only, without fp8_tiles' FP8 GEMMs, so a lossy plan's comparison isolates its ops) and
the VAE in the plan's decode precision (vae_precision; cast as from_pretrained(torch_dtype=...) casts it);
the plan side is `h3plan.install(vae, plan)` into the float32 VAE; `eager_fp32_ms` times diffusers' default
(float32) decode at the same tiles. Times are medians of CUDA-event timed decodes after `--warmup` untimed
ones (eager first, then the plan); `bitwise_equal` compares the two last outputs; `psnr_db` (lossy plans)
is h3plan.actions.quality.psnr of the plan's frames against eager's at the same precision, `psnr_vs_fp32_db`
against the float32 decode, both mapped to [0, 1] as diffusers' postprocessing does ((x + 1) / 2,
clamped), null when identical; `budget_psnr_db` is the recipe's bound; `peak_GiB` is max_memory_allocated
over one decode, weights included.
`--device cpu --config h3_tiny` is a plumbing smoke run in the Triton interpreter (host clock, no meaning).
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's h3plan

TILING = ("use_tiling", "tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
          "tile_sample_min_overlap_width")


def vae_config(name: str) -> dict:
    from omegaconf import OmegaConf

    path = ROOT / "conf" / "vae" / f"{name}.yaml"
    cfg = OmegaConf.load(path)
    # h3_tiny nests under vae: (@package _global_)
    return OmegaConf.to_container(cfg.get("vae", cfg).diffusers_config, resolve=True)


def build_vae(config: dict, device="cuda", seed: int = 0, scale_std: float = 0.1):
    """AutoencoderKLMiniMaxH3.from_config on `device` with seeded weights (fp32, as released)."""
    import torch
    from diffusers import AutoencoderKLMiniMaxH3

    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    torch.manual_seed(seed)
    if torch.device(device).type == "cuda":
        torch.cuda.manual_seed(seed)
    with torch.device(device):
        vae = AutoencoderKLMiniMaxH3.from_config(cfg)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "scale" in name or "register_tokens" in name:
                p.normal_(0.0, scale_std)
    return vae.eval().requires_grad_(False)


def parse_latent(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.lower().split("x"))


def resolve_plan(spec: str, vae: str):
    """The plan for `spec` ("key=value ..."), resolved for the VAE config being timed."""
    from h3plan import resolve_config

    return resolve_config(**{"vae": vae, **dict(kv.split("=", 1) for kv in spec.split())})


def tiles_only(plan):
    """The plan's vae_tiles decision alone, its tile dtype dropped: diffusers' ops at the plan's tile geometry
    (the eager side; fp8_tiles' FP8 GEMMs stay on the plan side)."""
    import dataclasses

    from h3plan.actions.bench import roles
    from h3plan.actions.bench.ops import make_plan

    ds = [dataclasses.replace(d, params=tuple(kv for kv in d.params if kv[0] != "dtype"))
          for d in plan.decisions if d.lever == roles.DECODE_TILES]
    return make_plan({}, {}, ds)


def frames01(x):
    """Decoded frames in [-1, 1] -> [0, 1], as diffusers' VideoProcessor postprocesses them."""
    return ((x.float() + 1) / 2).clamp(0, 1)


def geometry(vae) -> str:
    if not vae.use_tiling:
        return "off"
    return (f"{vae.tile_sample_min_height}x{vae.tile_sample_min_width}/"
            f"{vae.tile_sample_min_overlap_height}")


def decoder_calls(vae, latent) -> int:
    """Decoder forwards in one decode: spatial tiles x temporal chunks (diffusers' own split)."""
    td, n = vae.config.token_drop, vae.tokens_chunk_size
    tokens = latent[2] + td
    chunks = (tokens + (-tokens) % n) // n - int(td > 0)
    if not vae.use_tiling:
        return chunks
    r = vae.spatial_compression_ratio
    ys = vae._split_tiles(latent[3] * r, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)[0]
    xs = vae._split_tiles(latent[4] * r, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)[0]
    return chunks * len(ys) * len(xs)


class Decoder:
    """Timed `vae.decode` under no_grad (no autocast): CUDA events on a GPU, the host clock elsewhere."""

    def __init__(self, vae, z):
        import torch

        self.torch, self.vae, self.z = torch, vae, z
        self.cuda = z.device.type == "cuda"

    def __call__(self):
        t = self.torch
        with t.no_grad():
            return self.vae.decode(self.z).sample

    def timed(self, warmup: int, iters: int):
        from h3plan.actions.bench import Clock

        t, clock = self.torch, Clock(self.torch, self.z.device)
        for _ in range(warmup):
            self()
        times, out = [], None
        for i in range(iters):
            clock.sync()
            if self.cuda and i == iters - 1:
                t.cuda.reset_peak_memory_stats()
            ms, out = clock.timed(self)
            times.append(ms)
        peak = t.cuda.max_memory_allocated() / 2**30 if self.cuda else None
        return statistics.median(times), out, peak


def precision(plan) -> str:
    from h3plan.actions.bench import roles

    return next((d.setting for d in plan.decisions if d.lever == roles.DECODE_PRECISION), "fp32")


def measure(vae, plan, spec: str, latent, warmup: int, iters: int, seed: int = 1) -> dict:
    import torch

    from h3plan import counters, install, reset_counters, uninstall
    from h3plan.actions.bench import roles
    from h3plan.actions.bench.ops import VAE_DTYPES as DTYPES, PrecisionCast

    device = next(vae.parameters()).device
    z = torch.randn(latent, generator=torch.Generator().manual_seed(seed)).to(device)
    run = Decoder(vae, z)
    uninstall(vae)
    install(vae, tiles_only(plan))
    tiles = geometry(vae)
    p = precision(plan)
    fp32_ms, ref32, _ = run.timed(warmup, iters)
    ref32 = ref32.cpu()
    cast = PrecisionCast.apply(vae, DTYPES[p]) if p != "fp32" else None
    eager_ms, ref, eager_peak = run.timed(warmup, iters) if cast is not None else (fp32_ms, ref32, _)
    if cast is not None:
        cast.restore()
    ref = ref.cpu()
    if eager_peak is None and device.type == "cuda":
        eager_peak = torch.cuda.max_memory_allocated() / 2**30
    if device.type == "cuda":
        torch.cuda.empty_cache()
    report = install(vae, plan)
    reset_counters()
    plan_ms, out, plan_peak = run.timed(warmup, iters)
    calls, n_calls = counters(), decoder_calls(vae, latent)
    uninstall(vae)
    setting = {d.lever: d.setting for d in plan.decisions}
    lossy = not plan.lossless
    from h3plan.actions.bench import psnr

    def db(a, b):
        v = psnr(frames01(a.float()), frames01(b.float()))
        return None if v is None else round(v, 2)

    psnr_db = db(out.cpu(), ref) if lossy else None
    levers = {lv: setting.get(lv) for lv in (roles.VAE_OPS, roles.VAE_GRAPHS, roles.DECODE_TILES)}
    return {"latent": list(latent), "tiles": tiles, "plan": spec, "vae": p, **levers,
            "eager_ms": round(eager_ms, 2), "plan_ms": round(plan_ms, 2),
            "eager_fp32_ms": round(fp32_ms, 2), "speedup": round(eager_ms / plan_ms, 3),
            "speedup_vs_fp32": round(fp32_ms / plan_ms, 3), "bitwise_equal": bool(torch.equal(out.cpu(), ref)),
            "lossy": lossy, "psnr_db": psnr_db, "psnr_vs_fp32_db": db(out.cpu(), ref32) if p != "fp32" else None,
            "budget_psnr_db": budget_psnr(plan) if lossy else None,
            "peak_GiB": {"eager": _r(eager_peak), "plan": _r(plan_peak)},
            "peak_ratio": None if eager_peak is None else round(plan_peak / eager_peak, 3),
            "decoder_calls": n_calls,
            "counters": calls, "skipped": [f"{lv}: {r}" for lv, r in report.skipped if lv.startswith("vae")],
            **summary_fields(1, torch.equal(out.cpu(), ref), eager_peak, plan_peak)}


def summary_fields(gpus: int, bitwise: bool, eager_peak, plan_peak) -> dict:
    """The flat fields every vae-<tag>.json record carries (the flat schema) beside the detailed ones."""
    return {"gpus": gpus, "bitwise": bool(bitwise), "peak_GiB_eager": _r(eager_peak), "peak_GiB_plan": _r(plan_peak)}


def budget_psnr(plan):
    """The recipe's PSNR bound (dB) from the plan's config, None where the plan carries none."""
    return (plan.get("recipe").get("budget") or {}).get("psnr_db_min")


def _r(x):
    return None if x is None else round(x, 2)


def _psnr(r) -> str:
    if not r.get("lossy"):
        return "-"
    v = "identical" if r["psnr_db"] is None else f"{r['psnr_db']:.2f}"
    return v if r.get("budget_psnr_db") is None else f"{v} (>= {r['budget_psnr_db']})"


def ok(r: dict) -> bool:
    """A plan lossless but for its decode precision must be bitwise eager at that precision; a lossy one within
    its recipe's PSNR budget."""
    if "error" in r:
        return True
    if not r.get("lossy") or r.get("budget_psnr_db") is None:
        return r["bitwise_equal"]
    return r["psnr_db"] is None or r["budget_psnr_db"] is None or r["psnr_db"] >= r["budget_psnr_db"]


def markdown(meta: dict, records: list[dict]) -> str:
    from h3plan.actions.bench import roles

    ops, graphs = roles.VAE_OPS, roles.VAE_GRAPHS
    fused_calls = roles.counter(ops, "qk_norm_rope") + ".fused"  # one per decoder block call through the fused ops
    replays = roles.counter(graphs) + ".fused"
    lines = [f"# VAE decode: diffusers eager vs h3plan plan ({meta['device']})", "",
             f"AutoencoderKLMiniMaxH3 `{meta['config']}` config, seeded fp32 weights, `vae.decode(z)` as diffusers' "
             f"pipeline runs it (no autocast), no_grad, requires_grad False; medians of {meta['iters']} timed decodes "
             f"({meta['clock']}) after {meta['warmup']} warm-up; eager runs diffusers' ops at the plan's tile "
             "geometry with the VAE in the plan's decode precision (`VAE`); `fp32 ms` is diffusers' default decode. "
             "Fused block calls: `vae_ops.qk_norm_rope.fused` over the plan's decode (with vae_graphs only the warm-up "
             "and capture runs count: replays run no Python); graph replays: `vae_graphs.fused`.", "",
             "| # | latent | GPUs | tiles | plan | VAE | vae_graphs | vae_ops | decoder calls | fp32 ms | eager ms | "
             "plan ms | speedup | vs fp32 | bitwise | PSNR dB (budget) | PSNR vs fp32 | peak GiB eager / plan "
             "(plan/eager) | fused block calls | graph replays |",
             "|---:|---|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|"]
    for i, r in enumerate(records, 1):
        if "error" in r:
            lines.append(f"| {i} | {'x'.join(map(str, r['latent']))} | - | - | {r['plan']} | - | - | - | - | - | - | - "
                         f"| - | - | - | - | - | - | {r['error']} | - |")
            continue
        pk = r["peak_GiB"]
        ratio = "" if r.get("peak_ratio") is None else f" ({r['peak_ratio']:.2f}x)"
        v32 = r.get("psnr_vs_fp32_db")
        lines.append(f"| {i} | {'x'.join(map(str, r['latent']))} | {r.get('gpus', 1)} | {r['tiles']} | {r['plan']} | "
                     f"{r.get('vae', 'fp32')} | {r.get(graphs) or '-'} | {r[ops]} | {r['decoder_calls']} | "
                     f"{r.get('eager_fp32_ms', r['eager_ms']):.1f} | {r['eager_ms']:.1f} | {r['plan_ms']:.1f} | "
                     f"{r['speedup']:.2f}x | {r.get('speedup_vs_fp32', r['speedup']):.2f}x | "
                     f"{'yes' if r['bitwise_equal'] else 'NO'} | {_psnr(r)} | {'-' if v32 is None else f'{v32:.2f}'} | "
                     f"{pk['eager']} / {pk['plan']}{ratio} | {r['counters'].get(fused_calls, 0)} | "
                     f"{r['counters'].get(replays, 0)} |")
    rows: dict[str, list[int]] = {}  # note -> the rows (#) it belongs to; a note of every row names none
    for i, r in enumerate(records, 1):
        for s in dict.fromkeys((*r.get("skipped", ()), *r.get("notes", ()))):
            rows.setdefault(s, []).append(i)
    if rows:
        lines += ["", "Notes (the installer's skips and the records' own notes, with the rows they belong to):"]
        for s in sorted(rows):
            where = ("" if len(rows[s]) == len(records)
                     else f" (row{'s' if len(rows[s]) > 1 else ''} {', '.join(map(str, rows[s]))})")
            lines.append(f"- {s}{where}")
    lines += ["", f"torch {meta['torch']}, diffusers {meta['diffusers']}; {meta['seconds']:.0f} s in all."]
    return "\n".join(lines) + "\n"


def rerender(path: Path) -> None:
    """Rewrite the .md beside a committed vae-<tag>.json from its records (no GPU, no torch)."""
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(markdown(doc, doc["records"]))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--markdown"]:  # python benchmarks/vae.py --markdown benchmarks/results/vae-h200.json
        rerender(Path(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--latents", default="1x24x4x48x84,1x24x12x48x84")
    ap.add_argument("--plans", nargs="+", default=["hardware=sm90 recipe=bf16 levers.vae_ops=fused",
                                                   "hardware=sm90 recipe=fp8 levers.vae_ops=fused"])
    ap.add_argument("--config", default="h3", help="conf/vae/<name>.yaml (h3, h3_tiny)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining records past this")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    start = time.monotonic()
    import diffusers
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("vae bench: no CUDA device (use --device cpu --config h3_tiny for a plumbing run)", file=sys.stderr)
        return 2
    vae = build_vae(vae_config(args.config), device=args.device)
    plans = [(spec, resolve_plan(spec, args.config)) for spec in args.plans]
    records = []
    for latent in map(parse_latent, args.latents.split(",")):
        for spec, plan in plans:
            if time.monotonic() - start > args.budget_s:
                records.append({"latent": list(latent), "plan": spec,
                                "error": f"skipped: past --budget-s {args.budget_s:.0f}"})
                continue
            rec = measure(vae, plan, spec, latent, args.warmup, args.iters)
            records.append(rec)
            print(f"[vae] latent {latent} tiles {rec['tiles']} {spec}: eager {rec['eager_ms']:.1f} ms, plan "
                  f"{rec['plan_ms']:.1f} ms, {rec['speedup']:.2f}x, bitwise {rec['bitwise_equal']}, PSNR {_psnr(rec)}, "
                  f"peak GiB {rec['peak_GiB']}", flush=True)
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu (Triton interpreter)"
    meta = {"device": dev, "torch": torch.__version__, "diffusers": diffusers.__version__, "config": args.config,
            "autocast": None, "requires_grad": False, "warmup": args.warmup, "iters": args.iters,
            "clock": "CUDA events" if args.device.startswith("cuda") else "host clock",
            "seconds": round(time.monotonic() - start, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"vae-{args.tag}.json").write_text(json.dumps({**meta, "records": records}, indent=1) + "\n")
    (args.out / f"vae-{args.tag}.md").write_text(markdown(meta, records))
    print(f"[vae] wrote {args.out}/vae-{args.tag}.json and .md in {meta['seconds']:.0f} s")
    return 0 if all(ok(r) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

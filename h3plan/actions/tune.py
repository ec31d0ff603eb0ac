"""`python -m h3plan action=tune ...`: measure the facts plans use on this GPU, at this plan's shapes, and write them
as a hardware file that extends the packaged group (its Hydra defaults list), loaded through the search path.

Measured (each step on the progress bar; tune.quick: fewer repeats, the plan's own recipe and decode only, a shorter
latent and shorter checks):
1. attention: every registered backend that can run here, at the plan's per-rank shape (S, heads per rank, head
   dim); FA4 with the hardware's tuned tile against its default; FA4 2-CTA against 1-CTA where the GPU has it (in
   the record only: fa4_2cta still decides from the capability facts) -> measured.attention, fa4.tuned_tiles;
2. the block linears' GEMMs (to_q/k/v, to_out, the FFN at the plan's rows): bf16 (F.linear), fp8 (torch._scaled_mm,
   the cuBLAS call the plan's FP8 linears make) and nvfp4 (h3plan's NVFP4 linear) where the hardware has them
   -> measured.gemm_block;
3. copy bandwidth (a 2 GiB clone) -> measured.hbm_copy_tbps;
4. one real-width block with each recipe's plan installed (bf16, and fp8 / nvfp4 where the hardware has them),
   profiled: every kernel that is neither GEMM nor attention -> measured.elementwise;
5. the VAE decode per precision (fp32, fp16, bf16) and tile geometry (default; the fp8 recipe's FP8 tiles), each
   arm a plan of the command's own overrides, on a seeded real-width VAE at the plan's whole latent (tune.quick: 5
   latent frames of it; the plan scales a point by latent volume) -> measured.decode;
5b. the video VAE encode per precision (fp32, fp16, bf16) at the VAE's own tiles, and fp32 at the fp8 recipe's decode
   tiles (vae_encode_tiles=decode; where the hardware plans them); each arm a plan, its encode levers installed, on the
   same seeded VAE, at the request's encode inputs (fl2va keyframes, ref2va image / video references; quick: the
   first) or, for a request that encodes nothing, one keyframe of the canvas, so the file has it -> measured.encode;
6. the all-to-all at each Ulysses degree the world has (launched under torchrun; one process: none; rank 0
   writes) -> measured.ulysses.a2a;
7. every lever's check on this device: action=verify's checks (bitwise against the reference R, or inside the
   recipe's budget) on `tune.check_blocks` real-width blocks -> tuned.checks.
Then, on the file written: auto's regret against every combination of the measured levers (bench/regret.py).

The file records its provenance (hardware.tuned: device, compute capability, memory, driver, CUDA, torch, Triton,
FA4 and cuDNN versions, date, the command). It is written to a temporary file beside `tune.out` and renamed at the
end: an interrupted tune leaves no partial file. Beside it, tune-<hardware>.json / .md with every timing.
On a CPU the tune is refused in one line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from h3plan.facts.attention import BACKENDS
from h3plan.runtime.attention import get_backend
from h3plan.errors import UsageError
from h3plan.facts import tuned as provenance
from h3plan.facts.vae.encode import encode_inputs
from h3plan.levers import TERM_OWNERS, terms
from h3plan.planning.config import compose
from h3plan.planning.predict import DECODE_TILES, ENCODE_PRECISION, encode_tiles
from h3plan.runtime.quant import quantized_linear

from .gpu_only import TUNE_REFUSAL as CPU_REFUSAL
from .pipeline_build import build_vae

ATTENTION_HINTS = ("flash", "fmha", "sdpa", "attention", "attn")
GEMM_HINTS = ("gemm", "nvjet", "xmma", "cublas", "matmul", "_mm_")
DECODE_PRECISION = TERM_OWNERS["vae_cast"]  # the lever whose setting is the dtype the decode runs in
ENCODE_TILES = TERM_OWNERS["vae_encode_shares_tile"]  # the lever that puts the encode at the decode's tiles


def _cfg(cfg, key, default=None):
    node = cfg.get("tune") if hasattr(cfg, "get") else None
    val = None if node is None else node.get(key)
    return default if val is None else val


def command_line() -> str:
    return "python -m h3plan " + shlex.join(sys.argv[1:])


def refuse_without_gpu(torch) -> None:
    if not torch.cuda.is_available():
        raise UsageError(CPU_REFUSAL)


@contextlib.contextmanager
def atomic_write(path: Path):
    """Yield a temporary path beside `path`; on success rename it onto `path`, else remove it (no partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _plain(x):
    """Plain YAML types: str subclasses (torch.__version__ is a TorchVersion, which safe_dump refuses) become str,
    and every list and dict a fresh one (no `&id001` anchors where two records share a latent shape)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return str(x) if isinstance(x, str) else x


def hardware_file(base: str, tuned: dict, measured: dict, fa4: dict | None = None) -> str:
    """The YAML text of a tuned hardware file: `base` (the packaged group) extended by the measured facts."""
    import yaml

    head = (f"# Written by `{tuned['command']}` on {tuned['device']}, {tuned['date']} UTC (h3plan action=tune): "
            f"measured facts,\n# regenerate rather than edit. Use it: python -m h3plan "
            f"hydra.searchpath=[file://<folder above hardware/>] hardware=<this file's stem>\n")
    doc: dict[str, Any] = {"defaults": [base, "_self_"], "tuned": tuned, "measured": measured}
    if fa4:
        doc["fa4"] = fa4
    return head + yaml.safe_dump(_plain(doc), sort_keys=False, width=200)


def write_outputs(out: Path, base: str, tuned: dict, measured: dict, fa4: dict | None, record: dict,
                  after_file=None, results: Path | None = None) -> list[Path]:
    """The hardware file, then its record as JSON and markdown (`results`.json/.md; default tune-<stem>.* beside the
    file), each renamed into place only when complete. `after_file(out, record)`, called once the hardware file is
    in place, may add to the record (the regret sweep)."""
    with atomic_write(out) as tmp:
        tmp.write_text(hardware_file(base, tuned, measured, fa4))
    if after_file is not None:
        after_file(out, record)
    stem = results if results is not None else out.with_name(f"tune-{out.stem}")
    files = [(stem.with_name(stem.name + ".json"), json.dumps(record, indent=1) + "\n"),
             (stem.with_name(stem.name + ".md"), markdown(record))]
    for path, text in files:
        with atomic_write(path) as tmp:
            tmp.write_text(text)
    return [out] + [p for p, _ in files]


def add_regret(overrides: list[str]):
    """after_file: auto's regret against every attention / decode precision / tile combination, planned on the new
    file (h3plan/actions/bench/regret.py), into the record."""
    def add(out: Path, record: dict) -> None:
        from .bench import regret

        base = [f"hydra.searchpath=[file://{out.parent.parent}]", f"hardware={out.stem}"]
        try:
            record["regret"] = regret.sweep(base + overrides)
        except Exception as e:  # noqa: BLE001 - the measurements stand without it; the record says why
            record["regret"] = {"error": f"{type(e).__name__}: {e}"}
    return add


def markdown(record: dict) -> str:
    t, m = record["tuned"], record["measured"]
    lines = [f"# Tune on {t['device']} ({t['date']} UTC)", "", f"`{t['command']}`, {record['seconds']:.0f} s "
             f"({'quick' if t['quick'] else 'full'}); versions: "
             + ", ".join(f"{k} {v}" for k, v in t["versions"].items()), "",
             "| attention shape | " + " | ".join(record["backends"]) + " |",
             "|---|" + "---:|" * len(record["backends"])]
    for p in m.get("attention", []):
        lines.append(f"| {p['seq_len']:,} x {p['heads']} | " + " | ".join(
            "-" if p.get(b) is None else f"{p[b]:.1f}" for b in record["backends"]) + " |")
    lines += ["", "TFLOP/s = 4*S^2*H*D / time.", "", "| fact | value |", "|---|---|",
              f"| copy bandwidth | {m.get('hbm_copy_tbps')} TB/s |"]
    lines += [f"| {g['dtype']} block linears at {g['rows']:,} rows | {g['ms']:.3f} ms |"
              for g in m.get("gemm_block", [])]
    lines += [f"| elementwise ({e['recipe']}) at {e['rows']:,} rows | {sum(e['ms']):.3f} ms per block |"
              for e in m.get("elementwise", [])]
    lines += [f"| decode {d['precision']} / {d['tiles']} at {d['latent']} | {d['seconds']:.2f} s |"
              for d in m.get("decode", [])]
    lines += [f"| encode {e['precision']} / {e.get('tiles', 'default')} at {'x'.join(map(str, e['input']))} (frames x "
              f"height x width) | {e['seconds']:.3f} s |"
              for e in m.get("encode", [])]
    lines += [f"| all-to-all degree {a['degree']} | {a['gbps_leaving_rank']:.1f} GB/s |"
              for a in m.get("ulysses", {}).get("a2a", [])]
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c['lever']}={c['setting']} | {'pass' if c['passed'] else 'FAIL'} | {c['detail']} |"
              for c in t["checks"]]
    r = record.get("regret")
    if r and "error" not in r:
        from .bench.regret import markdown as regret_md

        lines += ["", "Auto against every combination of " + ", ".join(r["auto"]["settings"])
                  + f" (scored by {r['scored_by']}):",
                  "", regret_md([r]).rstrip("\n")]
    elif r:
        lines += ["", f"regret: not computed ({r['error']})"]
    lines += ["", "| step | seconds |", "|---|---:|"] + [f"| {k} | {v:.1f} |" for k, v in record["steps_s"].items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- measurements (GPU)


WARM_S = 2.0  # seconds of back-to-back calls before timing: a forward runs seconds long, at the clocks the power
# cap settles to (the H200's whole-forward attention ran 9% slower than one block's: block-profile*-h200.json)


def _median_ms(torch, fn, warmup: int, iters: int, warm_s: float = WARM_S) -> float:
    t = time.monotonic()
    n = 0
    while n < warmup or time.monotonic() - t < warm_s:
        fn()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    # the bench package loads diffusers; tune's module does not
    from h3plan.actions.bench.timing import Clock, median_ms

    return median_ms(fn, 0, iters, clock=Clock(torch), synced=True)


def measure_attention(torch, hw: dict, S: int, heads: int, D: int, batch: int,
                      reps: tuple[int, int]) -> tuple[dict, dict]:
    """TFLOP/s per backend that can run here at (S, heads); FA4's tuned tile's speedup over its default."""
    from h3plan.runtime.kernels import fp8 as f8

    q, k, v = (torch.randn(batch, S, heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops, point, skipped = 4 * batch * S * S * heads * D, {"seq_len": S, "heads": heads}, {}
    for name, spec in BACKENDS.items():
        backend = get_backend(name)
        why = backend.unavailable_reason(q, k, v)
        if why:
            skipped[name] = why
            continue
        if spec.precision == "fp8":
            codes = [t.to(f8.E4M3) for t in (q, k, v)]
            ones = torch.ones(3, device="cuda")
            fn = lambda b=backend: b(*codes, descales=ones)  # noqa: E731
        else:
            fn = lambda b=backend: b(q, k, v)  # noqa: E731
        point[name] = round(flops / (_median_ms(torch, fn, *reps) * 1e9), 1)
    tiles = []
    for tile in (hw.get("fa4") or {}).get("tuned_tiles") or ():
        if "fa4" in point and tile["head_dim"] == D:
            t = get_backend("fa4", tile={k: tile[k] for k in ("tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap")})
            if t.unavailable_reason(q, k, v) is None:
                ms = _median_ms(torch, lambda: t(q, k, v), *reps)
                tiles.append({**tile, "measured": [{"seq_len": S, "heads": heads,
                                                    "speedups": [round(flops / (point["fa4"] * 1e9) / ms, 3)]}]})
    two_cta = {}
    if "fa4" in point and (hw.get("fa4") or {}).get("two_cta"):  # Blackwell: the 2-CTA kernel against 1-CTA
        for on in (False, True):
            b = get_backend("fa4", two_cta=on)
            if b.unavailable_reason(q, k, v) is None:
                ms = _median_ms(torch, lambda b=b: b(q, k, v), *reps)
                two_cta["on" if on else "off"] = round(flops / (ms * 1e9), 1)
    return point, {"skipped": skipped, "tuned_tiles": tiles, "fa4_two_cta_tflops": two_cta}


def measure_gemms(torch, hw: dict, dc: dict, rows: int, reps: tuple[int, int]) -> list[dict]:
    """The block linears at `rows` rows, per dtype the hardware has: summed kernel time of the four shapes."""
    import torch.nn.functional as F

    h, inner, f = dc["hidden_size"], dc["num_attention_heads"] * dc["attention_head_dim"], dc["ffn_dim"]
    shapes = [(h, inner)] * 3 + [(inner, h), (h, 2 * f), (f, h)]  # (in, out): q, k, v, out, ff up, ff down
    points = []
    for dtype in ("bf16", "fp8", "nvfp4"):
        if dtype != "bf16" and not hw["gemm"][dtype]:
            continue
        total = 0.0
        for n_in, n_out in dict.fromkeys(shapes):
            x = torch.randn(rows, n_in, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) / n_in**0.5
            if dtype == "bf16":
                fn = lambda x=x, w=w: F.linear(x, w)  # noqa: E731
            elif dtype == "nvfp4":  # h3plan's NVFP4 linear: the activation quantize is part of the call
                lin = torch.nn.Linear(n_in, n_out, bias=False, device="cuda", dtype=torch.bfloat16)
                lin.weight.data.copy_(w)
                fn = lambda x=x, q=quantized_linear(lin, "nvfp4"): q(x)  # noqa: E731
            else:
                x8, w8, one = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
                fn = lambda x8=x8, w8=w8, one=one: torch._scaled_mm(x8, w8.t(), one, one, out_dtype=torch.bfloat16)  # noqa: E731
            total += _median_ms(torch, fn, *reps) * shapes.count((n_in, n_out))
            del x, w
        how = {"bf16": "F.linear", "fp8": "torch._scaled_mm",
               "nvfp4": "h3plan's NVFP4Linear (its activation quantize included)"}[dtype]
        points.append({"rows": rows, "dtype": dtype, "layers": 1, "ms": round(total, 3),
                       "source": f"action=tune: {how} per block-linear shape, medians summed"})
    return points


def measure_copy(torch, reps: tuple[int, int]) -> float:
    x = torch.empty(2**30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    ms = _median_ms(torch, lambda: x.clone(), *reps)
    return round(2 * x.numel() * 2 / (ms * 1e9), 3)  # read + write, TB/s


def measure_elementwise(torch, cfg, plan, rows: int, reps: tuple[int, int]) -> dict:
    """One real-width block with the plan installed, profiled: the kernels that are neither GEMM nor attention."""
    from torch.profiler import ProfilerActivity, profile

    from h3plan.install import install

    from .inputs import build_model, packed_inputs
    from .verify import _single_process

    dc = cfg.model.diffusers_config
    model = build_model(dc, blocks=1, device="cuda", dtype=torch.bfloat16)
    install(model, _single_process(plan))  # one process: the Ulysses levers off, the elementwise kernels the same
    inputs = packed_inputs(dc, rows, device="cuda")
    with torch.no_grad():
        t = time.monotonic()
        while time.monotonic() - t < WARM_S:  # the clocks a forward runs at (see WARM_S)
            model(**inputs)
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps[1]):
                model(**inputs)
            torch.cuda.synchronize()
    from h3plan.actions.bench.timing import category, kernel_events  # the bench package loads diffusers; tune does not

    cats = {"attention": 0.0, "gemm": 0.0, "elementwise": 0.0}
    table = (("attention", ATTENTION_HINTS), ("gemm", GEMM_HINTS))
    for e in kernel_events(prof, skip=("memset", "memcpy", "nccl:")):
        cats[category(e.name, table, "elementwise")] += e.time_range.elapsed_us() / 1e3 / reps[1]
    del model
    torch.cuda.empty_cache()
    return {"recipe": plan.get("recipe")["name"], "rows": rows, "layers": 1, "ms": [round(cats["elementwise"], 3)],
            "source": f"action=tune: one installed block profiled (attention {cats['attention']:.2f} ms, GEMMs "
                      f"{cats['gemm']:.2f} ms per forward, outside the GEMM and attention kernels: the rest)"}


DECODE_ARMS = (["recipe=bf16", "recipe.vae=fp32"], ["recipe=bf16", "recipe.vae=fp16"],
               ["recipe=bf16", "recipe.vae=bf16"],
               ["recipe=fp8"])  # fp32, fp16, bf16 with the default tiles; fp16 with the fp8 recipe's FP8 tiles


def measure_decode(torch, cfg, plan, quick: bool, replan) -> list[dict]:
    """The seeded real-width VAE's decode per precision and tile geometry (each arm planned with the command's own
    overrides, so its decode levers are a plan's), at the plan's own latent (quick: 5 latent frames of it). The whole
    latent, not a few frames scaled up: the decode is not linear in frames (12 of 37 latent frames, scaled, predicted
    the H200's fp32 decode 12% short: docs/tuned/README.md)."""
    from h3plan.install import install, uninstall

    seq = plan.derived_value("sequence") or {}
    if not seq.get("latent_frames"):
        return []
    frames = min(seq["latent_frames"], 5) if quick else seq["latent_frames"]
    latent = [1, int(cfg.vae.diffusers_config.get("latent_channels", 24)), frames, seq["latent_height"],
              seq["latent_width"]]
    plans = [plan]
    for arm in () if quick else DECODE_ARMS:
        try:
            plans.append(replan(arm))
        except Exception as e:  # noqa: BLE001 - an arm this hardware or policy refuses is skipped, and said so
            print(f"tune: decode arm {' '.join(arm)} not planned here: {e}", file=sys.stderr)
    arms = {(p.decision(DECODE_PRECISION).setting, p.decision(DECODE_TILES).setting): p for p in plans}
    vae = build_vae(cfg.vae.diffusers_config, device="cuda")
    z = torch.randn(*latent, device="cuda")
    out = []
    for (precision, tiles), p in arms.items():
        install(vae, p)
        with torch.no_grad():
            # one warm, one timed: seconds long
            ms = _median_ms(torch, lambda: vae.decode(z.to(vae.dtype)), 1, 1, warm_s=0)
        uninstall(vae)
        out.append({"precision": precision, "tiles": tiles, "latent": latent, "seconds": round(ms / 1e3, 3),
                    "source": "action=tune: vae.decode of a seeded real-width VAE, that plan's decode levers installed "
                              "(the video decode only; the audio decode not counted)"})
    vae = z = None  # the seeded VAE freed before the next measurement
    torch.cuda.empty_cache()
    return out


ENCODE_ARMS = {("fp32", "default"): ["recipe=bf16", "recipe.vae=fp32"],
               ("fp16", "default"): ["recipe=bf16", "recipe.vae=fp16", f"levers.{DECODE_PRECISION}=fp32",
                                     f"levers.{ENCODE_PRECISION}=fp16"],
               ("bf16", "default"): ["recipe=bf16", "recipe.vae=bf16", f"levers.{DECODE_PRECISION}=fp32",
                                     f"levers.{ENCODE_PRECISION}=bf16"],
               ("fp32", "fp8_tiles"): ["recipe=fp8", f"levers.{ENCODE_TILES}=decode",
                                       f"levers.{ENCODE_PRECISION}=fp32"]}
"""One plan per encode precision and geometry (a lossy encode is forced under a recipe that allows a lossy VAE, the
decode kept fp32; the last arm encodes at the fp8 recipe's decode tiles, vae_encode_tiles=decode): only the encode is
timed."""


def encode_shapes(plan, quick: bool) -> tuple[list[dict], list[str]]:
    """(inputs, overrides): the request's encode inputs (quick: the first), or one keyframe of the canvas for a request
    that encodes nothing, with the overrides that make its arms plan that keyframe (video.task=fl2va)."""
    seq = plan.derived_value("sequence") or {}
    inputs = encode_inputs(seq)
    if inputs:
        extra: list[str] = []
    elif seq.get("height"):
        inputs = [{"what": "one keyframe of the canvas", "frames": 1, "height": seq["height"], "width": seq["width"]}]
        extra = ["video.task=fl2va", "video.keyframes=[first]"]  # on the request's own canvas (video.height/width)
    else:
        return [], []
    seen = {(x["frames"], x["height"], x["width"]): x for x in inputs}  # one timing per distinct input
    return list(seen.values())[:1] if quick else list(seen.values()), extra


def measure_encode(torch, cfg, plan, quick: bool, replan, device="cuda", timer=None) -> list[dict]:
    """The seeded real-width VAE's encode per precision (each arm a plan with its vae_encode_precision installed) at
    each distinct encode input of the request. quick: fp32 only. timer(fn) -> ms (default: one warm, one timed call)."""
    from h3plan.install import install, uninstall

    inputs, extra = encode_shapes(plan, quick)
    if not inputs:
        return []
    arms = {}
    for (precision, tiles), arm in ENCODE_ARMS.items():
        if quick and (precision, tiles) != ("fp32", "default"):
            continue
        try:
            p = replan(arm + extra)
        except Exception as e:  # noqa: BLE001 - an arm this hardware or policy refuses is skipped, and said so
            print(f"tune: encode arm {' '.join(arm + extra)} not planned here: {e}", file=sys.stderr)
            continue
        settings = {d.lever: d.setting for d in p.decisions}
        arms[(settings[ENCODE_PRECISION], encode_tiles(settings))] = p
    if timer is None:
        def timer(fn):
            return _median_ms(torch, fn, 1, 1, warm_s=0)
    vae = build_vae(cfg.vae.diffusers_config, device=device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for x in inputs:
        pixels = (torch.rand(1, 3, x["frames"], x["height"], x["width"], generator=gen) * 2 - 1).to(device)
        for (precision, tiles), p in arms.items():
            install(vae, p)
            try:
                with torch.no_grad():
                    ms = timer(lambda px=pixels, v=vae: v.encode(px))
            finally:
                uninstall(vae)
            out.append({"precision": precision, "tiles": tiles, "input": [x["frames"], x["height"], x["width"]],
                        "seconds": round(ms / 1e3, 4),
                        "source": f"action=tune: vae.encode of a seeded real-width VAE ({x['what']}), that plan's "
                                  f"{ENCODE_PRECISION}={precision} and {ENCODE_TILES}="
                                  f"{p.decision(ENCODE_TILES).setting} installed ({tiles} geometry)"})
    vae = None  # the seeded VAE freed before the next measurement
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def measure_a2a(torch, dc: dict, seq_len: int, reps: tuple[int, int]) -> list[dict]:
    """all_to_all_single of one per-rank (S/U, H, D) bf16 tensor at each Ulysses degree U the world has (groups of U
    consecutive ranks, as the plans build them); launched under torchrun, else none."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return []
    world, rank, heads, d = dist.get_world_size(), dist.get_rank(), dc["num_attention_heads"], dc["attention_head_dim"]
    out = []
    for u in (u for u in range(2, world + 1) if world % u == 0 and heads % u == 0):
        groups = [dist.new_group(list(range(g, g + u))) for g in range(0, world, u)]  # every rank makes every group
        group = groups[rank // u]
        x = torch.randn(-(-seq_len // u), heads, d, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ms = _median_ms(torch, lambda: dist.all_to_all_single(y, x, group=group), *reps)
        out.append({"degree": u, "seq_len": seq_len, "tensor_ms": round(ms, 3),
                    "gbps_leaving_rank": round(x.numel() * 2 * (u - 1) / u / (ms * 1e6), 1)})
    return out


def run_checks(torch, cfg, plan, blocks: int, seq_len: int) -> list[dict]:
    """action=verify's checks on this device; one entry per lever setting it judged."""
    from .inputs import build_model, packed_inputs
    from .verify import verify

    dc = cfg.model.diffusers_config
    model = build_model(dc, blocks=blocks, device="cuda", dtype=torch.bfloat16)
    results: list = []
    verify(model, packed_inputs(dc, seq_len, device="cuda"), plan, device="cuda", results=results)
    del model
    torch.cuda.empty_cache()
    return [{"lever": name.split("=")[0], "setting": name.split("=")[1], "passed": bool(ok), "detail": verdict}
            for name, ok, verdict in results if "=" in name and " " not in name]


# ---------------------------------------------------------------- the action


def _overrides() -> list[str]:
    """The command's plan overrides (what a plan on the new file is asked with), without the action's own keys."""
    return [a for a in sys.argv[1:] if not a.startswith(("action=", "tune.", "hardware=", "hydra.", "-"))]


def _init_world(torch):
    """Under torchrun (WORLD_SIZE > 1): one process group over NCCL, this rank's GPU; rank 0 writes the files."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    return dist.get_rank() if dist.is_initialized() else 0


def run(cfg, plan) -> int:
    import torch

    refuse_without_gpu(torch)
    from h3plan.planner import resolve

    from .bench.timing import Progress, Quiet

    rank = _init_world(torch)
    t0, quick = time.monotonic(), bool(_cfg(cfg, "quick", False))
    reps = (2, 5) if quick else (3, 15)
    hw, dc = plan.get("hardware"), plan.get("model")["diffusers_config"]
    base = hw["name"]
    out = Path(_cfg(cfg, "out", f"tuned/hardware/{base}_tuned.yaml")).resolve()
    results = _cfg(cfg, "results", None)
    padded = terms({d.lever: d for d in plan.decisions}).attention_padded
    S_att = plan.derived_value("padded_len") if padded else plan.derived_value("seq_len")
    heads, batch = plan.derived_value("heads_per_rank"), plan.derived_value("batch")
    rows = plan.derived_value("local_rows") * batch
    hw_args = [a for a in sys.argv[1:] if a.startswith(("hardware=", "hydra.searchpath="))]

    def replan(extra: list[str]):
        return resolve(compose([a for a in _overrides() if not a.startswith(("recipe=", "recipe.", "levers."))]
                               + hw_args + extra))

    steps = ["attention", "gemm", "copy", "elementwise", "decode", "encode", "all-to-all", "checks"]
    bar, steps_s, measured = (Progress(len(steps), "tune") if rank == 0 else Quiet()), {}, {"on_hardware": True}

    def step(name, fn):
        s = time.monotonic()
        result = fn()
        steps_s[name] = time.monotonic() - s
        bar.step(f"{name} {steps_s[name]:.0f} s")
        return result

    point, extra = step("attention", lambda: measure_attention(torch, hw, S_att, heads,
                                                               dc["attention_head_dim"], batch, reps))
    measured["attention"] = [point]
    measured["gemm_block"] = step("gemm", lambda: measure_gemms(torch, hw, dc, rows, reps))
    measured["hbm_copy_tbps"] = step("copy", lambda: measure_copy(torch, reps))

    def elementwise():
        plans = {plan.get("recipe")["name"]: plan}
        for r in () if quick else [r for r in ("bf16", "fp8", "nvfp4") if r == "bf16" or hw["gemm"][r]]:
            try:
                plans.setdefault(r, replan([f"recipe={r}"]))
            except Exception as e:  # noqa: BLE001 - a recipe this hardware cannot plan is skipped, and said so
                print(f"tune: recipe={r} not planned here: {e}", file=sys.stderr)
        return [measure_elementwise(torch, cfg, p, rows, reps) for p in plans.values()]

    measured["elementwise"] = step("elementwise", elementwise)
    decode = step("decode", lambda: measure_decode(torch, cfg, plan, quick, replan))
    if decode:
        measured["decode"] = decode
    encode = step("encode", lambda: measure_encode(torch, cfg, plan, quick, replan))
    if encode:
        measured["encode"] = encode
    a2a = step("all-to-all", lambda: measure_a2a(torch, dc, plan.derived_value("seq_len"), reps))
    if a2a:
        measured["ulysses"] = {"a2a": a2a,
                               "source": "action=tune: all_to_all_single at each Ulysses degree the world has"}
    blocks = int(_cfg(cfg, "check_blocks", 2))
    checks = step("checks", lambda: run_checks(torch, cfg, plan, blocks,
                                               min(plan.derived_value("seq_len"), 4096 if quick else 19000)))
    bar.close()
    if rank != 0:
        return 0

    props = torch.cuda.get_device_properties(0)
    cc = torch.cuda.get_device_capability(0)
    tuned = {"device": torch.cuda.get_device_name(0), "compute_capability": f"{cc[0]}.{cc[1]}",
             "memory_gib": round(props.total_memory / 2**30, 1),
             "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"), "command": command_line(),
             "versions": provenance.running_versions(),
             "runtime": {"cuda": torch.version.cuda, "cudnn": str(torch.backends.cudnn.version()),
                         "torch": torch.__version__},
             "quick": quick, "seconds": round(time.monotonic() - t0, 1), "checks": checks,
             "source": f"python -m h3plan action=tune (h3plan/actions/tune.py), {out.name}"}
    fa4 = {"tuned_tiles": extra["tuned_tiles"]} if extra.get("tuned_tiles") else None
    record = {"kind": "tune", "tuned": tuned, "measured": measured, "skipped": extra.get("skipped", {}),
              "fa4_two_cta_tflops": extra.get("fa4_two_cta_tflops", {}), "backends": list(BACKENDS),
              "steps_s": steps_s, "seconds": tuned["seconds"]}
    files = write_outputs(out, base, tuned, measured, fa4, record, after_file=add_regret(_overrides()),
                          results=None if results is None else Path(results))
    failed = [f"{c['lever']}={c['setting']}" for c in checks if not c["passed"]]
    print(f"tune: {tuned['seconds']:.0f} s on {tuned['device']}; wrote " + ", ".join(map(str, files))
          + (f"; checks failed (plans refuse them): {', '.join(failed)}" if failed else ""))
    print(f"python -m h3plan hydra.searchpath=[file://{out.parent.parent}] hardware={out.stem} "
          + " ".join(_overrides()))
    return 0

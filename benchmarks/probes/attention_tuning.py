"""Probe (H200): how much attention speed is left on the table at H3's shapes, and why attention runs
slower inside a block than alone.

1. FA4's SM90 forward over tile configurations (tile_m, tile_n, mma_pv_is_rs, intra_wg_overlap) at
   (1, S, 56, 128) for S = 19,000 and 37,820; FA4's own default is (128, 128, RS, overlap).
2. Every execution plan cuDNN offers for the BF16 and the FP8 SDPA graphs (heuristics A, B, fallback;
   every plan built), timed one by one.
3. Attention right after a burst of FP8/BF16 GEMMs against attention right after attention, with the
   SM clock and board power sampled by nvidia-smi every 20 ms in the background (read-only queries).

Each section writes what it measured into $OUT/attention-tuning.json as soon as it has it; a section
that fails records its error and the probe goes on. Usage: python attention_tuning.py [seconds budget]
"""
import json
import math
import os
import statistics
import sys
import time

import torch
from _cuda_timing import median_ms

OUT = os.environ.get("OUT", ".")
BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--report" else 420.0
SECTIONS = sys.argv[2:] or ["sweep", "ab", "cudnn", "power"]
T0 = time.monotonic()
H, D = 56, 128
RESULT: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__, "fa4": [], "cudnn": [],
                "power": []}


def save():
    with open(os.path.join(OUT, "attention-tuning.json"), "w") as f:
        json.dump(RESULT, f, indent=1)


def emit(section: str, rec: dict) -> None:
    print(section, rec, flush=True)
    RESULT.setdefault(section, []).append(rec)
    save()


def left() -> float:
    return BUDGET - (time.monotonic() - T0)


def time_ms(fn, warmup=2, iters=8):
    return median_ms(fn, warmup, iters)


def tflops(S, ms):
    return 4 * S * S * H * D / (ms * 1e-3) / 1e12


def qkv(S, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(1, S, H, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3)]


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def fa4_sweep():
    from flash_attn.cute.interface import _flash_attn_fwd

    configs = [(128, 128, True, True), (128, 144, True, True), (128, 160, True, True), (128, 176, True, True),
               (128, 192, True, True), (128, 128, False, True), (128, 176, False, True), (192, 128, False, True),
               (192, 112, False, True), (192, 96, False, True), (128, 112, True, True), (128, 96, True, True)]
    for S in (37820, 19000):
        q, k, v = qkv(S, S)
        ref = None
        for m, n, rs, ol in configs:
            if left() < 60:
                RESULT["fa4"].append({"S": S, "tile": [m, n, rs, ol], "error": "probe budget spent"})
                continue
            rec = {"S": S, "tile": [m, n, rs, ol]}
            try:
                t = time.monotonic()
                fn = lambda: _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, tile_mn=(m, n),  # noqa: E731
                                             mma_pv_is_rs=rs, intra_wg_overlap=ol)[0]
                o = fn()
                torch.cuda.synchronize()
                rec["compile_s"] = round(time.monotonic() - t, 1)
                if ref is None:
                    ref = o.clone()
                rec["rel_vs_default"] = rel(o, ref)
                rec["bitwise_vs_default"] = bool(torch.equal(o, ref))
                rec["ms"] = time_ms(fn)
                rec["tflops"] = tflops(S, rec["ms"])
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
            emit("fa4", rec)
        del q, k, v, ref


def fa4_ab(rounds=10, configs=None):
    """The promising tiles against FA4's default, interleaved: each round calls every config once, in a
    rotated order, so no config always follows the same neighbour or runs at the same clock phase."""
    from flash_attn.cute.interface import _flash_attn_fwd

    configs = configs or [(128, 128, True, True), (192, 128, False, True), (192, 112, False, True),
                          (192, 96, False, True), (128, 160, True, True), (128, 176, True, True)]
    RESULT.setdefault("fa4_ab", [])
    for S in (19000, 37820):
        q, k, v = qkv(S, S)
        fns = {}
        for c in list(configs):
            try:
                _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, tile_mn=c[:2], mma_pv_is_rs=c[2],
                                intra_wg_overlap=c[3])
                torch.cuda.synchronize()
            except Exception as exc:
                RESULT["fa4_ab"].append({"S": S, "tile": list(c), "error": f"{type(exc).__name__}"})
                configs.remove(c)
        fns = {c: (lambda c=c: _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, tile_mn=c[:2],
                                                 mma_pv_is_rs=c[2], intra_wg_overlap=c[3])[0]) for c in configs}
        ref = fns[configs[0]]().clone()
        bitwise = {c: bool(torch.equal(fns[c](), ref)) for c in configs}
        torch.cuda.synchronize()
        times = {c: [] for c in configs}
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            ev = []
            for c in order:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fns[c]()
                b.record()
                ev.append((c, a, b))
            torch.cuda.synchronize()
            for c, a, b in ev:
                times[c].append(a.elapsed_time(b))
        base = statistics.median(times[configs[0]])
        for c in configs:
            ms = statistics.median(times[c])
            rec = {"S": S, "tile": list(c), "ms": ms, "tflops": tflops(S, ms), "vs_default": base / ms,
                   "bitwise_vs_default": bitwise[c], "min_ms": min(times[c]), "max_ms": max(times[c])}
            print("fa4_ab", rec, flush=True)
            RESULT["fa4_ab"].append(rec)
        save()
        del q, k, v, ref, fns


def cudnn_plans():
    import cudnn

    from h3plan.runtime.attention import cudnn as hc
    from h3plan.runtime.kernels.fp8 import quantize as cast

    handle = hc._handle(torch.device("cuda"))
    for S in (19000, 37820):
        q, k, v = qkv(S, S + 1)
        (q8, dq), (k8, dk), (v8, dv) = cast(q), cast(k), cast(v)
        for kind in ("bf16", "fp8"):
            if left() < 40:
                RESULT["cudnn"].append({"S": S, "kind": kind, "error": "probe budget spent"})
                continue
            try:
                dt = cudnn.data_type
                io = dt.BFLOAT16 if kind == "bf16" else dt.FP8_E4M3
                g = cudnn.pygraph(io_data_type=io, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                                  handle=handle)
                src = (q, k, v) if kind == "bf16" else (q8, k8, v8)
                vq, vk, vv = (hc._bhsd(t) for t in src)
                o = torch.empty(q.shape, dtype=torch.bfloat16 if kind == "bf16" else q8.dtype, device="cuda")
                vo = hc._bhsd(o)
                tq, tk, tv = (g.tensor(dim=list(t.shape), stride=list(t.stride()), data_type=io) for t in (vq, vk, vv))
                pack = {tq: vq, tk: vk, tv: vv}
                if kind == "bf16":
                    to, _ = g.sdpa(q=tq, k=tk, v=tv, is_inference=True, attn_scale=1 / math.sqrt(D))
                else:
                    one = lambda x: x.reshape(1, 1, 1, 1).float().contiguous()  # noqa: E731
                    vals = {"dq": one(dq), "dk": one(dk), "dv": one(dv), "ds": one(torch.tensor(1 / 448.0, device="cuda")),
                            "ss": one(torch.tensor(448.0, device="cuda")), "so": one(1.0 / dv)}
                    sc = {n: g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT) for n in vals}
                    to, _, tas, tao = g.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=sc["dq"], descale_k=sc["dk"],
                                                 descale_v=sc["dv"], descale_s=sc["ds"], scale_s=sc["ss"],
                                                 scale_o=sc["so"], is_inference=True, attn_scale=1 / math.sqrt(D))
                    amax = torch.empty(2, 1, 1, 1, device="cuda")
                    for t in (tas, tao):
                        t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(dt.FLOAT)
                    pack.update({sc[n]: vals[n] for n in vals})
                    pack.update({tas: amax[0:1], tao: amax[1:2]})
                pack[to] = vo
                to.set_output(True).set_dim(list(vo.shape)).set_stride(list(vo.stride())).set_data_type(
                    dt.BFLOAT16 if kind == "bf16" else io)
                g.validate()
                g.build_operation_graph()
                g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
                g.check_support()
                try:
                    g.build_plans(cudnn.build_plan_policy.ALL)
                except Exception as exc:
                    RESULT["cudnn"].append({"S": S, "kind": kind, "note": f"build ALL: {exc}"[:200]})
                    g.build_plans()
                n = g.get_execution_plan_count()
                ref = None
                for i in range(n):
                    rec = {"S": S, "kind": kind, "index": i}
                    try:
                        rec["name"] = g.get_plan_name_at_index(i)
                        ws = torch.empty(max(1, g.get_workspace_size_plan_at_index(i)), dtype=torch.uint8, device="cuda")
                        fn = lambda: g.execute_plan_at_index(pack, ws, i, handle=handle)  # noqa: E731
                        fn()
                        torch.cuda.synchronize()
                        if ref is None:
                            ref = o.clone()
                        rec["rel_vs_first"] = rel(o, ref) if kind == "bf16" else rel(o.float(), ref.float())
                        rec["ms"] = time_ms(fn)
                        rec["tflops"] = tflops(S, rec["ms"])
                    except Exception as exc:
                        rec["error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                    emit("cudnn", rec)
            except Exception as exc:
                RESULT["cudnn"].append({"S": S, "kind": kind, "error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"})
                save()
        del q, k, v, q8, k8, v8


def power_probe():
    """Attention after attention vs attention right after ~10 ms of GEMMs (what precedes it in a block)."""
    from h3plan.runtime.attention.cudnn import CudnnFP8Backend
    from h3plan.runtime.attention.fa4 import FA4Backend
    from h3plan.runtime.kernels.fp8 import quantize as cast

    S = 37820
    q, k, v = qkv(S, 7)
    (q8, dq), (k8, dk), (v8, dv) = cast(q), cast(k), cast(v)
    d = torch.stack([dq, dk, dv])
    x = torch.randn(S, 5376, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(7168, 5376, device="cuda", dtype=torch.bfloat16) / 70
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    gemm = {"bf16": lambda: torch.nn.functional.linear(x, w),
            "fp8": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)}
    att = {"fa4": lambda: FA4Backend()(q, k, v), "cudnn_fp8": lambda: CudnnFP8Backend()(q8, k8, v8, descales=d)}
    for name, fn in att.items():
        for pre in ("none", "bf16", "fp8"):
            if left() < 20:
                return
            burst = None if pre == "none" else (lambda g=gemm[pre]: [g() for _ in range(6)])
            ms = median_ms(fn, warmup=3, iters=8, before=burst)
            rec = {"attention": name, "S": S, "preceded_by": pre,
                   "ms": ms,
                   "t": round(time.monotonic() - T0, 2)}
            emit("power", rec)


def report(doc: dict) -> str:
    """The markdown summary of a probe JSON (python attention_tuning.py --report FILE.json)."""
    lines = [f"# Attention tuning probe ({doc.get('device', '?')}, torch {doc.get('torch', '?')})", ""]
    ab = doc.get("fa4_ab") or []
    if ab:
        lines += ["## FA4 tiles against FA4's default, interleaved (median of 10 rounds)", "",
                  "| run | S | tile (m, n, P in registers, overlap) | ms | TFLOP/s | vs default | bitwise vs default |",
                  "|---:|---:|---|---:|---:|---:|---|"]
        lines += [f"| {r.get('run', '')} | {r['S']} | {tuple(r['tile'])} | {r['ms']:.2f} | {r['tflops']:.0f} | {r['vs_default']:.3f}x | "
                  f"{'yes' if r['bitwise_vs_default'] else 'no'} |" for r in ab]
        lines.append("")
    sweep = [r for r in doc.get("fa4") or [] if "ms" in r or "error" in r]
    if sweep:
        lines += ["## FA4 tile sweep (one after another: later rows ran at a hotter clock)", "",
                  "| S | tile | ms | TFLOP/s | note |", "|---:|---|---:|---:|---|"]
        lines += [f"| {r['S']} | {tuple(r['tile'])} | {r.get('ms', float('nan')):.2f} | {r.get('tflops', float('nan')):.0f} | "
                  f"{r.get('error', '')[:80]} |" for r in sweep]
        lines.append("")
    plans = [r for r in doc.get("cudnn") or [] if "ms" in r]
    if plans:
        lines += ["## cuDNN execution plans (heuristics A, B, fallback; every plan built)", "",
                  "| S | graph | plan | ms | TFLOP/s | rel. diff vs plan 0 |", "|---:|---|---|---:|---:|---:|"]
        lines += [f"| {r['S']} | {r['kind']} | {r['name']} | {r['ms']:.2f} | {r['tflops']:.0f} | {r['rel_vs_first']:.1e} |"
                  for r in plans]
        lines.append("")
    power = doc.get("power") or []
    if power:
        lines += ["## Attention alone vs right after GEMMs (S = 37,820 x 56 heads; 6 GEMMs 37,820 x 5376 -> 7168 before each call)", "",
                  "| attention | preceded by | ms | vs alone |", "|---|---|---:|---:|"]
        alone = {r["attention"]: r["ms"] for r in power if r["preceded_by"] == "none"}
        lines += [f"| {r['attention']} | {r['preceded_by']} GEMMs | {r['ms']:.2f} | {r['ms'] / alone[r['attention']]:.3f}x |"
                  for r in power]
        lines.append("")
    if doc.get("runs"):
        lines += ["## Runs", ""] + [f"- run {k}: {v}" for k, v in doc["runs"].items()] + [""]
    if doc.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--report"]:
    with open(sys.argv[2]) as f:
        print(report(json.load(f)))
    sys.exit(0)

if __name__ == "__main__":
    more = [(128, 128, True, True), (192, 128, False, True), (192, 128, False, False), (192, 128, True, True),
            (128, 128, False, False), (128, 128, True, False), (64, 128, True, True)]
    table = {"sweep": fa4_sweep, "ab": fa4_ab, "ab2": lambda: fa4_ab(rounds=10, configs=list(more)), "cudnn": cudnn_plans, "power": power_probe}
    for section in (table[n] for n in SECTIONS):
        try:
            section()
        except Exception as exc:
            RESULT.setdefault("errors", []).append(f"{section.__name__}: {type(exc).__name__}: {exc}"[:400])
            save()
        torch.cuda.empty_cache()
    RESULT["elapsed_s"] = round(time.monotonic() - T0, 1)
    save()
    print("done in", RESULT["elapsed_s"], "s")

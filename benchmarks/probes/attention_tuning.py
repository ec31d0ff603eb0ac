"""Probe (H200): how much FA4 speed is left on the table at H3's shapes: FA4's SM90 forward over tile
configurations (tile_m, tile_n, mma_pv_is_rs, intra_wg_overlap) at (1, S, 56, 128) for S = 19,000 and 37,820
(FA4's own default is (128, 128, RS, overlap)), swept, then A/B against the default, interleaved. Its cuDNN-plans
and attention-after-GEMMs sections (results kept in the committed JSON, cited nowhere) are in git history:
`git show 87bbc15:benchmarks/probes/attention_tuning.py`.

Each section writes what it measured into $OUT/attention-tuning.json as soon as it has it; a section
that fails records its error and the probe goes on. Usage: python attention_tuning.py [seconds budget]
"""
import json
import os
import statistics
import sys
import time

import torch
from h3plan.actions.bench import Clock, interleaved, median_ms

OUT = os.environ.get("OUT", ".")
BUDGET = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--report" else 420.0
SECTIONS = sys.argv[2:] or ["sweep", "ab"]
T0 = time.monotonic()
H, D = 56, 128
RESULT: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "torch": torch.__version__, "fa4": []}


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
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''
                rec["error"] = f"{type(exc).__name__}: {first}"
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
        times = interleaved(Clock(), fns, 0, rounds)
        base = statistics.median(times[configs[0]])
        for c in configs:
            ms = statistics.median(times[c])
            rec = {"S": S, "tile": list(c), "ms": ms, "tflops": tflops(S, ms), "vs_default": base / ms,
                   "bitwise_vs_default": bitwise[c], "min_ms": min(times[c]), "max_ms": max(times[c])}
            print("fa4_ab", rec, flush=True)
            RESULT["fa4_ab"].append(rec)
        save()
        del q, k, v, ref, fns


def report(doc: dict) -> str:
    """The markdown summary of a probe JSON (python attention_tuning.py --report FILE.json)."""
    lines = [f"# Attention tuning probe ({doc.get('device', '?')}, torch {doc.get('torch', '?')})", ""]
    ab = doc.get("fa4_ab") or []
    if ab:
        lines += ["## FA4 tiles against FA4's default, interleaved (median of 10 rounds)", "",
                  "| run | S | tile (m, n, P in registers, overlap) | ms | TFLOP/s | vs default | bitwise vs default |",
                  "|---:|---:|---|---:|---:|---:|---|"]
        lines += [f"| {r.get('run', '')} | {r['S']} | {tuple(r['tile'])} | {r['ms']:.2f} | {r['tflops']:.0f} | "
                  f"{r['vs_default']:.3f}x | {'yes' if r['bitwise_vs_default'] else 'no'} |" for r in ab]
        lines.append("")
    sweep = [r for r in doc.get("fa4") or [] if "ms" in r or "error" in r]
    if sweep:
        lines += ["## FA4 tile sweep (one after another: later rows ran at a hotter clock)", "",
                  "| S | tile | ms | TFLOP/s | note |", "|---:|---|---:|---:|---|"]
        lines += [f"| {r['S']} | {tuple(r['tile'])} | {r.get('ms', float('nan')):.2f} | "
                  f"{r.get('tflops', float('nan')):.0f} | {r.get('error', '')[:80]} |" for r in sweep]
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
    table = {"sweep": fa4_sweep, "ab": fa4_ab, "ab2": lambda: fa4_ab(rounds=10, configs=list(more))}
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

"""Probe (H200): FP8 activations quantised where they are produced (runtime/kernels/fp8_producers.py,
runtime/quant/fp8_rowwise.py) and the lean q/k/v FP8 cast (runtime/kernels/qk_fp8_lean.py), against today's fp8 plan.

    python benchmarks/probes/fp8_producers.py OUT                    # kernels + qk + block, S = 19,000 and 37,820
    python benchmarks/probes/fp8_producers.py OUT --sections kernels --sweep   # + every tuning config

Sections (JSON in OUT/fp8-producers-h200.json, one line per record on stdout):
- kernels: each producer (modulation -> e4m3, SwiGLU -> e4m3, the attention output's per-row cast) against
  the current path (the bf16 producer kernel + kernels.fp8's amax pass + cast pass), times and fraction of
  copy bandwidth (bytes = fewest the fused kernel must move; the target: >= 0.70), codes and
  descales checked against the torch reference; --sweep adds every SWEEP_CONFIGS entry.
- qk: qk_norm_rope_fp8_lean (dynamic, static), bits checked against its reference (the committed JSON also
  holds a two-pass kernel measured beside it; h3plan ships the lean one only); bytes as in
  benchmarks/cases/attention_ops.py (dynamic: two reads + one write); --sweep adds the lean tilings.
- block: one real-width MiniMaxH3TransformerBlock (hidden 5376, 56 x 128 heads, ffn 14336) at S tokens,
  interleaved rounds: diffusers eager; the installed fp8 plan (per-tensor activation scales: amax + cast
  passes); the same with the lean q/k/v cast; `rowwise_block_forward` below (per-row scales from the
  producers), with the lean cast, with cuDNN's e4m3 attention output fed straight to to_out.0, and with
  static scales calibrated on these inputs. Relative error against eager for each.

`rowwise_block_forward` is the block forward the lever `fp8_act_quant=row|static` would install; it is
written here, apart from h3plan/install/block.py, for the lead to wire in (see its docstring).
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(Path(__file__).resolve().parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

HIDDEN, FFN, INNER, HEADS, HEAD_DIM = 5376, 14336, 7168, 56, 128


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=".")
    p.add_argument("--sections", default="kernels,qk,block")
    p.add_argument("--seqs", type=int, nargs="*", default=[19000, 37820])
    p.add_argument("--sweep", action="store_true", help="also time every tuning config")
    p.add_argument("--rounds", type=int, default=10, help="block section: interleaved rounds")
    p.add_argument("--reps", type=int, default=30, help="kernels: timed calls per case")
    return p.parse_args(argv)


RESULT: dict = {}


def save(out):
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(os.path.join(out, "fp8-producers-h200.json"), "w") as f:
        json.dump(RESULT, f, indent=1)


# ---------------------------------------------------------------------------------------------- block forward
def rowwise_block_forward(block, hidden_states, temb, adaln_indices, rotary_emb, *, act_scales=None,
                          qk_fn=None, attn_codes=False):
    """MiniMaxH3TransformerBlock.forward for an installed fp8 plan (FP8Linear block linears, the plan's
    H3PlanAttnProcessor with cudnn_fp8 and qk_norm_rope=fused_fp8), with every FP8 GEMM input quantised by
    the kernel that produces it, one scale per row (act_scales None) or static scales (act_scales: dict
    qkv / out / ff_in / ff_out -> float):

        norm1 + AdaLN -> rmsnorm_modulate_fp8 -> to_q, to_k, to_v (fp8_linear_codes, one set of codes)
        attention (qk_norm_rope_fp8 or qk_fn, cuDNN FP8) -> bf16 -> cast_rows_fp8 -> to_out.0
            (attn_codes: cuDNN's own e4m3 output and descale_v go to to_out.0 as they are, no bf16 round trip)
        gated residual -> norm2 + AdaLN -> rmsnorm_modulate_fp8 -> ff.net.0.proj -> swiglu_fp8 -> ff.net.2
        gated residual

    Wiring it into h3plan (the lead's change): `fp8_act_quant` block option; in install/block.py's
    `plan_block_forward`, when it is "row"/"static" and the block linears are FP8Linear, call the producers
    through run_guarded("fp8_act_quant", check, fused, fallback) where the fallback is the bf16 kernel/eager
    output followed by quant.fp8_rowwise.quantize_activation_rows (the same codes, so a refused call changes
    no bits), and hand the (codes, descale) pair to the processor (`act_codes=` keyword of
    H3PlanAttnProcessor.__call__, which then runs fp8_linear_codes for to_q/k/v and cast_rows_fp8 ->
    fp8_linear_codes for to_out.0), and feed_forward gets the pair for ff.net.0.proj and swiglu_fp8 for ff.net.2.
    """
    from h3plan.actions.bench.ops import fp8_producers, fp8_rowwise, qk_fp8_lean
    from h3plan.actions.bench.ops import gated_residual as gr

    cast_rows_fp8, rmsnorm_modulate_fp8, swiglu_fp8 = (fp8_producers.cast_rows_fp8, fp8_producers.rmsnorm_modulate_fp8,
                                                       fp8_producers.swiglu_fp8)
    gated_residual, qk_norm_rope_fp8_lean = gr.gated_residual, qk_fp8_lean.qk_norm_rope_fp8_lean
    fp8_linear_codes = fp8_rowwise.fp8_linear_codes

    sc = act_scales or {}
    attn, proc = block.attn, block.attn.processor
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(temb)
    c, d = rmsnorm_modulate_fp8(hidden_states, block.norm1.weight, scale_msa, shift_msa, adaln_indices,
                                block.norm1.eps, "exact", sc.get("qkv"))
    q, k, v = (fp8_linear_codes(c, d, lin).unflatten(-1, (attn.heads, -1)) for lin in (attn.to_q, attn.to_k, attn.to_v))
    fn = qk_fn or proc.kernels.get("qk_norm_rope_fp8", (qk_norm_rope_fp8_lean,))[0]
    q8, k8, v8, descales = fn(q, k, v, attn.norm_q.weight, attn.norm_k.weight, *rotary_emb, attn.norm_q.eps)
    if attn_codes:
        o8 = attention_codes(proc.backend, q8, k8, v8, descales)
        B, S = o8.shape[:2]
        dv = descales[2:3].reshape(1, 1, 1).expand(B, S, 1).contiguous()
        attn_out = fp8_linear_codes(o8.flatten(2, 3), dv, attn.to_out[0])
    else:
        o = proc.attend(q8, k8, v8, descales=descales).flatten(2, 3)
        c, d = cast_rows_fp8(o, sc.get("out"))
        attn_out = fp8_linear_codes(c, d, attn.to_out[0])
    h = gated_residual(hidden_states, gate_msa, adaln_indices, attn_out)
    c, d = rmsnorm_modulate_fp8(h, block.norm2.weight, scale_mlp, shift_mlp, adaln_indices, block.norm2.eps,
                                "exact", sc.get("ff_in"))
    c, d = swiglu_fp8(fp8_linear_codes(c, d, block.ff.net[0].proj), sc.get("ff_out"))
    return gated_residual(h, gate_mlp, adaln_indices, fp8_linear_codes(c, d, block.ff.net[2]))


def attention_codes(backend, q8, k8, v8, descales):
    """cuDNN FP8 attention's e4m3 output (B, S, H, D) before h3plan's backend dequantises it (SM90: FP8 output,
    scale_o = 1 / descale_v, so real ~= code * descale_v). Uses the backend's private graph helpers: a probe
    of the option, not an API."""
    import torch

    from h3plan.actions.bench.ops import cudnn as cd
    from h3plan.actions.bench.ops import fp8

    E4M3, E4M3_MAX = fp8.E4M3, fp8.E4M3_MAX

    o = backend._o(q8)
    if o.dtype != E4M3:
        raise RuntimeError("this device writes bf16 attention output: nothing to pass on as codes")
    dev = q8.device
    d = descales.to(device=dev, dtype=torch.float32).reshape(3)
    one = lambda x: x.reshape(1, 1, 1, 1)  # noqa: E731
    amax = torch.empty(2, 1, 1, 1, device=dev)
    bound = {"q": cd._bhsd(q8), "k": cd._bhsd(k8), "v": cd._bhsd(v8), "o": cd._bhsd(o),
             "dq": one(d[0]), "dk": one(d[1]), "dv": one(d[2]), "ds": cd._const(1.0 / E4M3_MAX, dev),
             "ss": cd._const(E4M3_MAX, dev), "so": one(1.0 / d[2]), "amax_s": amax[0:1], "amax_o": amax[1:2]}
    cd._fp8_graph(bound["q"], bound["k"], bound["v"], bound["o"]).run(bound, dev)
    return o


def calibrate(block, block_in):
    """Static act_scales (448 / amax, margin 1) of the four FP8 GEMM inputs, from one run of the installed
    per-tensor plan on these inputs (the bf16 producer outputs the FP8Linears see)."""
    import torch

    amax = {}
    names = {"qkv": block.attn.to_q, "out": block.attn.to_out[0], "ff_in": block.ff.net[0].proj,
             "ff_out": block.ff.net[2]}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: amax.__setitem__(n,
                                                                                 args[0].float().abs().amax().item()))
             for n, m in names.items()]
    try:
        with torch.no_grad():
            block(*block_in)
    finally:
        for h in hooks:
            h.remove()
    return {n: 448.0 / a for n, a in amax.items()}


# ---------------------------------------------------------------------------------------------- sections
def _timer(reps):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernels import make_timer

    return make_timer(True, reps, 5)


def _codes_equal(got, ref) -> bool:
    import torch

    ok = True
    for a, b in zip(got, ref):
        if a.dtype == torch.float8_e4m3fn:
            nan = b.float().isnan()
            ok &= bool(torch.equal(a.float().isnan(), nan)) and bool(torch.equal(a.view(torch.uint8)[~nan],
                                                                                 b.view(torch.uint8)[~nan]))
        else:
            ok &= bool(torch.equal(a, b))
    return ok


def kernels_section(args, timer, copy_tbps):
    import torch

    from h3plan.actions.bench.ops import fp8 as f8
    from h3plan.actions.bench.ops import fp8_producers as fp
    from h3plan.actions.bench.ops import modulation as mm
    from h3plan.actions.bench.ops import swiglu as sw

    def current(y_fn):
        def run():
            y = y_fn()
            return f8.quantize(y.reshape(-1, y.shape[-1]))
        return run

    recs = []
    for S in args.seqs:
        g = torch.Generator(device="cuda").manual_seed(S)
        x = (torch.randn(1, S, HIDDEN, device="cuda", generator=g) * 2).bfloat16()
        w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=g)).bfloat16()
        shift, scale = (torch.randn(6, 6 * HIDDEN, device="cuda", generator=g) * 0.5).bfloat16().chunk(6, -1)[:2]
        idx = torch.randint(0, 6, (S,), device="cuda", generator=g)
        h = (torch.randn(1, S, 2 * FFN, device="cuda", generator=g) * 2).bfloat16()
        o = torch.randn(1, S, INNER, device="cuda", generator=g).bfloat16()
        cases = [
            ("rmsnorm_modulate_fp8", "modulation", HIDDEN, 3 * S * HIDDEN + 4 * S + 2 * HIDDEN,
             lambda cfg=None: fp._launch_modulate(x, w, scale, shift, idx, 1e-5, "exact", None, config=cfg),
             lambda: fp.rmsnorm_modulate_fp8_ref(x, w, scale, shift, idx, 1e-5),
             current(lambda: mm.rmsnorm_modulate(x, w, scale, shift, idx, 1e-5))),
            ("swiglu_fp8", "swiglu", FFN, 5 * S * FFN + 4 * S,
             lambda cfg=None: fp._launch_swiglu(h, None, config=cfg), lambda: fp.swiglu_fp8_ref(h),
             current(lambda: sw.swiglu(h))),
            ("cast_rows_fp8", "cast", INNER, 3 * S * INNER + 4 * S,
             lambda cfg=None: fp._launch_cast(o, None, config=cfg), lambda: fp.cast_rows_fp8_ref(o),
             current(lambda: o)),
        ]
        for name, kind, width, nbytes, fused, ref, cur in cases:
            exact = _codes_equal(fused(), ref())
            t_cur = timer(cur)
            configs = [None] + (fp.SWEEP_CONFIGS[kind] if args.sweep else [])
            for cfg in configs:
                t = timer(lambda: fused(cfg))
                ok = exact if cfg is None else _codes_equal(fused(cfg), ref())
                label = name if cfg is None else f"{name}[chunks={cfg[0]},w={cfg[1]},maxnreg={cfg[2]}]"
                rec = {"kernel": label, "S": S, "width": width, "fused_ms": round(t, 4), "current_ms": round(t_cur, 4),
                       "speedup_vs_current": round(t_cur / t, 2), "bytes": nbytes,
                       "achieved_TBps": round(nbytes / t / 1e9, 3),
                       "fraction_of_copy": round(nbytes / t / 1e9 / copy_tbps, 3),
                       "bit_exact_vs_ref": ok, "config": list(cfg or fp.CONFIGS[kind].get(width, ()))}
                print("kernels", rec, flush=True)
                recs.append(rec)
        del x, h, o
        torch.cuda.empty_cache()
    return recs


def qk_section(args, timer, copy_tbps):
    import diffusers.models.transformers.transformer_minimax_h3 as tm
    import torch

    from h3plan.actions.bench.ops import qk_fp8_lean as lean
    from h3plan.actions.bench.ops import qk_norm_rope as qk

    recs = []
    rope = tm.MiniMaxH3RotaryPosEmbed(rope_freq_dim=16, rope_theta=10000.0).to("cuda")
    for S in args.seqs:
        g = torch.Generator(device="cuda").manual_seed(S)
        q, k, v = (torch.randn(1, S, HEADS * HEAD_DIM, device="cuda", generator=g).bfloat16() for _ in range(3))
        wq, wk = ((1 + 0.2 * torch.randn(HEAD_DIM, device="cuda", generator=g)).bfloat16() for _ in range(2))
        pos = torch.stack([torch.arange(S) // 2040, (torch.arange(S) // 60) % 34, torch.arange(S) % 60], -1).to("cuda")
        cos, sin = rope(pos)
        u, cs = S * HEADS * HEAD_DIM * 2, 2 * S * cos.shape[-1] * 4
        for mode, kw in (("dynamic", dict(valid_len=S - 37)), ("static", dict(scales=[60.0, 40.0, 50.0]))):
            passes = 2 if mode == "dynamic" else 1
            nbytes = passes * (3 * u + cs) + 3 * u // 2
            ref = qk.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
            arms = {"qk_norm_rope_fp8_lean": lambda: lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, **kw)}
            if args.sweep:
                for c in lean.SWEEP_CONFIGS:
                    def arm(c=c):
                        saved = dict(lean.LAUNCH)
                        lean.LAUNCH.update(c)
                        try:
                            return lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
                        finally:
                            lean.LAUNCH.clear()
                            lean.LAUNCH.update(saved)
                    arms[f"qk_norm_rope_fp8_lean[bt={c['block_t']},bh={c['block_h']},w={c['num_warps']}]"] = arm
            for name, fn in arms.items():
                ok = _codes_equal(fn(), ref)
                t = timer(fn)
                rec = {"kernel": f"{name}[{mode}]", "S": S, "fused_ms": round(t, 4), "bytes": nbytes,
                       "achieved_TBps": round(nbytes / t / 1e9, 3),
                       "fraction_of_copy": round(nbytes / t / 1e9 / copy_tbps, 3), "bit_exact_vs_ref": ok}
                print("qk", rec, flush=True)
                recs.append(rec)
        del q, k, v
        torch.cuda.empty_cache()
    return recs


def block_section(args):
    import torch

    from h3plan import counters, install, reset_counters
    from h3plan.actions import bench as inputs
    from h3plan.actions.bench import Clock, capture_block_inputs, configured, interleaved, rel_error, run_stack
    from h3plan.actions.bench.ops import qk_fp8_lean as lean

    recs = []
    cfg = configured(["hardware=sm90", "parallel=u1", "recipe=fp8"])[0]
    eager = inputs.build_model(cfg["model"]["diffusers_config"], blocks=1, device="cuda", dtype="bf16", seed=0)
    for S in args.seqs:
        cfg, plan = configured(["hardware=sm90", "parallel=u1", "recipe=fp8", f"parallel.seq_len={S}",
                                "levers.fp8_act_quant=tensor"])
        model = copy.deepcopy(eager)
        install(model, plan)
        blk = model.transformer_blocks[0]
        block_in = capture_block_inputs(torch, eager,
                                        inputs.packed_inputs(cfg["model"]["diffusers_config"], S, device="cuda"))
        proc = blk.attn.processor
        lean_kernel = (lean.qk_norm_rope_fp8_lean, lean.qk_norm_rope_fp8_lean_check)

        def with_lean(fn):
            def run():
                saved = proc.kernels.get("qk_norm_rope_fp8")
                proc.kernels["qk_norm_rope_fp8"] = lean_kernel
                try:
                    return fn()
                finally:
                    proc.kernels["qk_norm_rope_fp8"] = saved
            return run

        scales = calibrate(blk, block_in)
        row = lambda **kw: (lambda: rowwise_block_forward(blk, *block_in, **kw))  # noqa: E731
        arms = {
            "eager": lambda: run_stack(eager.transformer_blocks, *block_in),
            "plan_tensor": lambda: blk(*block_in),
            "plan_tensor_qk_lean": with_lean(lambda: blk(*block_in)),
            "row": row(),
            "row_qk_lean": row(qk_fn=lean.qk_norm_rope_fp8_lean),
            "row_qk_lean_attn_codes": row(qk_fn=lean.qk_norm_rope_fp8_lean, attn_codes=True),
            "static_qk_lean": row(act_scales=scales, qk_fn=lean.qk_norm_rope_fp8_lean),
        }
        rec = {"S": S, "static_scales": scales, "errors": {}}
        with torch.no_grad():
            ref = arms["eager"]()
            for name in list(arms):
                try:
                    reset_counters()
                    out = arms[name]()
                    rec.setdefault("counters", {})[name] = str(counters())
                    rec.setdefault("rel_error_vs_eager", {})[name] = rel_error(torch, out, ref)[0]
                    del out
                except Exception as exc:  # noqa: BLE001 -- recorded; the other arms still run
                    rec["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    del arms[name]
            del ref
            t = interleaved(Clock(), arms, 2, args.rounds)
        med = {k: statistics.median(v) for k, v in t.items()}
        rec["ms"] = med
        rec["speedup_vs_eager"] = {k: med["eager"] / v for k, v in med.items()}
        rec["speedup_vs_plan_tensor"] = {k: med["plan_tensor"] / v for k, v in med.items()}
        rec["raw_ms"] = t
        print("block", {k: v for k, v in rec.items() if k not in ("raw_ms", "counters")}, flush=True)
        recs.append(rec)
        del model, block_in, arms
        torch.cuda.empty_cache()
    return recs


def main(argv=None):
    args = _args(argv)
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernels import copy_bandwidth

    timer = _timer(args.reps)
    copy_tbps = copy_bandwidth("cuda", timer, 2 << 30)
    RESULT.update(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_TBps=copy_tbps)
    t0 = time.monotonic()
    for section in args.sections.split(","):
        fn = {"kernels": lambda: kernels_section(args, timer, copy_tbps),
              "qk": lambda: qk_section(args, timer, copy_tbps),
              "block": lambda: block_section(args)}[section]
        try:
            RESULT[section] = fn()
        except Exception as exc:  # noqa: BLE001 -- recorded; the other sections still run
            RESULT.setdefault("errors", []).append(f"{section}: {type(exc).__name__}: {exc}")
            print(f"{section}: {type(exc).__name__}: {exc}", flush=True)
        save(args.out)
        print(f"{section} done at {time.monotonic() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()

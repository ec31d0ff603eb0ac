"""`python -m h3plan action=verify ...`: prove an installed plan against diffusers' eager forward.

Builds a seeded model (`model=h3_tiny` on the CPU, where the Triton kernels run in the interpreter;
real width with `verify.blocks` blocks on a GPU) and one realistic packed sequence (actions/inputs.py),
then runs:

1. diffusers eager, untouched (its own processor and attention dispatch);
2. the reference R: the plan's attention backend alone (attention, fa4_2cta, fp8_scales decisions), every
   other op diffusers' eager code. With sdpa, R must equal (1) bit for bit (the processor is diffusers'
   math); with another backend (1) vs R is that backend's error. Lossless levers are judged against R:
   bitwise equality holds *given the same attention backend*.
   If the backend cannot run on this device (FA4/cuDNN on the CPU), sdpa replaces it on both sides, and
   the output says so;
3. per lever: R's decisions + that one lever; lossless -> bitwise equal to R, lossy -> within the recipe's
   budget (recipe.budget.psnr_db_min) against R;
4. the whole plan, against R (bitwise when the plan is lossless) and against (1) (the budget for lossy plans).

5. the VAE levers (vae_precision, vae_tiles, vae_ops, vae_graphs): the plan installed into a seeded
   AutoencoderKLMiniMaxH3 of `cfg.vae` (float32, as diffusers builds it) and one seeded latent decoded, against
   diffusers' own float32 decode: a lossy VAE plan within the recipe's budget (PSNR and SSIM of the frames), a
   lossless one bitwise (on CUDA; on the CPU the interpreter's kernels are not torch's CPU kernels, so the error
   is printed and the bits are left to the GPU suite). On the CPU this needs a small VAE (vae=h3_tiny).
6. the text encoder's placement (memory.text_encoder), where the plan places one: a seeded conditioner at the plan's
   widths encodes one prompt placed as planned, bitwise against unplaced (verify_text_encoder.py).

Compared: the final hidden state (input of norm_out), the video and audio velocity outputs; max abs,
relative (||a - b|| / ||b||) and PSNR (peak = max |reference|). Every run prints its call counters; a
lever that installed swaps but never took its fused path fails, except FP8/NVFP4 GEMMs (and CUDA graphs) on
hardware that lacks them, whose counted emulation (or diffusers' path) is reported as such.

The verdict: `verify: PASS` (exit 0) only when every check passed and every lossy lever's own path ran and was
judged; `verify: FAIL` (exit 1) when a check failed; `verify: INCOMPLETE` (exit 3) when every check that ran
passed but a lossy lever could not be checked here (only its emulation ran, or verify could not install it),
naming each with why. Lossless levers that could not run here (FA4 on the CPU: sdpa in its place; CUDA graphs)
are named on the PASS line.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from h3plan.runtime.attention import get_backend
from h3plan import prepare
from h3plan.errors import UsageError
from h3plan.install import counters as get_counters, fallback_reasons, install, reset_counters, uninstall
from h3plan.levers import BACKEND_LEVER, COUNTERS, DECODE_LEVERS, OWN_BUDGET_LEVERS, REFERENCE_LEVERS, SPECS, \
    ULYSSES_LEVERS
from h3plan.levers.base import VERIFY_ATTENTION_ERROR, VERIFY_GENERATION
from h3plan.planner import Plan
from h3plan.planning.checkpoint import transformer_folder
from h3plan.facts.decision import make_decision
from h3plan.facts.hardware import gemm_reason

from .gpu_only import VERIFY_SMOKE as CPU_SMOKE, verify_too_wide
from .pipeline_build import build_vae
from .verify_sparse_attention import check as check_sparse_attention
from .verify_step_cache import check as check_step_cache
from .verify_text_encoder import check as check_text_encoder


def platform_limits() -> tuple[str, ...]:
    """A fallback reason starting with one of these is a platform limit: the lever's counted emulation ran."""
    return ("FP8 GEMM needs CUDA", gemm_reason("fp8", None), gemm_reason("nvfp4", None),
            "CUDA graphs need a CUDA device")


OUTPUTS = ("hidden", "video", "audio")
VAE_LEVERS = DECODE_LEVERS  # checked with the VAE decode (check 5), registry order
INCOMPLETE = 3  # exit status: every check that ran passed, a lossy lever could not be checked here


def _cfg_get(cfg, key, default=None):
    try:
        val = cfg.get(key, default)
    except AttributeError:
        val = getattr(cfg, key, default)
    return default if val is None else val


# On the CPU every Triton kernel runs in the interpreter: 48 rows take about half a minute, 384 rows minutes.
CPU_MAX_ROWS = 256
CPU_MAX_BLOCKS = 4


def _prepare_device(name: str, key: str = "verify.device"):
    """Pick the device; on a CPU-only machine Triton must run in its interpreter (set before import). A CUDA
    device this machine lacks is the user's request, refused in one line (UsageError)."""
    import torch

    if name in (None, "auto"):
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if str(name).startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.partition(":")[2] or 0)
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device (torch.cuda.is_available() is False)"
            raise UsageError(f"{key}={name}: this machine has {have}; on the CPU use {key}=cpu (or auto) with "
                             f"model=h3_tiny: {CPU_SMOKE}")
    if name == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:  # triton.language's helpers were made compiled: the interpreter cannot call them
            raise UsageError(f"{key}=cpu runs Triton's interpreter, which must be chosen before triton is imported "
                             "(diffusers and torch._dynamo import it): set TRITON_INTERPRET=1 in the environment")
        os.environ["TRITON_INTERPRET"] = "1"
    return name


@dataclass
class Run:
    outputs: dict
    counters: dict
    reasons: dict
    swapped: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def compare(a, b) -> dict:
    """a vs reference b: bitwise, max_abs, rel (Frobenius), psnr_db (peak = max |b|)."""
    import torch

    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    bitwise = a.dtype == b.dtype and torch.equal(a, b)
    d = a.double() - b.double()
    mse = float((d * d).mean())
    peak = float(b.double().abs().max())
    ref_norm = float(b.double().norm())
    return {"bitwise": bitwise, "max_abs": float(d.abs().max()),
            "rel": float(d.norm()) / ref_norm if ref_norm else math.inf,
            "psnr_db": math.inf if mse == 0 else 10 * math.log10(peak * peak / mse) if peak else -math.inf}


def _fmt(m: dict) -> str:
    if m["bitwise"]:
        return "bitwise"
    ssim = f" ssim {m['ssim']:.4f}" if "ssim" in m else ""
    return f"max {m['max_abs']:.3g} rel {m['rel']:.3g} psnr {m['psnr_db']:.1f}dB{ssim}"


def video_ssim(x, ref) -> float:
    """SSIM (actions/quality.py) of the video output (B, C, F, H, W) against the reference's: every (frame,
    channel) an image, both mapped to [0, 1] by the reference's range. The transformer's latent velocity, not
    decoded frames (those: action=bench target=pipeline)."""
    from .quality import ssim

    lo, hi = float(ref.min()), float(ref.max())
    span = hi - lo if hi > lo else 1.0

    def frames(t):
        return ((t.double() - lo) / span).transpose(1, 2)  # (B, F, C, H, W)

    return ssim(frames(x), frames(ref))


class Verifier:
    def __init__(self, model, inputs, registry=None):
        self.model, self.inputs, self.registry = model, inputs, registry
        self._hidden = None
        self.hook = model.norm_out.register_forward_pre_hook(self._capture)

    def _capture(self, module, args):
        self._hidden = args[0].detach().clone()

    def run(self, plan=None) -> Run:
        import torch

        report = install(self.model, plan, registry=self.registry, stand_in=True) if plan is not None else None
        if report is not None:  # a per-timestep table: these inputs' timestep vector in it too (no-op without one)
            prepare(self.model, timesteps=[self.inputs["timestep"]])
        try:
            reset_counters()
            with torch.no_grad():
                out = self.model(**self.inputs)
            outputs = {"hidden": self._hidden, "video": out.sample, "audio": out.audio_sample}
            return Run(outputs, get_counters(), fallback_reasons(), report.swapped_levers() if report else [],
                       list(report.skipped) if report else [])
        finally:
            uninstall(self.model)


def _subplan(plan, decisions):
    return Plan(config=plan.config, derived=plan.derived, decisions=tuple(decisions), notes=plan.notes)


def _substitute_backend(plan, backend, reason):
    """The plan with `backend` for attention; decisions whose setting needs another backend (the levers'
    SPEC.backends) are dropped, so their levers install nothing."""
    out = []
    for d in plan.decisions:
        if d.lever == BACKEND_LEVER:
            out.append(make_decision(BACKEND_LEVER, backend, True, [f"verify: {reason}"]))
        elif backend not in SPECS[d.lever].backends.get(d.setting, (backend,)):
            continue
        else:
            out.append(d)
    return _subplan(plan, out)


def _single_process(plan):
    """A plan for Ulysses degree U > 1 verified in one process: the Ulysses levers are dropped (their
    exactness is proven by tests/parallel over gloo and the NCCL suite); everything else is kept."""
    degree = int((plan.get("parallel") or {}).get("ulysses", 1))
    try:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:
        world = 1
    if degree == 1 or world == degree:
        return plan
    print(f"plan is for Ulysses degree {degree}, this is one process: verifying without "
          f"{', '.join(ULYSSES_LEVERS)} (proven over gloo by tests/parallel and tests/install/test_install_ulysses.py)")
    return _subplan(plan, [d for d in plan.decisions if d.lever not in ULYSSES_LEVERS])


def _backend_of(plan):
    for d in plan.decisions:
        if d.lever == BACKEND_LEVER:
            return d.setting
    return "sdpa"


def _availability(backend, model, device, dtype):
    import torch

    attn = model.transformer_blocks[0].attn
    q = torch.zeros(1, 16, attn.heads, attn.head_dim, device=device, dtype=dtype)
    return get_backend(backend).unavailable_reason(q, q, q)


def _budget(plan):
    recipe = plan.get("recipe") or {}
    budget = recipe.get("budget") or {}
    return budget.get("psnr_db_min")


class Report:
    def __init__(self):
        self.ok = True
        self.lines: list[str] = []
        self.results: list[tuple[str, bool, str]] = []  # (name, ok, verdict): action=tune's kernel checks
        self.unchecked: dict[str, str] = {}  # lossy lever=setting -> why it could not be checked here
        self.not_run: dict[str, str] = {}  # lossless lever=setting -> why it did not run here

    def skip(self, name: str, why: str, lossless: bool) -> None:
        (self.not_run if lossless else self.unchecked).setdefault(name, why)

    def verdict(self) -> tuple[str, int]:
        if not self.ok:
            return "verify: FAIL", 1
        if self.unchecked:
            return ("verify: INCOMPLETE: every check that ran passed, but not checked here: "
                    + "; ".join(f"{k} ({v})" for k, v in self.unchecked.items()), INCOMPLETE)
        if self.not_run:
            return "verify: PASS (lossless, not run here: " + "; ".join(f"{k}: {v}"
                                                                        for k, v in self.not_run.items()) + ")", 0
        return "verify: PASS", 0

    def line(self, name, verdict, metrics=None, counters=None, ok=True):
        self.ok &= ok
        self.results.append((name, bool(ok), verdict))
        parts = [f"{'PASS' if ok else 'FAIL'}  {name:<34} {verdict}"]
        if metrics:
            parts.append("  " + "; ".join(f"{k} {_fmt(m)}" for k, m in metrics.items()))
        text = "".join(parts)
        if counters:
            text += "\n        counters: " + counters
        self.lines.append(text)
        print(text, flush=True)


def _counter_text(run: Run, levers) -> str:
    parts = []
    for lever in levers:
        f, fb = run.counters.get(f"{lever}.fused", 0), run.counters.get(f"{lever}.fallback", 0)
        if f or fb:
            why = run.reasons.get(lever)
            parts.append(f"{lever} fused {f} fallback {fb}" + (f" ({'; '.join(why)})" if why else ""))
    return ", ".join(parts) or "(no guarded calls)"


def _engaged(run: Run, lever: str) -> tuple[bool, str]:
    key = COUNTERS.get(lever)
    if key is None:
        return True, "no per-call counter"
    if run.counters.get(f"{key}.fused", 0) > 0:
        return True, "fused path ran"
    reasons = run.reasons.get(key, {})
    if reasons and all(r.startswith(platform_limits()) for r in reasons):
        return True, "emulated here: " + "; ".join(reasons)
    return False, "fused path never ran: " + ("; ".join(reasons) or "no calls")


def verify(model, inputs, plan, *, registry=None, device="cpu", dtype=None, header=None, vae=None, results=None) -> int:
    """Run the checks of the module docstring on a built model and inputs; prints them; returns the verdict's exit
    status (0 PASS, 1 FAIL, 3 INCOMPLETE). vae: (vae, latent) or why there is none, for check 5 (None: no VAE check,
    the plan's VAE levers are left out of the verdict). `results` (a list) receives (name, ok, verdict) per check
    line."""
    import torch

    dtype = dtype or torch.bfloat16
    rep = Report()
    if header:
        print(header)
    plan = _single_process(plan)
    v = Verifier(model, inputs, registry)
    eager = v.run(None)
    # judged by their own budget, checked after the whole plan's forward (whether or not their backend runs here)
    own = [d for d in plan.decisions if d.enabled and SPECS[d.lever].verify == VERIFY_ATTENTION_ERROR]
    backend = _backend_of(plan)
    why = _availability(backend, model, device, dtype)
    if why is not None:
        print(f"attention backend {backend!r} cannot run here ({why}): sdpa replaces it on both sides")
        for d in plan.decisions:
            if d.lever == BACKEND_LEVER or (d.enabled and backend in SPECS[d.lever].backends.get(d.setting, ())):
                rep.skip(f"{d.lever}={d.setting}", f"{backend} cannot run here, sdpa in its place", d.lossless)
        plan = _substitute_backend(plan, "sdpa", f"{backend} unavailable: {why}")
        backend = "sdpa"
    print(f"lossless levers are judged against the reference R: attention={backend} on both sides, every "
          "other op diffusers' eager code")
    base = [d for d in plan.decisions if d.lever in REFERENCE_LEVERS]
    if not any(d.lever == BACKEND_LEVER for d in base):
        base.insert(0, make_decision(BACKEND_LEVER, "sdpa", True, ["verify: the plan names no backend"]))
    ref = v.run(_subplan(plan, base))
    budget = _budget(plan)
    m = {k: compare(ref.outputs[k], eager.outputs[k]) for k in OUTPUTS}
    same = all(x["bitwise"] for x in m.values())
    if backend == "sdpa":
        rep.line("R (attention=sdpa) vs diffusers", "bitwise equal" if same else "DIFFERS", None if same else m,
                 _counter_text(ref, [BACKEND_LEVER]), ok=same)
    else:
        lossy = any(not d.lossless for d in base)
        ok = True if not lossy else budget is not None and min(x["psnr_db"] for x in m.values()) >= budget
        rep.line(f"R (attention={backend}) vs diffusers", "backend error" + (f" (budget {budget} dB)" if lossy else ""),
                 m, _counter_text(ref, [lv for lv in REFERENCE_LEVERS if lv in COUNTERS]), ok=ok)
        rep.ok &= ref.counters.get(f"{COUNTERS[BACKEND_LEVER]}.fused", 0) > 0

    alone = []  # decisions their own run could not install (one that needs another lever): the whole plan's run may
    for d in plan.decisions:
        if d.lever in REFERENCE_LEVERS:
            continue
        if not d.enabled:
            print(f"SKIP  {d.lever + '=' + d.setting:<34} off in the plan")
            continue
        strategy = SPECS[d.lever].verify
        if strategy == VERIFY_GENERATION:  # one forward says nothing about skipped ones: a generation
            check_step_cache(model, inputs, plan, d, rep, compare, registry)
            continue
        if strategy == VERIFY_ATTENTION_ERROR:  # verify's forward is off the schedule (dense): its own check, below
            continue
        if d.lever in VAE_LEVERS:
            print(f"SKIP  {d.lever + '=' + d.setting:<34} a VAE lever: "
                  + ("checked with the VAE below" if vae is not None else "this verify builds no VAE"))
            continue
        run = v.run(_subplan(plan, base + [d]))
        name = f"{d.lever}={d.setting}"
        if d.lever not in run.swapped:
            why = next((r for lv, r in run.skipped if d.lever in lv), "nothing to install on this model")
            if not d.lossless:  # a lossless lever with nothing to install leaves diffusers' own op: nothing to check
                rep.skip(name, why, d.lossless)
            alone.append(d)
            print(f"SKIP  {name:<34} {why} (alone; the whole plan below may run it)")
            continue
        engaged, how = _engaged(run, d.lever)
        if how.startswith("emulated here"):
            rep.skip(name, f"only its emulation ran: {how.removeprefix('emulated here: ')}", d.lossless)
        m = {k: compare(run.outputs[k], ref.outputs[k]) for k in OUTPUTS}
        if d.lossless:
            same = all(x["bitwise"] for x in m.values())
            rep.line(name, ("bitwise equal to R" if same else "NOT bitwise equal to R") + f"; {how}",
                     None if same else m, _counter_text(run, [d.lever]), ok=same and engaged)
        else:
            psnr = min(x["psnr_db"] for x in m.values())
            ok = budget is not None and psnr >= budget and engaged
            rep.line(name, f"lossy vs R, budget psnr >= {budget} dB; {how}", m, _counter_text(run, [d.lever]), ok=ok)

    whole = v.run(plan)
    for d in alone:  # installed with the rest of the plan: checked by the whole-plan lines below when its path ran
        engaged, how = _engaged(whole, d.lever)
        if d.lever in whole.swapped and how == "fused path ran":
            rep.unchecked.pop(f"{d.lever}={d.setting}", None)
            rep.not_run.pop(f"{d.lever}={d.setting}", None)
            print(f"NOTE  {d.lever + '=' + d.setting:<34} ran in the whole plan (fused path ran): "
                  f"judged by its lines below")
    levers = [d.lever for d in plan.decisions]
    m_ref = {k: compare(whole.outputs[k], ref.outputs[k]) for k in OUTPUTS}
    m_eager = {k: compare(whole.outputs[k], eager.outputs[k]) for k in OUTPUTS}
    for d in own:  # the attention error per keep fraction (verify_sparse_attention.py), FA4 or not
        check_sparse_attention(model, inputs, d, rep)
        rep.skip(f"{d.lever}={d.setting}", "verify's one forward is off the step schedule (dense): FA4's "
                 "block-sparse forward runs in tests/gpu/test_sparse_attention_gpu.py and "
                 "benchmarks/sparse_attention_h200.py", False)
    # one forward off the cache's schedule computes every forward, and runs dense attention
    if all(d.lossless or d.lever in OWN_BUDGET_LEVERS for d in plan.decisions):
        same = all(x["bitwise"] for x in m_ref.values())
        rep.line("whole plan vs R", "bitwise equal" if same else "NOT bitwise equal", None if same else m_ref,
                 _counter_text(whole, levers), ok=same)
    else:
        psnr = min(x["psnr_db"] for x in m_eager.values())
        if not m_eager["video"]["bitwise"]:
            m_eager["video"]["ssim"] = video_ssim(whole.outputs["video"], eager.outputs["video"])
        ssim_min = ((plan.get("recipe") or {}).get("budget") or {}).get("ssim_min")
        rep.line("whole plan vs diffusers eager", f"lossy, budget psnr >= {budget} dB (ssim >= {ssim_min} is the "
                 "frames' budget; video ssim here is the latent velocity's)", m_eager,
                 _counter_text(whole, levers), ok=budget is not None and psnr >= budget)
        rep.line("whole plan vs R", "error against the same backend", m_ref, ok=True)
    v.hook.remove()
    if vae is not None:
        verify_vae(vae, plan, rep, device=device)
    check_text_encoder(plan, rep, compare, device=device)
    if results is not None:
        results.extend(rep.results)
    line, rc = rep.verdict()
    print(line)
    return rc


def verify_vae(case, plan, rep: Report, *, device="cpu") -> None:
    """Check 5 of the module docstring. case: (vae, latent), or a string saying why verify could not build one (every
    enabled VAE lever is then reported as not checked)."""
    import torch

    decisions = [d for d in plan.decisions
                 if d.lever in VAE_LEVERS and d.enabled and d.setting != "default"]  # as `runs`
    if not decisions:
        return
    if isinstance(case, str):
        for d in decisions:
            rep.skip(f"{d.lever}={d.setting}", case, d.lossless)
        print(f"SKIP  {'VAE levers':<34} {case}")
        return
    vae, z = case
    with torch.no_grad():
        ref = vae.decode(z).sample
    report = install(vae, _subplan(plan, decisions))
    try:
        reset_counters()
        with torch.no_grad():
            out = vae.decode(z).sample
        counts, reasons = get_counters(), fallback_reasons()
    finally:
        uninstall(vae)
    swapped = report.swapped_levers()
    for d in decisions:
        name = f"{d.lever}={d.setting}"
        if d.lever not in swapped:
            why = next((r for lv, r in report.skipped if d.lever in lv), "nothing to install on this VAE")
            if not d.lossless:
                rep.skip(name, why, d.lossless)
            print(f"SKIP  {name:<34} {why}")
            continue
        # less .fused/.fallback
        for key in sorted({k.rpartition(".")[0] for k in counts if k.startswith(d.lever + ".")}):
            why = list(reasons.get(key, {}))
            if counts.get(f"{key}.fused", 0):
                continue
            if why and all(r.startswith(platform_limits()) for r in why):
                rep.skip(name, f"{key}: only diffusers' path or its emulation ran: " + "; ".join(why), d.lossless)
            else:
                rep.line(name, f"{key}: fused path never ran: " + ("; ".join(why) or "no calls"), ok=False)
    m = compare(out.float(), ref)
    lossy = [f"{d.lever}={d.setting}" for d in decisions if not d.lossless]
    counted = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k.startswith("vae_")) or "(no guarded calls)"
    if lossy:
        b = (plan.get("recipe") or {}).get("budget") or {}
        m["ssim"] = video_ssim(out.float(), ref)
        ok = (b.get("psnr_db_min") is not None and m["psnr_db"] >= b["psnr_db_min"]
              and m["ssim"] >= (b.get("ssim_min") or 0))
        rep.line("VAE plan vs diffusers decode",
                 f"lossy ({', '.join(lossy)}), budget psnr >= {b.get('psnr_db_min')} dB, "
                 f"ssim >= {b.get('ssim_min')} (frames)", {"frames": m}, counted, ok=ok)
    elif device == "cpu":
        print(f"NOTE  {'VAE plan vs diffusers decode':<34} lossless: bitwise on CUDA "
              f"(tests/gpu/test_install_vae_gpu.py); here the interpreter's kernels against torch's CPU ops: frames "
              f"{_fmt(m)}")
    else:
        rep.line("VAE plan vs diffusers decode", "bitwise equal" if m["bitwise"] else "NOT bitwise equal",
                 None if m["bitwise"] else {"frames": m}, counted, ok=m["bitwise"])


def _cpu_size(seq_len: int, blocks: int | None) -> None:
    """Refuse a CPU verify that would run for many minutes in the Triton interpreter, with the smoke form."""
    if seq_len > CPU_MAX_ROWS:
        raise UsageError(f"verify.seq_len={seq_len}: at most {CPU_MAX_ROWS} rows on the CPU (the Triton interpreter "
                         f"takes minutes per few hundred rows; longer runs need a GPU): {CPU_SMOKE}")
    if blocks is not None and int(blocks) > CPU_MAX_BLOCKS:
        raise UsageError(f"verify.blocks={blocks}: at most {CPU_MAX_BLOCKS} blocks on the CPU (the Triton interpreter; "
                         f"more need a GPU): {CPU_SMOKE}")


def run(cfg, plan, *, registry=None) -> int:
    """CLI entry: cfg is the composed config (cfg.model.diffusers_config, cfg.verify.*), plan the resolved Plan.
    registry: lever installers (default h3plan.levers.REGISTRY)."""
    vcfg = _cfg_get(cfg, "verify", {})
    device = _prepare_device(_cfg_get(vcfg, "device", "auto"))
    import torch

    from .inputs import build_model, layout, load_model, packed_inputs, resolve_dtype

    path = _cfg_get(cfg.model, "path", None)  # model.path: a checkpoint's weights instead of seeded ones
    if path:
        dcfg = transformer_folder(path)[2]
    else:
        dcfg = cfg.model.diffusers_config
    dtype = resolve_dtype(_cfg_get(vcfg, "dtype", "bf16"))
    seed = int(_cfg_get(vcfg, "seed", 0))
    if device == "cpu" and int(dcfg["hidden_size"]) > 1024:
        raise UsageError(verify_too_wide())
    default_len = 48 if device == "cpu" else int(_cfg_get(_cfg_get(cfg, "parallel", {}), "seq_len", 19000))
    seq_len = int(_cfg_get(vcfg, "seq_len", default_len))
    blocks = _cfg_get(vcfg, "blocks", None)
    if device == "cpu":
        _cpu_size(seq_len, blocks)
    if path:
        model = load_model(path, blocks=blocks, device=device, dtype=dtype)
    else:
        model = build_model(dcfg, blocks=blocks, device=device, dtype=dtype, seed=seed)
    inputs = packed_inputs(dcfg, seq_len, seed=seed, device=device)
    n_text, n_audio, n_video = layout(seq_len)
    a = model.transformer_blocks[0].attn
    where = "Triton interpreter" if device == "cpu" else torch.cuda.get_device_name(device)
    header = (f"verify: {len(model.transformer_blocks)} blocks, hidden {model.config.hidden_size}, "
              f"{a.heads}x{a.head_dim} heads; S={seq_len} (text {n_text}, audio {n_audio}, video {n_video}); {device} "
              f"({where}); {dtype}; " + (f"weights from {path}; input seed {seed}" if path else f"seed {seed}"))
    return verify(model, inputs, plan, registry=registry, device=device, dtype=dtype, header=header,
                  vae=_vae_case(cfg, device, seed))


def _vae_case(cfg, device, seed):
    """(a seeded float32 VAE of cfg.vae, a seeded latent) for check 5, or why not (a real-width VAE on the CPU)."""
    import torch

    vcfg = _cfg_get(_cfg_get(cfg, "vae", {}), "diffusers_config", None)
    if vcfg is None:
        return "no VAE config (vae=)"
    width = int(vcfg["decoder_num_attention_heads"]) * int(vcfg["decoder_attention_head_dim"])
    small = width <= 1024
    if device == "cpu" and not small:
        return f"vae={_cfg_get(cfg.vae, 'name', '?')} is real width (decoder {width}): on the CPU pass vae=h3_tiny"
    vae = build_vae(vcfg, device=device, seed=seed + 1)
    # the tiny VAE: one 3-frame clip of 6x6 latents (one tile); released: 4 latent frames at 48x84 (768x1344 px)
    frames, h, w = (3, 6, 6) if small else (4, 48, 84)
    g = torch.Generator("cpu").manual_seed(seed + 2)
    z = torch.randn(1, int(vcfg["latent_channels"]), frames, h, w, generator=g).to(device)
    return vae, z

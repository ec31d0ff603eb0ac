"""Calibrate static FP8 scales for MiniMax-H3: observe every FP8 site, build the table, check it on held-out inputs.

Sites, the values FP8 consumes, in every transformer block (the token refiner never runs FP8):
- attention: Q, K and V after per-head RMSNorm + RoPE (cuDNN FP8 attention's inputs), observed inside an
  attention processor that otherwise runs diffusers' MiniMaxH3AttnProcessor math and attention dispatch,
  so the observed forward is diffusers' own, bit for bit;
- linears: the input of every FP8 block linear (forward pre-hooks): to_q (whose input to_k and to_v share:
  norm1's modulated output, so their rows are copies), to_out.0, ff.net.0.proj, ff.net.2.

Per site: amax = max |x| over every calibration input (a device max per call, no host sync until the end),
and optionally a percentile of |x| over all of them from a log2 histogram (1/16-octave bins; the
percentile is its bin's upper edge, so at most 2^(1/16) - 1 = 4.4 % high).

Held-out check (`heldout_check`): on inputs disjoint from the calibration set, the BF16 eager forward E,
the FP8 forward with dynamic per-tensor scales D and with the table's static scales S. The FP8 sites are
the plan's: FP8 linears through h3plan.runtime.quant.fp8.FP8Linear (the FP8 GEMM on SM89+, its counted emulation
elsewhere), FP8 attention through h3plan's cudnn_fp8 backend where it runs, else the torch emulation of
cuDNN's FP8 forward (h3plan.runtime.attention.fp8.emulate, heads in chunks so the scores fit). Reported: the
fraction of values beyond amax * margin per site (saturated to +-448 by the static cast), and D and S
against E (relative Frobenius error and PSNR with peak max |E|, h3plan.actions.verify.compare) on the
final hidden state and the video and audio outputs, worst over inputs. The table passes when S's worst
PSNR is at least the budget and, on the blocks' own update (final hidden state minus the stack's input),
S loses at most `max_loss_db` to D (see `heldout_check` for why both).

Inputs: `seeded_inputs` (h3plan.actions.inputs.packed_inputs: text, audio and video rows of one packed
request, the timestep pair of a step of diffusers' MiniMaxH3Scheduler schedules) or `load_inputs` (the
user's captured forward keyword arguments; `capture_inputs` records them from a running pipeline).
Synthetic inputs have standard-normal latents and conditioning: they exercise the shapes, modalities and
noise levels, not the statistics of real prompts; a table for production comes from captured inputs.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch

from h3plan import __version__
from h3plan.actions.inputs import packed_inputs
from h3plan.actions.verify import compare
from h3plan.runtime.attention import get_backend
from h3plan.runtime.attention.fp8 import emulate
from h3plan.errors import UsageError
from h3plan.install.hooks import attach, effect, remove_all
from h3plan.install.installer import installed_plan, recognise
from h3plan.runtime.kernels.fp8 import scale_from_amax
from h3plan.facts.scale_table import FORMAT, VERSION, values_hash
from h3plan.runtime.quant import BLOCK_LINEARS, quantized_linear

LINEAR_SITES = ("attn.to_q", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")  # to_k/to_v: to_q's input
SHARED_WITH_TO_Q = ("attn.to_k", "attn.to_v")
QKV = ("q", "k", "v")
FORWARD_KEYS = ("hidden_states", "audio_hidden_states", "encoder_hidden_states", "timestep", "timestep_indices",
                "token_tags", "position_ids", "video_indices", "audio_indices", "text_indices")
OUTPUTS = ("hidden", "video", "audio")
HIST_LO, HIST_HI, HIST_PER_OCTAVE = -64, 32, 16
SCORE_BYTES = 1 << 30  # fp32 scores per emulated attention chunk


@dataclass
class CalibInput:
    """One forward's keyword arguments, made on demand (`make()`), with what the provenance records of it."""

    label: str
    make: Callable[[], dict]
    meta: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ inputs


def schedule(num_inference_steps: int, video_shift: float, audio_shift: float) -> list[tuple[float, float]]:
    """(video t, audio t) of every model evaluation of diffusers' two MiniMaxH3Scheduler schedules (t = 1 - sigma)."""
    from diffusers import MiniMaxH3Scheduler

    out = []
    for shift in (video_shift, audio_shift):
        s = MiniMaxH3Scheduler(shift=shift)
        s.set_timesteps(num_inference_steps)
        out.append([float(t) for t in s.timesteps])
    return list(zip(*out))


def seeded_inputs(config, seq_len: int, seeds, steps, pairs, *, device="cpu", role="calibration") -> list[CalibInput]:
    """seeds x steps packed requests; step i uses timestep = [video t, audio t] of `pairs[i]` (video and text rows
    on the first, audio rows on the second: packed_layout's timestep_indices). Latents and conditioning are drawn
    from seed * 1000003 + step, so every (seed, step) is its own input."""
    out = []
    for seed in seeds:
        for step in steps:
            tv, ta = pairs[step]

            def make(seed=seed, step=step, tv=tv, ta=ta):
                kw = packed_inputs(config, seq_len, seed=seed * 1000003 + step, device=device)
                kw["timestep"] = torch.tensor([tv, ta], device=device)
                return kw

            out.append(CalibInput(f"{role} seed {seed} step {step} (t video {tv:.3f}, audio {ta:.3f})", make,
                                  {"seed": seed, "step": step, "t_video": tv, "t_audio": ta}))
    return out


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def input_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".pt"))
        if not files:
            raise UsageError(f"calibration inputs {path}: a directory without .pt files")
        return files
    if not os.path.isfile(path):
        raise UsageError(f"calibration inputs {path}: no such file or directory")
    return [path]


def load_inputs(path: str, *, device="cpu") -> list[CalibInput]:
    """Captured inputs: a .pt file holding one dict of MiniMaxH3Transformer3DModel.forward keyword arguments
    (or a list of them), or a directory of such files (sorted by name). Refused in one line: a file torch cannot
    load, a missing or unknown key, a non-tensor value."""
    out = []
    for f in input_files(path):
        try:
            obj = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input
            raise UsageError(f"calibration inputs {f}: torch.load failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200]})") from None
        items = obj if isinstance(obj, (list, tuple)) else [obj]
        sha = _sha(f)
        for j, kw in enumerate(items):
            where = f"{f}" + (f"[{j}]" if len(items) > 1 else "")
            if not isinstance(kw, dict):
                raise UsageError(f"calibration inputs {where}: expected a dict of forward keyword arguments, got "
                                 f"{type(kw).__name__}")
            kw = {k: v for k, v in kw.items() if k not in ("return_dict", "attention_kwargs")}
            missing = [k for k in FORWARD_KEYS if k not in kw]
            unknown = sorted(set(kw) - set(FORWARD_KEYS))
            if missing or unknown:
                raise UsageError(f"calibration inputs {where}: "
                                 + (f"missing {missing[0]!r}" if missing else f"unknown key {unknown[0]!r}")
                                 + f"; MiniMaxH3Transformer3DModel.forward takes {', '.join(FORWARD_KEYS)}")
            bad = next((k for k, v in kw.items() if not isinstance(v, torch.Tensor)), None)
            if bad:
                raise UsageError(f"calibration inputs {where}: {bad} must be a tensor, got {type(kw[bad]).__name__}")

            def make(kw=kw):
                return {k: v.to(device) for k, v in kw.items()}

            out.append(CalibInput(os.path.basename(where), make,
                                  {"file": os.path.basename(f), "index": j, "sha256": sha,
                                                                   "seq_len": int(kw["position_ids"].shape[0])}))
    return out


@contextmanager
def capture_inputs(model, directory: str):
    """Save the keyword arguments of every forward of `model` (a MiniMaxH3Transformer3DModel inside a running
    pipeline) as directory/input_NNNNN.pt, CPU tensors, for `calibrate.inputs=directory`."""
    os.makedirs(directory, exist_ok=True)
    names = list(inspect.signature(type(model).forward).parameters)[1:]
    count = [len([f for f in os.listdir(directory) if f.endswith(".pt")])]

    def hook(module, args, kwargs):
        kw = {**dict(zip(names, args)), **kwargs}
        kw = {k: v.detach().cpu() for k, v in kw.items() if k in FORWARD_KEYS and isinstance(v, torch.Tensor)}
        torch.save(kw, os.path.join(directory, f"input_{count[0]:05d}.pt"))
        count[0] += 1

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield directory
    finally:
        handle.remove()


# ------------------------------------------------------------------------------------------------ sites


class _Stats:
    """Per-site running amax and log2 |x| histogram (device tensors), and the static check's clip counts."""

    def __init__(self, percentile: float | None):
        self.percentile = percentile
        self.amax: dict = {}
        self.hist: dict = {}
        self.clipped: dict = {}
        self.total: dict = {}

    def observe(self, site, x):
        a = x.detach().abs()
        m = a.amax().float()
        self.amax[site] = m if site not in self.amax else torch.maximum(self.amax[site], m)
        if self.percentile is not None:
            bins = (HIST_HI - HIST_LO) * HIST_PER_OCTAVE
            logs = a.float().clamp_(2.0 ** HIST_LO, 2.0 ** HIST_HI).log2_()
            h = torch.histc(logs, bins=bins, min=HIST_LO, max=HIST_HI).double()
            self.hist[site] = h if site not in self.hist else self.hist[site] + h

    def clip(self, site, x, limit):
        c = (x.detach().abs() > limit).sum()
        self.clipped[site] = c if site not in self.clipped else self.clipped[site] + c
        self.total[site] = self.total.get(site, 0) + x.numel()

    def value(self, site) -> float:
        return float(self.amax[site])

    def quantile(self, site) -> float:
        h = self.hist[site]
        cum = h.cumsum(0)
        i = int((cum < cum[-1] * (self.percentile / 100.0)).sum())
        return 2.0 ** (HIST_LO + (i + 1) / HIST_PER_OCTAVE)


HOOK = "calibrate"  # the observers are named diffusers hooks h3plan.calibrate[.<part>], taken off by close()

class _Run:
    """Observers on a MiniMaxH3Transformer3DModel; `mode` picks what a forward does:
    observe: diffusers' math, statistics recorded; eager: diffusers' math; dynamic / static: the FP8 sites
    (`fp8_attention`, `fp8_linears`) with dynamic or the table's static scales (static counts clipping)."""

    def __init__(self, model, stats: _Stats, *, fp8_attention=False, fp8_linears=False):
        recognise(model)
        if installed_plan(model) is not None:
            raise UsageError("calibrate runs on the plain diffusers model: uninstall the h3plan plan first")
        if any(b.attn.fused_projections for b in model.transformer_blocks):
            raise UsageError("calibrate needs separate to_q/to_k/to_v: call model.unfuse_qkv_projections() first")
        self.model, self.stats = model, stats
        self.fp8_attention, self.fp8_linears = fp8_attention, fp8_linears
        self.mode = "observe"
        self.descales: dict = {}  # attention fqn -> (3,) static descales
        self.limits: dict = {}  # site -> static amax * margin (clip threshold)
        self.attention_impl = None
        self._cudnn, self._hidden, self._stack_in, self._fp8 = None, None, None, []
        self.hooks: list = []  # (module, hook name): the observers, named diffusers hooks (install/hooks.py)
        with self._removed_on_error():
            self._attach()

    # ---- setup
    @contextmanager
    def _removed_on_error(self):
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _attach(self):
        for i, block in enumerate(self.model.transformer_blocks):
            fqn = f"transformer_blocks.{i}.attn"
            attn, old = block.attn, block.attn.processor
            effect(attn, HOOK, self, lambda a=attn, o=old: a.set_processor(o), part="processor", fqn=fqn,
                   apply=lambda a=attn, f=fqn, o=old: a.set_processor(_SiteProcessor(f, self, o)))
            for path in LINEAR_SITES:
                site = f"transformer_blocks.{i}.{path}"
                attach(block.get_submodule(path), site, HOOK, self._seen(self._linear_hook(site)), self, replaces=False)
        attach(self.model.norm_out, "norm_out", HOOK, self._seen(self._capture_hidden), self, replaces=False)
        attach(self.model.transformer_blocks[0], "transformer_blocks.0", HOOK, self._seen(self._capture_stack_input),
               self, replaces=False)

    @staticmethod
    def _seen(observe):
        """A wrapping forward that hands `observe` the module's first input, then runs the module."""
        def forward(previous, *args, **kwargs):
            observe(args[0] if args else next(iter(kwargs.values())))
            return previous(*args, **kwargs)

        return forward

    def _capture_hidden(self, x):
        self._hidden = x.detach()

    def _capture_stack_input(self, x):
        self._stack_in = x.detach()

    def _linear_hook(self, site):
        def hook(x):
            if self.mode == "observe":
                self.stats.observe(site, x)
            elif self.mode == "static" and self.fp8_linears:
                self.stats.clip(site, x, self.limits[site])

        return hook

    def set_table(self, attention: dict, linears: dict, margin: float):
        """Static scales of the check: descale = amax * margin / 448 per attention (the installer's rule), and
        FP8 linears quantising with amax * margin."""
        dev = next(self.model.parameters()).device
        for fqn, row in attention.items():
            a = torch.tensor([row[c] for c in QKV], dtype=torch.float32, device=dev)
            self.descales[fqn] = 1.0 / scale_from_amax(a, margin)
            for c, x in zip(QKV, a):
                self.limits[(fqn, c)] = x * margin
        for site, amax in linears.items():
            self.limits[site] = torch.tensor(amax * margin, dtype=torch.float32, device=dev)

    def _swap_linears(self, on: bool):
        """FP8 block linears in (quantised once, kept), or the originals back."""
        if on and not self._fp8:
            for i, block in enumerate(self.model.transformer_blocks):
                for path in BLOCK_LINEARS:
                    parent_path, _, name = path.rpartition(".")
                    parent = block.get_submodule(parent_path)
                    orig = getattr(parent, name)
                    new = quantized_linear(orig, "fp8")
                    site = f"transformer_blocks.{i}.{path}"
                    if path in LINEAR_SITES:
                        attach(new, site, HOOK, self._seen(self._linear_hook(site)), self, replaces=False)
                    self._fp8.append((parent, name, orig, new, site))
            effect(self.model, HOOK, self, lambda: self._swap_linears(False), part="fp8_linears")
        for parent, name, orig, new, site in self._fp8:
            setattr(parent, name, new if on else orig)

    def close(self):
        """Every observer off, the last attached first: the model as it was given."""
        remove_all(self)

    # ---- forwards
    def forward(self, kwargs, mode: str) -> dict:
        self.mode = mode
        fp8 = mode in ("dynamic", "static") and self.fp8_linears
        if self.fp8_linears:
            self._swap_linears(fp8)
            for parent, name, orig, new, site in self._fp8:
                new.input_amax = self.limits[site] if mode == "static" else None  # amax * margin, or dynamic
        with torch.no_grad():
            out = self.model(**kwargs)
        return {"hidden": self._hidden, "video": out.sample, "audio": out.audio_sample,
                "update": self._hidden - self._stack_in}

    def attention(self, fqn, q, k, v, original):
        if self.mode == "observe":
            for c, x in zip(QKV, (q, k, v)):
                self.stats.observe((fqn, c), x)
        if self.mode in ("dynamic", "static") and self.fp8_attention:
            if self.mode == "static":
                for c, x in zip(QKV, (q, k, v)):
                    self.stats.clip((fqn, c), x, self.limits[(fqn, c)])
                d = self.descales[fqn]
            else:
                d = 1.0 / scale_from_amax(torch.stack([x.abs().amax().float() for x in (q, k, v)]))
            return self._fp8_attention(q, k, v, d)
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        return dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     backend=original._attention_backend, parallel_config=original._parallel_config)

    def _fp8_attention(self, q, k, v, descales):
        if q.is_cuda and self._cudnn is None:
            backend = get_backend("cudnn_fp8")
            why = backend.unavailable_reason(q, k, v)
            self._cudnn = backend if why is None else False
            self.attention_impl = ("cuDNN FP8 (h3plan cudnn_fp8 backend)" if why is None
                                   else f"torch emulation of cuDNN FP8 ({why})")
        if q.is_cuda and self._cudnn:
            return self._cudnn(q, k, v, descales=descales)
        if self.attention_impl is None:
            self.attention_impl = "torch emulation of cuDNN FP8 (h3plan.runtime.attention.fp8.emulate)"
        B, S, H, _ = q.shape
        step = max(1, SCORE_BYTES // max(1, 4 * B * S * S))
        outs = [emulate(q[:, :, h:h + step], k[:, :, h:h + step], v[:, :, h:h + step], descales, out_dtype=q.dtype)
                for h in range(0, H, step)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class _SiteProcessor:
    """diffusers' MiniMaxH3AttnProcessor math (projections, per-head RMSNorm, RoPE, attention dispatch,
    flatten + type_as, to_out) with the run's observer / FP8 attention between RoPE and attention."""

    def __init__(self, fqn: str, run: _Run, original):
        self.fqn, self.run, self.original = fqn, run, original

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

        if attention_mask is not None:
            raise UsageError("calibrate: MiniMax-H3 packs no attention mask, but one was passed")
        query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if rotary_emb is not None:
            query, key = _apply_rotary_emb(query, *rotary_emb), _apply_rotary_emb(key, *rotary_emb)
        out = self.run.attention(self.fqn, query, key, value, self.original)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


# ------------------------------------------------------------------------------------------------ steps


def say(line: str) -> None:
    print(line, flush=True)


def observe(model, inputs: list[CalibInput], *, percentile: float | None = 99.99, progress=None) -> _Stats:
    """Run `inputs` through the model with observers at every FP8 site; returns the statistics."""
    progress = progress or say
    stats = _Stats(percentile)
    run = _Run(model, stats)
    try:
        for n, inp in enumerate(inputs, 1):
            t0 = time.perf_counter()
            run.forward(inp.make(), "observe")
            progress(f"calibrate: observed {n}/{len(inputs)} {inp.label} ({time.perf_counter() - t0:.2f}s)")
    finally:
        run.close()
    return stats


def rows(stats: _Stats, num_blocks: int, statistic: str = "amax") -> tuple[dict, dict, dict | None]:
    """(attention {fqn: {q, k, v}}, linears {fqn: amax}, percentile section or None) from the statistics;
    statistic "percentile" puts the percentile in the table instead of the amax."""
    if statistic not in ("amax", "percentile"):
        raise UsageError(f"calibrate.statistic={statistic}: allowed: amax, percentile")
    if statistic == "percentile" and stats.percentile is None:
        raise UsageError("calibrate.statistic=percentile needs calibrate.percentile (a number in (0, 100])")

    def table(value):
        att, lin = {}, {}
        for i in range(num_blocks):
            fqn = f"transformer_blocks.{i}.attn"
            att[fqn] = {c: value((fqn, c)) for c in QKV}
            for path in LINEAR_SITES:
                lin[f"transformer_blocks.{i}.{path}"] = value(f"transformer_blocks.{i}.{path}")
            for path in SHARED_WITH_TO_Q:
                lin[f"transformer_blocks.{i}.{path}"] = lin[f"transformer_blocks.{i}.attn.to_q"]
        return att, lin

    amax = table(stats.value)
    pct = table(stats.quantile) if stats.percentile is not None else None
    att, lin = pct if statistic == "percentile" else amax
    zero = next((k for k, r in att.items() for c in QKV if not r[c] > 0),
                None) or next((k for k, v in lin.items() if not v > 0), None)
    if zero is not None:
        raise UsageError(f"calibrate: site {zero} saw only zeros (or its {statistic} is 0): no FP8 scale can be "
                         f"calibrated")
    section = None if pct is None else {"p": stats.percentile, "attention": pct[0], "linears": pct[1]}
    return att, lin, section


def heldout_check(model, inputs: list[CalibInput], attention: dict, linears: dict, *, margin: float,
                  budget_psnr_db: float, max_loss_db: float | None = 3.0, fp8_attention: bool = True,
                  fp8_linears: bool = True, progress=None) -> dict:
    """Static vs dynamic FP8 scales against the BF16 eager forward on held-out inputs (module docstring).

    Passes when (1) the static scales' worst PSNR over the outputs (final hidden state, video, audio) is at
    least `budget_psnr_db`, and (2) on the blocks' own contribution (the final hidden state minus the stack's
    input) static scales lose at most `max_loss_db` of PSNR to dynamic ones (None: no such limit). (2) is
    there because a residual stream much larger than the blocks' updates (random weights, early layers) hides
    the blocks' error in (1); and e4m3 is a float format, so a scale only moves its range: what a good table
    costs over dynamic scales is clipping and underflow, near 0 dB."""
    progress = progress or say
    if not inputs:
        raise UsageError("calibrate: the held-out set is empty (calibrate.heldout_seeds / heldout_inputs)")
    stats = _Stats(None)
    run = _Run(model, stats, fp8_attention=fp8_attention, fp8_linears=fp8_linears)
    worst = {m: {"psnr_db": math.inf, "rel": 0.0, "where": None, "update_psnr_db": math.inf}
             for m in ("dynamic", "static")}
    loss = {"db": -math.inf, "where": None}
    try:
        run.set_table(attention, linears, margin)
        for n, inp in enumerate(inputs, 1):
            t0 = time.perf_counter()
            kw = inp.make()
            ref = run.forward(kw, "eager")
            line, upd = [], {}
            for mode in ("dynamic", "static"):
                got = run.forward(kw, mode)
                ms = {o: compare(got[o], ref[o]) for o in OUTPUTS}
                w = worst[mode]
                for o, m in ms.items():
                    if m["psnr_db"] < w["psnr_db"] or w["where"] is None:
                        w.update(psnr_db=m["psnr_db"], where=f"{o} of {inp.label}")
                    w["rel"] = max(w["rel"], m["rel"])
                upd[mode] = compare(got["update"], ref["update"])["psnr_db"]
                w["update_psnr_db"] = min(w["update_psnr_db"], upd[mode])
                line.append(f"{mode} psnr {min(m['psnr_db'] for m in ms.values()):.1f} dB (blocks' update "
                            f"{upd[mode]:.1f} dB)")
            d = upd["dynamic"] - upd["static"] if math.isfinite(upd["dynamic"]) else 0.0
            if d > loss["db"]:
                loss.update(db=d, where=inp.label)
            progress(f"calibrate: held-out {n}/{len(inputs)} {inp.label}: {', '.join(line)} "
                     f"({time.perf_counter() - t0:.2f}s)")
    finally:
        run.close()
    fractions = {(s if isinstance(s, str) else f"{s[0]}.{s[1]}"): float(stats.clipped[s]) / stats.total[s]
                 for s in stats.clipped}
    worst_site = max(fractions, key=fractions.get) if fractions else None
    in_budget = worst["static"]["psnr_db"] >= budget_psnr_db
    close = max_loss_db is None or loss["db"] <= max_loss_db
    limit = "no limit" if max_loss_db is None else f"at most {max_loss_db:g}"
    summary = (f"static scales psnr {worst['static']['psnr_db']:.1f} dB vs dynamic {worst['dynamic']['psnr_db']:.1f} "
               f"dB, budget {budget_psnr_db:g} dB{'' if in_budget else ' EXCEEDED'}; on the blocks' update static "
               f"loses {max(loss['db'], 0.0):.1f} dB to dynamic ({limit}{'' if close else ': EXCEEDED'}); "
               f"clipped at most {fractions.get(worst_site, 0.0):.3g} ({worst_site or 'no FP8 site'})")
    return {"passed": in_budget and close, "summary": summary, "budget_psnr_db": budget_psnr_db, "inputs": len(inputs),
            "margin": margin, "max_loss_db": max_loss_db, "update_loss_db": round(loss["db"], 3),
            "update_loss_at": loss["where"],
            "fp8_sites": {"attention": run.attention_impl if fp8_attention else None,
                          "linears": "h3plan.runtime.quant.fp8.FP8Linear (FP8 GEMM, or its emulation off SM89+)"
                          if fp8_linears else None},
            "static": _finite(worst["static"]), "dynamic": _finite(worst["dynamic"]),
            "clipped": {"max_fraction": fractions.get(worst_site, 0.0), "worst_site": worst_site,
                        "sites": {k: round(v, 8) for k, v in sorted(fractions.items())}}}


def _finite(w: dict) -> dict:
    """JSON has no inf: a bitwise-equal output is reported as psnr null (exact)."""
    db = {k: None if math.isinf(w[k]) else round(w[k], 3) for k in ("psnr_db", "update_psnr_db")}
    return {**w, **db, "rel": float(w["rel"])}


def calibrate(model, inputs: list[CalibInput], heldout: list[CalibInput], *, margin: float, budget_psnr_db: float,
              max_loss_db: float | None = 3.0, fp8_attention: bool = True, fp8_linears: bool = True,
              statistic: str = "amax",
              percentile: float | None = 99.99, provenance: dict | None = None, progress=None) -> dict:
    """Observe, build the version-2 table, run the held-out check; returns the table dict (written or not by
    the caller: provenance.heldout.check.passed says whether it may be used)."""
    if not inputs:
        raise UsageError("calibrate: the calibration set is empty")
    stats = observe(model, inputs, percentile=percentile, progress=progress)
    att, lin, pct = rows(stats, len(model.transformer_blocks), statistic)
    check = heldout_check(model, heldout, att, lin, margin=margin, budget_psnr_db=budget_psnr_db,
                          max_loss_db=max_loss_db,
                          fp8_attention=fp8_attention, fp8_linears=fp8_linears, progress=progress)
    prov = dict(provenance or {})
    prov.setdefault("inputs", {"count": len(inputs), "items": [i.meta for i in inputs]})
    heldout_prov = dict(prov.get("heldout") or {"count": len(heldout), "items": [i.meta for i in heldout]})
    heldout_prov["check"] = check
    prov.update(heldout=heldout_prov, margin=margin, statistic=statistic if statistic == "amax" else f"p{percentile:g}",
                h3plan_version=__version__, values_sha256=values_hash(att, lin),
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    table = {"format": FORMAT, "version": VERSION, "provenance": prov, "attention": att, "linears": lin}
    if pct is not None:
        table["percentile"] = pct
    return table


__all__ = ["CalibInput", "schedule", "seeded_inputs", "load_inputs", "capture_inputs", "observe", "rows",
           "heldout_check",
           "calibrate"]

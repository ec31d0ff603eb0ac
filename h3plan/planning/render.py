"""The plan as text: the summary `python -m h3plan` prints (and print(plan) gives) and the full table (detail=full).
Torch-free and Hydra-free: it reads only the Plan's data."""

from __future__ import annotations

import re
import textwrap

from h3plan.facts.attention import BACKENDS, DEFAULT
from h3plan.facts.ring_plan import preset_degrees, ring_degree
from h3plan.levers import CONDITIONER_PLACEMENT, SPECS, not_installed, terms

from .derive import ORDER, efficiency_key
from .memory import usable_gib
from h3plan.facts.tuned import measured_on, stale


def _request_lines(plan, width: int) -> list[str]:
    """`request` (where S comes from) and `memory` (the peak per GPU) lines of the table header."""
    seq = plan.derived_value("sequence") or {}
    if seq.get("source") == "parallel.seq_len":
        other = seq.get("video_request_seq_len")
        req = (f"parallel.seq_len={seq['seq_len']:,} set explicitly"
               + (f" (the video request would give {other:,})" if other else ""))
        if seq.get("video_request_refused"):
            req += f" (the video request does not apply: {seq['video_request_refused'].partition(':')[0]})"
    elif seq:
        audio = f"{seq['audio_rows']:,} audio + " if seq.get("audio_rows") else "no audio + "
        cond = {"fl2va": "keyframe", "ref2va": "reference"}.get(seq.get("task"))  # t2va: no conditioning rows
        if cond:
            audio = (f"{seq['condition_video_rows']:,} {cond} video + "
                     + (f"{seq['condition_audio_rows']:,} {cond} audio + "
                     if seq.get("condition_audio_rows") else "") + audio)
        task = f" ({seq['task']}, {seq['partition']}/)" if cond else ""
        req = (f"{seq['source']}{task}: {seq['height']}x{seq['width']} px, {seq['frames']} frames "
               f"({seq['seconds']:.2f} s at {seq['fps']:g} fps); {seq['text_rows']:,} text + "
               f"{audio}{seq['video_rows']:,} video rows = {seq['seq_len']:,} tokens; {seq['transformer_forwards']} "
               f"transformer forwards (num_inference_steps {seq['num_inference_steps']})")
    else:
        return []
    apart = plan.derived_value("components_apart")
    texts = ["request  " + req + (f"; {apart}" if apart else "")]
    peak, breakdown = plan.derived_value("memory_peak_gib_per_gpu"), plan.derived_value("memory_breakdown_gib") or {}
    if peak is not None:
        texts += _memory_texts(plan, peak, breakdown)
    out = []
    for t in texts:
        w = _wrap(t, width, 9)
        out += [w[0]] + [" " * 9 + x for x in w[1:]]
    return out


ANOTHER_CARD_GB = 80  # the memory line's example of another card (an H100's); 141 (an H200's) where the plan has 80


def _memory_texts(plan, peak: float, breakdown: dict) -> list[str]:
    """`memory` (the peak per GPU against what the plan may use, in GiB, and its largest items) and `install` (a
    pipeline on the host moved by install, against one moved to the GPU whole first)."""
    items = plan.derived_value("memory_peak_items") or list(breakdown)
    top = sorted(items, key=lambda k: -breakdown[k])[:3]
    gb, reserve = plan.get("hardware").get("device", {}).get("memory_gb"), plan.get("memory")["reserve_fraction"]
    phase = {"denoise": "denoising", "decode": "decoding", "install": "installing", "encode": "encoding"}.get(
        plan.derived_value("memory_peak_phase"), "running")
    usable = usable_gib(gb, reserve) if gb else None
    line = f"memory   peak {peak:.1f} GiB per GPU while {phase}"
    if usable is not None:
        other = 141 if gb == ANOTHER_CARD_GB else ANOTHER_CARD_GB  # an example, never the memory the plan has
        line += (f", of {usable:.1f} GiB usable ({gb:g} GB = {usable_gib(gb, 0):.1f} GiB less the {reserve:.0%} "
                 f"memory.reserve_fraction; another card: hardware.device.memory_gb={other})")
    which = f"its largest {len(top)} of {len(items)} items" if len(items) > len(top) else "its items"
    line += f"; {which}: " + ", ".join(f"{k} {breakdown[k]:.1f}" for k in top) + " GiB"
    if plan.derived_value("memory_does_not_fit"):
        line += "; DOES NOT FIT (memory.check=false: reported, not refused)"
    te = plan.derived_value(CONDITIONER_PLACEMENT)
    if te:  # the conditioner's placement, when model.text_encoder plans one (planning/text_encoder.py)
        line += f"; text encoder {te['setting']}: {te['reasons'][0]}"
    texts = [line]
    inst, loaded = plan.derived_value("memory_install_gib"), plan.derived_value("memory_loaded_gib")
    if inst is not None and loaded is not None:
        whole = "does not fit: load it on the host" if usable is not None and loaded > usable else "fits"
        texts.append(f"install  install(pipe, plan, device=\"cuda\") on a pipeline loaded on the host peaks at "
                     f"{inst:.1f} GiB per GPU; the pipeline moved to the GPU whole before install (pipe.to(\"cuda\")) "
                     f"holds {loaded:.1f} GiB ({whole})")
    host, host_items = plan.derived_value("memory_host_gib"), plan.derived_value("memory_host_items_gib") or {}
    if host:  # what install keeps on the host: it checks the host's available memory before each copy
        texts.append(f"host     {host:.1f} GiB kept in host memory per process: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in sorted(host_items.items(), key=lambda kv: -kv[1]))
                     + " GiB")
    return texts


# ---------------------------------------------------------------- table


def _wrap(text: str, width: int, indent: int) -> list[str]:
    return textwrap.wrap(text, width=max(40, width - indent), break_long_words=False, break_on_hyphens=False) or [""]


EVIDENCE = re.compile(r"^(measured on |published |calibrated |evidence \(|unmeasured)|never measured|has not measured")
"""A reason of a lossy decision that states the error it was measured to cause, or that it never was."""


def evidence(d) -> list[str]:
    """The reasons of decision `d` that state its measured (or published) error, or say there is none."""
    return [x for x in d.reasons if EVIDENCE.search(x)]


def _policy(plan) -> str:
    """The recipe's policy as the plan runs it: a lossless policy with a lossy setting the recipe chose itself
    (recipe.vae=fp16, recipe.cache) is not lossless."""
    r = plan.get("recipe")
    if r["policy"] != "lossless":
        return f"budget PSNR>={r['budget']['psnr_db_min']} dB SSIM>={r['budget']['ssim_min']}"
    lossy = [d.lever for d in plan.decisions if not d.lossless]
    return f"lossy by its own choice: {', '.join(lossy)}" if lossy else "lossless"


def _header(plan) -> str:
    hw, r, p, m = (plan.get(k) for k in ("hardware", "recipe", "parallel", "model"))
    policy = _policy(plan)
    mesh = "" if ring_degree(p) == 1 else f" x ring {ring_degree(p)}"
    option = hw.get("option") or hw["name"]
    extends = "" if option == hw["name"] else f"as {hw['name']}: "  # a file of your own over a packaged one
    gb = hw.get("device", {}).get("memory_gb")
    device = f"{extends}{'/'.join(hw.get('products') or []) or hw['arch']}" + (f", {gb:g} GB" if gb else "")
    tier = f" tier={r['tier']['name']}" if r.get("tier") else ""
    return (f"h3plan  hardware={option} ({device})  "
            f"recipe={r['name']}{tier} ({policy})  {_parallel_label(p)} (Ulysses {p['ulysses']}{mesh}, "
            f"{p['seq_len']:,} tokens)  model={m['name']}")


def _parallel_label(p) -> str:
    """`parallel=u1`, or `parallel=u1 with parallel.ulysses=56` where a field overrides the degrees its preset's name
    gives (presets are named r<ring>u<ulysses>)."""
    named = preset_degrees(str(p["name"]))
    if named is None:
        return f"parallel={p['name']}"
    changed = [f"parallel.{k}={p.get(k, 1)}" for k, v in named.items() if p.get(k, 1) != v]
    return f"parallel={p['name']}" + (f" with {' '.join(changed)}" if changed else "")


def _labelled(label: str, text: str, width: int) -> list[str]:
    w = _wrap(text, width, 9)
    return [f"{label:<8} {w[0]}"] + [" " * 9 + x for x in w[1:]]


def _speed_text(plan) -> str:
    """The predicted forward (per block: attention, block linears, elementwise, all-to-all) and the whole call (text
    encode, denoise, decode), its biggest share and the cheapest cut (h3plan/planning/predict.py), and what they rest
    on."""
    hw = plan.get("hardware")
    att, gemm, a2a, el = (plan.derived_value(k) for k in ("attention_ms_per_block_est", "gemm_ms_per_block_est",
                                                          "a2a_ms_per_block_est", "elementwise_ms_per_block_est"))
    ratios = _assumed_ratios(plan, hw)
    if att is None or gemm is None:
        missing = [f"{what} at {dtype}" for what, dtype, key, r in ratios if r is None]
        return (f"no estimate on {hw['name']}: neither measured there nor an assumed share of a vendor peak at the "
                f"same precision for its {' and '.join(missing) or 'attention or GEMMs'} (detail=full shows the basis)")
    parts = ([f"attention {att:.1f}", f"block linears {gemm:.1f}"]
             + ([f"elementwise {el:.1f}"] if el is not None else []) + ([f"all-to-all {a2a:.1f}"] if a2a else []))
    if hw.get("measured", {}).get("on_hardware"):
        basis = _measured_on(hw)
    else:  # both rates assumed (a measured rate on hardware never run on would make on_hardware true)
        shares = ", ".join(f"{what} {r:g} x its {dtype} peak" for what, dtype, key, r in ratios if r is not None)
        basis = (f"an assumed share of {hw['name']}'s vendor peak, {shares} (the H200's measured ratios at those "
                 "precisions): never measured there")
    layers = plan.get("model").get("diffusers_config", {}).get("num_layers")
    text = (f"forward {plan.derived_value('forward_s_est'):.2f} s = {layers} blocks x ({' + '.join(parts)} ms) per GPU "
            f"({basis}" + ("" if el is not None else "; elementwise work not counted") + ")")
    den, dec = plan.derived_value("denoise_s_est"), plan.derived_value("decode_s_est")
    n = (plan.derived_value("sequence") or {}).get("transformer_forwards")
    m = plan.derived_value("computed_forwards") or n  # step_cache's fixed schedule runs fewer
    what = f"{m} computed forwards of {n}" if m != n else f"{n} forwards"
    fs = plan.derived_value("forward_sparse_s_est")
    if fs is not None:  # sparse_attention: the forwards past its dense ones run at the sparse forward's time
        what += f" (sparse ones at {fs:.2f} s)"
    if den is None:
        return text
    if dec is None:
        return text + f"; x {what} = {den:,.0f} s of denoising; no decode time measured on {hw['name']}"
    big = plan.derived_value("call_biggest")
    te = plan.derived_value(CONDITIONER_PLACEMENT) or {}
    te_s = te.get("call_s") if te.get("call_s") == te.get("call_s") else None  # nan: no BF16 rate to time it
    encode = (f" + text encode {te_s:.1f} s ({te['setting']})" if te_s is not None
              else " (text encoder outside: prompt_embeds given)")
    call_s = plan.derived_value("call_s_est")
    if call_s is None:  # an fl2va / ref2va request whose encode has no time on this hardware
        return text + (f"; x {what} = {den:,.0f} s of denoising + decode {dec:,.1f} s; no VAE encode time on "
                       f"{hw['name']} (hardware.measured.encode; action=tune measures it)")
    enc = plan.derived_value("encode_s_est")
    venc = "" if enc is None else (f" + VAE encode {enc:,.1f} s"
                                   + (" (estimate, not measured)" if _estimated(hw) else ""))
    span = plan.derived_value("call_s_range_est")  # an adaptive cache: the most it may skip .. every forward computed
    if span:
        fewest = next(d.param("fewest_computed") for d in plan.decisions if d.param("fewest_computed") is not None)
        head = (f"call {span[0]:,.0f}-{call_s:,.0f} s = {fewest}..{n} of {n} forwards "
                f"computed (the adaptive cache), at most {den:,.0f} s")
    else:
        head = f"call {call_s:,.0f} s = {what} {den:,.0f} s"
    spread = next((d for d in plan.decisions if terms({d.lever: d}).vae_spread), None)
    where = "" if spread is None else f" over {plan.get('parallel').get('ulysses')} GPUs ({spread.lever})"
    text += (f"; {head} + decode {dec:,.{1 if dec >= 1 else 2}f} s{where}{venc}{encode}; most: {big['part']} "
             f"{big['share']:.0%}: {big['cut']}")
    return text


def _assumed_ratios(plan, hw) -> list[tuple[str, str, str, float | None]]:
    """(what, precision, hardware.efficiency key, ratio) of the forward's attention and block linears: the share of
    the vendor peak an estimate assumes at that precision (derive.efficiency_key)."""
    t = terms({d.lever: d for d in plan.decisions})
    eff = hw.get("efficiency") or {}
    out = []
    for what, kind, dtype in (("attention", "attention", BACKENDS[t.attention_backend].precision),
                              ("block linears", "gemm", t.gemm_dtype or "bf16")):
        key = efficiency_key(kind, dtype)
        out.append((what, dtype, key, eff.get(key)))
    return out


def _estimated(hw) -> bool:
    """The encode points the plan's encode time rests on are estimates (their source says so)."""
    return any(str(p.get("source", "")).startswith("estimate") for p in hw.get("measured", {}).get("encode") or ())


def _measured_on(hw) -> str:
    return measured_on(hw["tuned"]) if hw.get("tuned") else f"measured on {hw['name']}"


def _tuned_text(hw) -> str:
    """The `tuned` line: where the file was measured, and whether the running versions still match it."""
    t = hw["tuned"]
    diff, unknown = stale(t)
    text = f"{measured_on(t)} (hardware.tuned, made by: {t['command']})"
    failed = [f"{c['lever']}={c['setting']}" for c in t.get("checks") or () if not c["passed"]]
    if failed:
        text += f"; kernel checks failed there, refused: {', '.join(failed)}"
    if diff:
        text += f"; STALE: {'; '.join(diff)} (strict=true refuses it; tune again)"
    if unknown:
        text += f"; not compared here: {', '.join(unknown)}"
    return text


def _short(reasons: list[str], room: int) -> str:
    """The reasons without their parenthesised sources, cut to `room` characters at a word."""
    text = re.sub(r"\s+([;:,])(?=\s|$)", r"\1", " ".join("; ".join(_unsourced(x) for x in reasons).split()))
    if len(text) <= room:
        return text
    return text[: room - 3].rsplit(" ", 1)[0].rstrip(";,:") + "..."


def _unsourced(text: str) -> str:
    """`text` without the parentheses that cite a source (a path, a config key, a datasheet, a measurement), and
    without those that enclose one."""
    out, stack = [], []  # stack: [start index in `out`, encloses a source] per open parenthesis
    for ch in text:
        out.append(ch)
        if ch == "(":
            stack.append([len(out) - 1, False])
        elif ch == ")" and stack:
            start, inner_source = stack.pop()
            if inner_source or re.search(r"/|hardware\.|seed|datasheet|measured|anchors", "".join(out[start:])):
                del out[start:]
                if stack:
                    stack[-1][1] = True
    return "".join(out)


def _shown_reasons(d) -> list[str]:
    # the header and the summary carry the budget and the hardware-verified marker
    return [x for x in d.reasons if not x.startswith("not hardware-verified")
            and " allows lossy levers within " not in x] or list(d.reasons[:1])


def _table_rows(ds):
    """The decisions the tables print: a lever declared table_skips_off (Spec) is left out where it is off."""
    return [d for d in ds if not (SPECS[d.lever].table_skips_off and d.setting == "off")]


def _tier_parts_off(plan) -> str:
    """A tier's budgeted part (a lever whose recipe section the tier gave a budget) that plans off, with its first
    reason: the tier's line names what the stack lost (a forced attention backend that takes no block mask, a request
    with no forward past the dense ones), where the lever's own line and row are absent."""
    r = plan.get("recipe")
    off = [d for d in plan.decisions if (sec := SPECS[d.lever].recipe_section) and d.setting == "off"
           and any((r.get(sec) or {}).get(k) is not None for k in ("psnr_db_min", "ssim_min", "policy"))]
    return "".join(f"; not in this plan: {d.lever}=off ({d.reasons[0] if d.reasons else 'no reason recorded'})"
                   for d in off)


def _runs(d, plan) -> bool:
    """The lever changes what runs: a setting that is not off or diffusers' default, and no Ulysses lever at Ulysses
    degree 1 (no exchange to act on: its row says so)."""
    return d.enabled and d.setting != "default" and not (SPECS[d.lever].ulysses
                                                         and plan.get("parallel")["ulysses"] == 1)


def _lossless_text(plan) -> str:
    """Lossless is diffusers' eager bits given the plan's attention backend: say whose frames those are, how far from
    stock diffusers' where measured (hardware.measured.stock_frames), and the setting that keeps stock bits."""
    att, hw = terms({d.lever: d for d in plan.decisions}).attention_backend, plan.get("hardware")
    if att == DEFAULT:
        u = plan.get("parallel")["ulysses"]
        return ("every lever keeps diffusers' eager bits with its default attention (torch SDPA, attention=sdpa): "
                "stock diffusers' frames, bit for bit" + ("" if u == 1 else f" on one GPU (Ulysses {u}: the exchange "
                                                          "keeps one GPU's bits where hardware.verified says it ran)"))
    seen = [x for x in hw.get("measured", {}).get("stock_frames") or [] if x["attention"] == att]
    far = f" (PSNR {seen[0]['psnr_db']:.1f} dB from them at {seen[0]['shape']} on {hw['name']})" if seen else ""
    return (f"the frames are diffusers' eager frames with {att} as the attention, bit for bit; {att} rounds its own "
            f"way, so they are not stock diffusers' frames{far}; stock diffusers' bits on one GPU: "
            f"levers.attention=sdpa (diffusers' default, torch SDPA)")


def render_summary(plan, width: int = 120) -> str:
    """The default table: what runs, what is lossy and its budget, what has no kernel, what never ran on this
    hardware, the memory and speed estimates, then one line per lever (detail=full: every reason, its sources
    and the derived numbers)."""
    ds = plan.decisions
    missing = {d.lever: not_installed(d) for d in ds}
    lines = _summary_lines(plan, width)
    lines += ["", f"{'lever':<21} {'setting':<12} {'note':<9}   why (detail=full: every reason and its source)"]
    pad = 21 + 1 + 12 + 1 + 9 + 3
    for d in _table_rows(ds):
        flag = "no kernel" if missing[d.lever] else "" if d.lossless else "lossy"
        mark = "*" if not d.hardware_verified else " "
        why = _short(_shown_reasons(d), width - pad)
        lines.append(f"{d.lever:<21} {d.setting:<12} {flag:<9} {mark} {why}".rstrip())
    lines += ["", "every reason with its sources, and the derived numbers: detail=full; for machines: format=yaml|json"]
    return "\n".join(lines) + "\n"


def _summary_lines(plan, width: int) -> list[str]:
    """The labelled lines above the lever table, the same in the summary and in detail=full: the header, the request,
    memory and install, the speed, what runs, what is lossy or lossless, what has no kernel, what never ran here."""
    hw, r = plan.get("hardware"), plan.get("recipe")
    ds = plan.decisions
    lines = [_header(plan), *_request_lines(plan, width)]
    if hw.get("tuned"):
        lines += _labelled("tuned", _tuned_text(hw), width)
    lines += _labelled("speed", _speed_text(plan), width)
    running = [d for d in ds if _runs(d, plan)]
    runs = [f"{d.lever}={d.setting}" for d in running]
    lines += _labelled("runs", ", ".join(runs) or "diffusers' own ops only", width)
    own = [d for d in ds if not d.lossless and SPECS[d.lever].recipe_section]  # judged by their own recipe budget
    lossy = [d.lever for d in ds if not d.lossless and not SPECS[d.lever].recipe_section]
    for label, text in sorted(SPECS[d.lever].budget_line(d) for d in own if SPECS[d.lever].budget_line):
        lines += _labelled(label, text, width)
    if r.get("tier"):  # a named stack: each part's evidence is on its own line above or below; the stack's here
        lines += _labelled("tier", f"{r['tier']['name']}: each lossy part is judged by its own evidence and budget "
                                   f"(the fewer, sparse and lossy lines); the stack as a whole: "
                                   f"{r['tier']['evidence']}{_tier_parts_off(plan)}", width)
    if lossy and r["policy"] == "lossless":  # the recipe's own lossy choice: no budget, its measured error
        chosen = [d for d in ds if d.lever in lossy]
        lines += _labelled("lossy", "; ".join(
            f"{d.lever}={d.setting}, the recipe's own lossy choice outside its lossless policy: "
            + (_short(evidence(d), 1000) or "its error was never measured by h3plan") for d in chosen), width)
    elif lossy:
        b = r["budget"]
        lines += _labelled("lossy", f"{', '.join(lossy)}: the output may differ from diffusers' eager output within "
                                    f"PSNR >= {b['psnr_db_min']} dB, SSIM >= {b['ssim_min']} (action=verify checks one "
                                    f"forward against it, seeded or model.path's weights; no published measurement "
                                    f"of these levers' video quality on H3)", width)
    elif not own:
        lines += _labelled("lossless", _lossless_text(plan), width)
    missing = {d.lever: not_installed(d) for d in ds}
    for d in ds:
        if missing[d.lever]:
            lines += _labelled("kernel", f"{d.lever}={d.setting} has no kernel yet: install skips it "
                                         f"({missing[d.lever]})", width)
    unverified = [d for d in running if not d.hardware_verified]  # a setting that is off runs nothing untested
    if not any(d.hardware_verified for d in ds):
        never = f"h3plan has never run on {hw['name']}: every setting here is a prediction (marked *)"
    elif unverified:
        never = (f"{', '.join(f'{d.lever}={d.setting}' for d in unverified)}: never run on {hw['name']} by h3plan "
                 f"(marked *)")
    else:
        never = f"every setting here passed h3plan's GPU suite on {hw['name']} (hardware.verified)" + (
            f" or its check on {hw['tuned']['device']} (hardware.tuned)" if hw.get("tuned") else "")
    lines += _labelled("untested" if unverified else "verified", never, width)
    forced = [f"levers.{d.lever}={d.setting}" for d in ds if d.forced]
    if forced:
        lines += _labelled("forced", ", ".join(forced) + " (asked for, and checked that it can apply)", width)
    return lines


def render_table(plan, width: int = 120) -> str:
    """detail=full: the summary's lines, then every decision with all its reasons and sources, every derived number
    with its basis, and the notes."""
    lines = [*_summary_lines(plan, width), "", f"{'lever':<21} {'setting':<12} {'lossless':<8}   why"]
    pad = 21 + 1 + 12 + 1 + 8 + 3
    for d in _table_rows(plan.decisions):
        reasons = _shown_reasons(d)
        mark = "*" if not d.hardware_verified else " "
        head = f"{d.lever:<21} {d.setting:<12} {'yes' if d.lossless else 'no':<8} {mark} "
        body = [w for x in reasons for w in _wrap(("- " if len(reasons) > 1 else "") + x, width, pad)]
        lines.append(head + body[0])
        lines += [" " * pad + w for w in body[1:]]
    lines += ["", f"{'derived':<32} {'value':<14} basis"]

    basis, derived = plan.derived_value("basis", {}), plan.to_dict()["derived"]
    for k in [k for k in ORDER if k in derived] + sorted(set(derived) - set(ORDER) - {"basis"}):
        v = derived[k]
        if isinstance(v, dict):  # the request and the memory breakdown: the header lines above, full in yaml/json
            continue
        val = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else ("n/a" if v is None else str(v))
        body = _wrap(basis.get(k, ""), width, 48)
        lines.append(f"{k:<32} {val:<14} {body[0]}".rstrip())
        lines += [" " * 48 + w for w in body[1:]]
    lines.append("")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"

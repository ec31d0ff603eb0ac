"""A plan as text: the summary table (`render_summary`, the CLI's default and `print(plan)`) and the full table
(`render_table`, detail=full). Torch-free and Hydra-free: it reads the Plan's own data, the lever registry (which
settings have no kernel) and the order of the derived numbers."""

from __future__ import annotations

import re
import textwrap

from h3plan.levers import not_installed

from .derive import ORDER


def _request_lines(plan, width: int) -> list[str]:
    """`request` (where S comes from) and `memory` (the peak per GPU) lines of the table header."""
    seq = plan.derived_value("sequence") or {}
    if seq.get("source") == "parallel.seq_len":
        other = seq.get("video_request_seq_len")
        req = f"parallel.seq_len={seq['seq_len']:,} set explicitly" + (f" (the video request would give {other:,})" if other else "")
    elif seq:
        audio = f"{seq['audio_rows']:,} audio + " if seq.get("audio_rows") else "no audio + "
        req = (f"{seq['source']}: {seq['height']}x{seq['width']} px, {seq['frames']} frames ({seq['seconds']:.2f} s at "
               f"{seq['fps']:g} fps); {seq['text_rows']:,} text + {audio}{seq['video_rows']:,} video rows = "
               f"{seq['seq_len']:,} tokens; {seq['transformer_forwards']} transformer forwards "
               f"(num_inference_steps {seq['num_inference_steps']})")
    else:
        return []
    texts = ["request  " + req]
    peak, breakdown = plan.derived_value("memory_peak_gib_per_gpu"), plan.derived_value("memory_breakdown_gib") or {}
    if peak is not None:
        items = plan.derived_value("memory_peak_items") or list(breakdown)
        top = ", ".join(f"{k} {breakdown[k]:g}" for k in sorted(items, key=lambda k: -breakdown[k])[:3])
        gb = plan.get("hardware").get("device", {}).get("memory_gb")
        phase = {"denoise": "denoising", "decode": "decoding", "install": "installing"}.get(
            plan.derived_value("memory_peak_phase"), "running")
        line = f"memory   peak {peak:.1f} GiB per GPU while {phase} (GiB: {top}) of {gb} GB"
        inst, loaded = plan.derived_value("memory_install_gib"), plan.derived_value("memory_loaded_gib")
        if inst is not None and loaded is not None:
            usable = gb * 1e9 / 2**30 * (1 - plan.get("memory")["reserve_fraction"]) if gb else None
            line += (f"; install from the host {inst:.1f} GiB (install(pipe, plan, device=\"cuda\")), loaded on the GPU first "
                     f"{loaded:.1f} GiB" + (" (does not fit: load on the host)" if usable is not None and loaded > usable else ""))
        texts.append(line)
    out = []
    for t in texts:
        w = _wrap(t, width, 9)
        out += [w[0]] + [" " * 9 + x for x in w[1:]]
    return out


def _wrap(text: str, width: int, indent: int) -> list[str]:
    return textwrap.wrap(text, width=max(40, width - indent), break_long_words=False, break_on_hyphens=False) or [""]


def _header(plan) -> str:
    hw, r, p, m = (plan.get(k) for k in ("hardware", "recipe", "parallel", "model"))
    policy = "lossless" if r["policy"] == "lossless" else f"budget PSNR>={r['budget']['psnr_db_min']} dB SSIM>={r['budget']['ssim_min']}"
    ring = "" if p.get("ring", 1) == 1 else f" x ring {p['ring']}"
    return (f"h3plan  hardware={hw['name']} ({hw['arch']}, {hw['compute_capability']})  recipe={r['name']} ({policy})  "
            f"parallel={p['name']} (Ulysses {p['ulysses']}{ring}, {p['seq_len']:,} tokens)  model={m['name']}")


def _labelled(label: str, text: str, width: int) -> list[str]:
    w = _wrap(text, width, 9)
    return [f"{label:<8} {w[0]}"] + [" " * 9 + x for x in w[1:]]


def _speed_text(plan) -> str:
    """First-order time per transformer block from the plan's estimates, and what they rest on."""
    hw = plan.get("hardware")
    att, gemm, a2a = (plan.derived_value(k) for k in ("attention_ms_per_block_est", "gemm_ms_per_block_est", "a2a_ms_per_block_est"))
    if att is None or gemm is None:
        return (f"no estimate on {hw['name']}: no measured or published dense throughput for its attention or GEMMs "
                "(detail=full shows the basis)")
    parts = [f"attention {att:.1f} ms", f"block linears {gemm:.1f} ms"] + ([f"all-to-all {a2a:.1f} ms"] if a2a else [])
    basis = (f"TFLOP/s measured on {hw['name']}" if hw.get("measured", {}).get("on_hardware")
             else f"an assumed share of {hw['name']}'s vendor peak: never measured there")
    text = f"{' + '.join(parts)} per transformer block per GPU ({basis}; elementwise work not counted)"
    seq = plan.derived_value("sequence") or {}
    layers = plan.get("model").get("diffusers_config", {}).get("num_layers")
    if seq.get("transformer_forwards") and layers:
        total = (att + gemm + (a2a or 0)) * layers * seq["transformer_forwards"] / 1e3
        text += f"; x {layers} blocks x {seq['transformer_forwards']} forwards = {total:,.0f} s of denoising at that rate"
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
    return [x for x in d.reasons if not x.startswith("not hardware-verified") and " allows lossy levers within " not in x] or list(d.reasons[:1])


def render_summary(plan, width: int = 120) -> str:
    """The default table: what runs, what is lossy and its budget, what has no kernel, what never ran on this
    hardware, the memory and speed estimates, then one line per lever (detail=full: every reason, its sources
    and the derived numbers)."""
    hw, r = plan.get("hardware"), plan.get("recipe")
    ds = plan.decisions
    lines = [_header(plan), *_request_lines(plan, width)]
    lines += _labelled("speed", _speed_text(plan), width)
    runs = [f"{d.lever}={d.setting}" for d in ds if d.enabled and d.setting != "default"]
    lines += _labelled("runs", ", ".join(runs) or "diffusers' own ops only", width)
    lossy = [d.lever for d in ds if not d.lossless]
    if lossy:
        b = r["budget"]
        lines += _labelled("lossy", f"{', '.join(lossy)}: the output may differ from diffusers' eager output within "
                                    f"PSNR >= {b['psnr_db_min']} dB, SSIM >= {b['ssim_min']} (action=verify measures it)", width)
    else:
        lines += _labelled("lossless", "every lever keeps diffusers' eager bits, given the attention backend", width)
    missing = {d.lever: not_installed(d) for d in ds}
    for d in ds:
        if missing[d.lever]:
            lines += _labelled("kernel", f"{d.lever}={d.setting} has no kernel yet: install skips it ({missing[d.lever]})", width)
    unverified = [d for d in ds if not d.hardware_verified]
    if len(unverified) == len(ds):
        never = f"h3plan has never run on {hw['name']}: every setting here is a prediction (marked *)"
    elif unverified:
        never = f"{', '.join(f'{d.lever}={d.setting}' for d in unverified)}: never run on {hw['name']} by h3plan (marked *)"
    else:
        never = f"every setting here passed h3plan's GPU suite on {hw['name']} (hardware.verified)"
    lines += _labelled("untested" if unverified else "verified", never, width)
    forced = [f"levers.{d.lever}={d.setting}" for d in ds if d.forced]
    if forced:
        lines += _labelled("forced", ", ".join(forced) + " (asked for, and checked that it can apply)", width)
    lines += ["", f"{'lever':<21} {'setting':<12} {'note':<9}   why (detail=full: every reason and its source)"]
    pad = 21 + 1 + 12 + 1 + 9 + 3
    for d in ds:
        flag = "no kernel" if missing[d.lever] else "" if d.lossless else "lossy"
        mark = "*" if not d.hardware_verified else " "
        lines.append(f"{d.lever:<21} {d.setting:<12} {flag:<9} {mark} {_short(_shown_reasons(d), width - pad)}".rstrip())
    lines += ["", "every reason with its sources, and the derived numbers: detail=full; for machines: format=yaml|json"]
    return "\n".join(lines) + "\n"


def render_table(plan, width: int = 120) -> str:
    """detail=full: every decision with all its reasons and sources, every derived number with its basis."""
    lines = [
        _header(plan),
        *_request_lines(plan, width),
        "",
        f"{'lever':<21} {'setting':<12} {'lossless':<8}   why",
    ]
    pad = 21 + 1 + 12 + 1 + 8 + 3
    for d in plan.decisions:
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

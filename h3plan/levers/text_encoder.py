"""Where the pipeline's Qwen3-VL conditioner sits while a call runs: none (prompt_embeds given), resident (on the
device for every call), offload_after (moved to the host after encoding; the call's time includes the move) or host
(left in host memory, its parts streamed to the device one at a time for the encode). Every setting is lossless:
a placement moves the conditioner's weights, never a number it computes (tests/install/test_install_text_encoder.py).

Set by `memory.text_encoder` (auto, the default, or one of SPEC.settings): the placement is a memory option, decided
inside the memory estimate (h3plan/planning/memory.py), because the free device memory it needs is known only once
every lever in NAMES has decided. So its context is `Room`, the numbers the estimate hands it, not the levers'
Context, and its Decision lands in the plan's derived `text_encoder` value rather than among the plan's decisions.
The conditioner's sizes come from planning/text_encoder.py (its config read and counted).

auto takes the first setting that fits of resident (weights + encode peak beside the denoise peak), offload_after
(the same while encoding, beside the resident models) and host (one decoder layer + the encode peak while
encoding); host when none fits, which the plan's memory check then refuses with the nearest change that fits. A
forced setting that does not fit raises ValueError with the nearest one that does.
Install: the pipeline installer (install/pipeline.py) places a loaded `text_encoder` component by the `placement`
option (install/text_encoder.py). Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from h3plan.facts.decision import Decision, make_decision

from .base import Option, Spec, one_of, VERIFY_PLACEMENT

GiB = 2**30
SPEC = Spec(
    name="text_encoder",
    settings={"none": True, "resident": True, "offload_after": True, "host": True},
    summary="where the pipeline's Qwen3-VL conditioner sits, decided in the memory estimate by what fits: none "
            "(prompt_embeds given), resident, offload_after (moved to the host after encoding) or host (streamed a "
            "layer at a time) (exact)",
    verify=VERIFY_PLACEMENT,
    options=(Option("pipeline", "text_encoder", *one_of("resident", "offload_after", "host")),),
)
PLACED = tuple(s for s in SPEC.settings if s != "none")  # the settings that put the conditioner somewhere
ORDER = PLACED  # auto's order: the first that fits
NUMBERS = ("weights_gib", "activations_gib", "encode_s", "move_s", "call_s")  # a placement's params, in plan order


@dataclass(frozen=True)
class Room:
    """What the memory estimate knows when the placement is decided.

    sizes: planning/text_encoder.sizes of the conditioner for the request's text rows (weight_bytes,
        activation_bytes, layer_bytes, flops); None: no conditioner config (prompt_embeds given).
    free_denoise / free_encode: device bytes left beside the rest of the plan at the denoise peak / while encoding
        (the models resident while it encodes).
    gemm_tflops: the BF16 GEMM rate the encode is timed at (None: not timed, nan).
    host_gbps: the host <-> device copy rate of a move (memory.host_link_gbps).
    requested: memory.text_encoder ("auto" or a setting).
    """

    sizes: Mapping[str, Any] | None
    free_denoise: float
    free_encode: float
    gemm_tflops: float | None
    host_gbps: float
    requested: str = "auto"


def decide(room: Room) -> Decision:
    """The placement with its reasons and numbers (params: weights_gib, activations_gib, encode_s, move_s and, when
    placed, call_s). A forced setting that cannot apply raises ValueError with the reason."""
    forced = None if room.requested == "auto" else room.requested
    if room.sizes is None:
        if forced not in (None, "none"):
            raise ValueError(f"text_encoder={forced}: no conditioner config to plan (prompt_embeds given)")
        return _decision("none", ["prompt_embeds given: the Qwen3-VL conditioner runs before the call, or elsewhere"],
                         forced, {})
    s, free_denoise, free_encode, gbps = room.sizes, room.free_denoise, room.free_encode, room.host_gbps
    w, a, layer = s["weight_bytes"], s["activation_bytes"], s["layer_bytes"]
    compute = s["flops"] / (room.gemm_tflops * 1e12) if room.gemm_tflops else float("nan")  # no BF16 rate: not timed
    move = w / (gbps * 1e9)
    nums = {"weights_gib": w / GiB, "activations_gib": a / GiB, "encode_s": compute, "move_s": move}
    fits = {"resident": w + a <= free_denoise, "offload_after": w + a <= free_encode, "host": layer + a <= free_encode}
    why = {"resident": f"{w / GiB:.1f} GiB of weights + {a / GiB:.1f} GiB encode peak fit beside the denoise peak; "
                       f"encode {compute:.2f} s",
           "offload_after": f"{w / GiB:.1f} GiB of weights + {a / GiB:.1f} GiB encode peak fit while encoding, not "
                            f"beside the denoise peak ({free_denoise / GiB:.1f} GiB free there): moved to the host "
                            f"after encoding, {move:.2f} s of the call's time at {gbps:g} GB/s; encode {compute:.2f} s",
           "host": f"left in host memory: one decoder layer ({layer / GiB:.2f} GiB) at a time streamed for the encode, "
                   f"{move:.2f} s of transfer at {gbps:g} GB/s + {compute:.2f} s of compute"}
    for setting in [forced] if forced else ORDER:
        if setting == "none":
            return _decision("none", ["forced: prompt_embeds given, the conditioner is not planned"], forced, nums)
        if setting not in SPEC.settings:
            raise ValueError(f"text_encoder={setting}: not one of {', '.join(SPEC.settings)}")
        if fits[setting]:
            return _decision(setting, [why[setting]], forced,
                             {**nums, "call_s": compute + (move if setting != "resident" else 0.0)})
        if forced:
            need = w + a if setting != "host" else layer + a
            free = free_denoise if setting == "resident" else free_encode
            near = next((x for x in ORDER if fits[x]), None)
            raise ValueError(f"text_encoder={setting} does not fit: it needs {need / GiB:.1f} GiB "
                             f"{'beside the denoise peak' if setting == 'resident' else 'while encoding'}, "
                             f"{free / GiB:.1f} GiB free"
                             + (f"; nearest that fits: memory.text_encoder={near}" if near else "; no placement fits"))
    # auto, nothing fits: host, the least device memory; the plan's memory check refuses the encode phase with the
    # nearest change that fits
    return _decision("host", [f"nothing fits: even layer by layer it needs {(layer + a) / GiB:.1f} GiB while encoding, "
                              f"{free_encode / GiB:.1f} GiB free; {why['host']}"], forced,
                     {**nums, "call_s": compute + move})


def _decision(setting: str, reasons: list[str], forced: str | None, params: Mapping[str, float]) -> Decision:
    return make_decision(SPEC.name, setting, SPEC.lossless(setting), reasons, forced=forced is not None, params=params)


def derived(decision: Decision) -> dict[str, Any]:
    """The plan's derived `text_encoder` value: setting, reasons and, where placed, the numbers (GiB, seconds) to 3
    decimals."""
    out: dict[str, Any] = {"setting": decision.setting, "reasons": list(decision.reasons)}
    if decision.setting != "none":
        out.update((k, round(decision.param(k), 3)) for k in NUMBERS if decision.param(k) is not None)
    return out


def from_derived(value: Mapping[str, Any] | None) -> Decision | None:
    """The Decision a plan's derived `text_encoder` value records (None: the plan places no conditioner)."""
    if not value:
        return None
    params = {k: v for k, v in value.items() if k not in ("setting", "reasons")}
    return make_decision(SPEC.name, value["setting"], SPEC.lossless(value["setting"]), value.get("reasons") or (),
                         params=params)


def install(builder, decision) -> None:
    if decision.setting == "none":
        builder.skip(SPEC.name, decision.reasons[0])
    else:
        builder.set(SPEC.name, "text_encoder", decision.setting)

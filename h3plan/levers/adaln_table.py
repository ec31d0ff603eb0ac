"""Exact AdaLN modulation tables: the outputs of every block's `adaln_proj.linear` and of `norm_out.linear`,
computed once at install for the timestep vectors the request passes, instead of the linears' weights.

Each of diffusers' MiniMaxH3AdaLayerNormModulation projections (2,688 -> 6 x 3 x hidden, 260M parameters at
the released width; 13.0B of the 33B, 24.2 GiB in bf16) reads only `temb`, a function of the call's distinct
timestep values (`time_proj` -> `time_embedder`; the projection applies SiLU and its own cast). A generation
passes the few vectors diffusers' two MiniMaxH3Scheduler schedules fix (`MiniMaxH3SetTimestepsStep`:
sorted distinct values of the video, audio and conditioning rows' timesteps). `on`: install runs each
linear's eager GEMM once per such vector (the same call, shapes and dtypes as the forward, so the same
bits), keeps the outputs on the device keyed by the exact bits of `temb`, and parks the weights in pinned
host memory (install/adaln_table.py). Lossless: a hit returns the eager bits, a vector not in the table is
a counted miss served by the same GEMM on weights streamed to the device. `off`: diffusers' linears.

Keys: facts/timesteps.py `table_timesteps` (the request's kinds of row: generated audio, clean condition and
reference rows). auto: on where the table is smaller than the weights it replaces (always at the released width: about
0.9 GiB against 24.2 GiB for the default 50-step request), off otherwise. Torch-free: the schedules are
recomputed here in Python floats rounded to float32 (planning numbers); the installer takes its keys from
diffusers' schedulers themselves.
"""

from __future__ import annotations

from typing import Any, Mapping

from h3plan.facts.pipeline import schedule_facts
from h3plan.facts.timesteps import request_steps, row_kinds, schedule, vectors

from .base import Context, Option, Spec, StateKeys, Terms, resolve


def _valid(v) -> bool:
    if v is None:
        return True
    return (isinstance(v, dict) and isinstance(v.get("steps"), list) and v["steps"]
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in v["steps"]))


SPEC = Spec(
    name="adaln_table",
    settings={"off": True, "on": True},
    summary="AdaLN modulation outputs tabled per timestep vector at install, weights parked on the host (exact)",
    counter="adaln_table",
    options=(Option("linears", "adaln_table", _valid,
                    "None or dict(steps: [int >= 2, ...], shifts, conditions)", None),),
    terms={"on": Terms(adaln_tables=True)},
    # the blocks' AdaLN projections and the output norm's: read only while the tables are built
    state={"on": (StateKeys("parks", ("transformer_blocks.*.adaln_proj.linear.*", "norm_out.linear.*")),)},
    fit="on",
    exports=("prepare",),  # h3plan.prepare: step counts added to installed tables
    input_step=lambda model, decision, site: site.own().inputs(model, decision, site),  # install/adaln_table.py
)
GiB = 2**30
MODULATION_OUT = 6 * 3  # MiniMaxH3AdaLayerNormModulation: 6 x hidden x MINIMAX_H3_MODALITY_NUM outputs per row
NORM_OUT = 2  # MiniMaxH3AdaLayerNormOut.linear: shift, scale


def table_plan(model: Mapping[str, Any], pipeline: Mapping[str, Any], *, audio: bool = True, steps=None,
               condition_video: bool = False, condition_audio: bool = False) -> dict[str, Any]:
    """What the tables hold for a request and what they free (bytes; bf16 as the released checkpoint).
    model: diffusers kwargs (or the model section); pipeline: the pipeline section."""
    dc = model.get("diffusers_config", model)
    h, ted, n = dc["hidden_size"], dc["time_embed_dim"], dc["num_layers"]
    f = schedule_facts(pipeline)
    steps = [int(s) for s in (steps or [pipeline["num_inference_steps"]])]
    vs = vectors(steps, f["video_shift"], f["audio_shift"], f["keyframe_noise_aug"], audio=audio,
                 condition_video=condition_video, condition_audio=condition_audio)
    outs = n * MODULATION_OUT * h + NORM_OUT * h
    rows = sum(len(v) for v in vs)
    forwards = sum(len(schedule(s, f["video_shift"])) for s in steps)
    return {"steps": steps, **f, "audio": bool(audio),
            "condition_video": bool(condition_video), "condition_audio": bool(condition_audio),
            "linears": n + 1, "parameters": outs * (ted + 1), "vectors": len(vs), "rows": rows, "forwards": forwards,
            "table_bytes": 2 * rows * outs, "weight_bytes": 2 * outs * (ted + 1)}


def _plan(ctx: Context) -> dict[str, Any]:
    # the request's rows and steps (facts/timesteps.py: the keys the installer tables too)
    return table_plan(ctx.model, ctx.pipeline, steps=[request_steps(ctx.request, ctx.pipeline)],
                      **row_kinds(ctx.request))


def _describe(p: Mapping[str, Any]) -> list[str]:
    conds = [k for k in ("video", "audio") if p[f"condition_{k}"]]
    return [
        f"table {p['table_bytes'] / GiB:.2f} GiB per GPU ({p['vectors']} timestep vectors, {p['rows']} rows x "
        f"{p['linears']} linears) frees {(p['weight_bytes'] - p['table_bytes']) / GiB:.2f} GiB: the {p['linears']} "
        f"AdaLN linears ({p['parameters'] / 1e9:.2f}B parameters, {p['weight_bytes'] / GiB:.2f} GiB) wait in pinned "
        f"host memory; misses expected for the request: 0 of {p['forwards']} forwards",
        f"keys: diffusers' MiniMaxH3Scheduler at num_inference_steps {', '.join(map(str, p['steps']))} (shift "
        f"{p['video_shift']:g} video, {p['audio_shift']:g} audio), "
        f"{'conditioning rows: ' + ', '.join(conds) if conds else 'no conditioning rows'}"
        f"{'' if p['audio'] else ', no audio rows'}; h3plan.prepare(pipe, num_inference_steps=...) adds step counts",
        "exact: each entry is the forward's own GEMM run once at install (same shapes, dtypes, device), looked up by "
        "the exact bits of temb; a vector not in the table is a counted miss (adaln_table.fallback) served by the same "
        "GEMM on the linear's weights streamed to the device (2 x 18 x hidden x time_embed_dim bytes over PCIe per "
        "block, then added to the table)",
    ]


def params(ctx: Context, s: str) -> dict:
    if s != "on":
        return {}
    p = _plan(ctx)
    keep = ("steps", "video_shift", "audio_shift", "keyframe_noise_aug", "audio", "condition_video", "condition_audio",
            "vectors", "rows")
    return {**{k: p[k] for k in keep}, "table_gib": round(p["table_bytes"] / GiB, 3),
            "frees_gib": round((p["weight_bytes"] - p["table_bytes"]) / GiB, 3), "expected_misses": 0}


def auto(ctx: Context):
    p = _plan(ctx)
    if p["table_bytes"] >= p["weight_bytes"]:
        return "off", [f"the table ({p['table_bytes'] / GiB:.3g} GiB, {p['rows']} rows) would be no smaller than the "
                       f"{p['linears']} AdaLN linears it replaces ({p['weight_bytes'] / GiB:.3g} GiB): diffusers' "
                       "linears kept"], {}
    return "on", _describe(p), params(ctx, "on")


def explain(ctx: Context, s: str) -> list[str]:
    if s == "on":
        return _describe(_plan(ctx))
    p = _plan(ctx)
    return [f"the {p['linears']} AdaLN linears ({p['weight_bytes'] / GiB:.2f} GiB) stay on the device"]


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    if decision.setting != "on":
        builder.skip(SPEC.name, decision.reasons[0])
        return
    keys = ("steps", "video_shift", "audio_shift", "keyframe_noise_aug", "audio", "condition_video", "condition_audio")
    builder.set(SPEC.name, "adaln_table", {k: decision.param(k) for k in keys})

"""The pipeline benchmark (h3plan/actions/bench/pipeline.py) without the CLI's config schema.

    python benchmarks/pipeline.py recipe=fp8 --video 768x1344x124 --out benchmarks/results --tag h200
    python benchmarks/pipeline.py model=h3_tiny vae=h3_tiny_pipe --video 32x32x124 --out /tmp/r     # CPU smoke
    python benchmarks/pipeline.py --workflow ref2va --video 768x1344x124 --out benchmarks/results --tag h200
    python benchmarks/pipeline.py video=ref2va_768x1344_5s memory.text_encoder=offload_after --workflow ref2va --prompt \
        --video 768x1344x124 --out benchmarks/results --tag h200      # the prompt through the seeded text encoder

Positional arguments are Hydra overrides of the packaged config (hardware, recipe, parallel, model, vae,
levers.*); the options below are `video` and `bench.pipeline.*` of
`python -m h3plan action=bench target=pipeline video=... bench.pipeline.<key>=...`, which runs the same code.
Multi-GPU (Ulysses degree U): torchrun --nproc-per-node=U benchmarks/pipeline.py parallel=uU ...
"""  # noqa: E501

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's h3plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. recipe=fp8 levers.attention=sdpa")
    ap.add_argument("--video", default=None, help="HEIGHTxWIDTHxFRAMES (default: the pipeline's own request)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default=None, help="file name tag (default: the device, e.g. h200)")
    ap.add_argument("--steps", type=int, help="timed denoise steps per call")
    ap.add_argument("--warmup", type=int, help="untimed steps at the start of every call")
    ap.add_argument("--rounds", type=int, help="calls per setting, order reversed every round")
    ap.add_argument("--decode-warmup", type=int)
    ap.add_argument("--text-tokens", type=int)
    ap.add_argument("--layers", type=int, help="transformer layers (default: all of the model config's)")
    ap.add_argument("--e2e-steps", type=int, help="transformer forwards of a generation (default: the pipeline's)")
    ap.add_argument("--compile-backend", help="torch.compile backend of the best setting (default inductor)")
    ap.add_argument("--cp-backend", help="diffusers attention backend for context parallelism (default _native_cudnn)")
    ap.add_argument("--vae",
                    help="VAE precisions of the eager and best rows: auto, or a comma list of fp32, fp16, bf16")
    ap.add_argument("--plan", action="append", dest="plans", help="another plan in the same run: an override string, "
                                                                   "e.g. --plan 'recipe=fp8' (repeatable)")
    ap.add_argument("--no-reference", action="store_true", help="skip the bitwise reference rows")
    ap.add_argument("--no-best", action="store_true", help="skip diffusers' best setting")
    ap.add_argument("--no-eager", action="store_true", help="skip diffusers eager")
    ap.add_argument("--no-plan", action="store_true", help="skip the plans (diffusers' rows only)")
    ap.add_argument("--stock-bits", action="store_true", help="also time the stock-bits plan (the lossless plan with "
                                                               "levers.attention=sdpa, diffusers' default attention)")
    ap.add_argument("--workflow",
                    help="t2va (default), fl2va (first and last keyframe) or ref2va (one image reference)")
    ap.add_argument("--whole", action="store_true", help="every row also times one whole call of the generation's "
                                                          "forwards end to end (bench.pipeline.whole)")
    ap.add_argument("--frames-dir", help="keep each row's frames here; a later run compares against them "
                                         "(bench.pipeline.frames_dir)")
    ap.add_argument("--prompt", action="store_true", help="pipe(prompt=...) through diffusers' text encoder step and a "
                                                           "seeded Qwen3-VL placed by the plan's memory.text_encoder "
                                                           "(give one: memory.text_encoder=offload_after)")
    ap.add_argument("--text-encoder-weight-sets", type=int, metavar="N",
                    help="with --prompt: the seeded conditioner's decoder layers share N layers' weights (every layer "
                         "computes; its memory is N layers') (bench.pipeline.text_encoder_weight_sets)")
    a = ap.parse_args(argv)

    from h3plan import H3PlanError
    from h3plan.actions.bench import configured
    from h3plan.actions.bench.pipeline import run

    pipeline = {k: getattr(a, k) for k in ("steps", "warmup", "rounds", "decode_warmup", "text_tokens", "layers",
                                           "e2e_steps", "compile_backend", "cp_backend", "vae", "plans", "workflow",
                                           "frames_dir", "text_encoder_weight_sets")
                if getattr(a, k) is not None}
    if a.no_reference:
        pipeline["reference"] = False
    for key in ("best", "eager", "plan"):
        if getattr(a, f"no_{key}"):
            pipeline[key] = False
    if a.stock_bits:
        pipeline["stock_bits"] = True
    if a.prompt:
        pipeline["prompt"] = True
    if a.whole:
        pipeline["whole"] = True
    try:
        cfg, plan = configured(a.overrides)
        cfg.update(action="bench", video=a.video)
        cfg["bench"]["target"] = "pipeline"
        cfg["bench"].update(out_dir=a.out, tag=a.tag, pipeline=pipeline)
        return run(cfg, plan)
    except H3PlanError as e:
        print(f"pipeline.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

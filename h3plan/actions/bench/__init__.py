"""`action=bench`: one harness, two benches.

- the block bench (bench.target=block, measure.py; records.py: its results file): diffusers' eager transformer
  blocks against the same blocks with the plan installed, attention alone and inside the plan;
- the pipeline bench (bench.target=pipeline, pipeline.py; pipeline_settings.py: the rows, switched in place on
  one pipeline; pipeline_records.py: its results file): diffusers' `pipe(...)` as users call it, eager, diffusers'
  best and the plans.

What both use lives once: harness.py (the session, plan label and same-backend reference, device name and tag,
run metadata, the output files and the summary, SIGTERM as an exception), timing.py (clock, progress,
interleaved and back-to-back repetitions, the in-plan backend timer, the forward timer), results_file.py (the
results file: schema version, merge, atomic writes, the run folder; table cells and the runs table),
diffusers_best.py (diffusers' best one-GPU setting, the regional compile). Each bench's results file keeps its
own schema (block: version 1; pipeline: version 2, kind "pipeline-call").

With `h3plan` itself, this package is all a script under benchmarks/ imports (tests/docs/test_apparatus.py): the
timer, `configured` (a config and its plan from overrides), the inputs and pipeline builders the benches use, and
`ops` (the kernels the kernel bench and the probes time).
"""

from typing import Mapping

from h3plan.actions.gpu_only import CPU_MAX_HIDDEN
from h3plan.actions.inputs import TIMESTEP, build_model, packed_inputs, seeded_lora
from h3plan.actions.pipeline_build import (build_pipeline, denoiser, prompt_inputs, prompt_text, run_block,
                                           workflow_blocks,
                                           workflow_inputs)
from h3plan.actions.quality import psnr
from h3plan.facts.lora import SHAPES as LORA_SHAPES
from h3plan.install.text_encoder import placed as placed_text_encoder

from . import pipeline
from .harness import configured, device_tag, plan_label, same_backend_plan
from .measure import BenchOptions, capture_block_inputs, options, plan_backend, rel_error, run_stack
from .measure import run as run_blocks
from .records import (ANCHOR_EAGER_MS, REQUIRED_KEYS, SCHEMA_VERSION, TARGET_ATTENTION_FRACTION, TARGET_FP8_SPEEDUP,
                      TARGET_LOSSLESS_SPEEDUP, BlockRecord, check_records, fallbacks, load_doc, merge_record, new_doc,
                      record_key, render_markdown, summary_table, target_lines, write_chart, write_doc)
from .timing import (BackendTimer, Clock, ForwardTimer, Progress, back_to_back, category, interleaved, kernel_events,
                     median, median_ms, profile_summary)


def run(cfg, plan) -> int:
    """Entry point of `python -m h3plan action=bench`: the bench `bench.target` names (block, the default, or
    pipeline); its exit status."""
    b = cfg["bench"] if isinstance(cfg, Mapping) else cfg.bench
    t = b.get("target", "block") if hasattr(b, "get") else getattr(b, "target", "block")
    return (pipeline.run if str(getattr(t, "value", t)) == "pipeline" else run_blocks)(cfg, plan)


__all__ = ["run", "options", "BenchOptions", "plan_label", "device_tag", "capture_block_inputs", "run_stack",
           "same_backend_plan", "rel_error", "BlockRecord", "REQUIRED_KEYS", "SCHEMA_VERSION", "ANCHOR_EAGER_MS",
           "TARGET_LOSSLESS_SPEEDUP", "TARGET_FP8_SPEEDUP", "TARGET_ATTENTION_FRACTION", "new_doc", "load_doc",
           "check_records", "record_key", "merge_record", "write_doc", "render_markdown", "target_lines", "fallbacks",
           "summary_table", "write_chart", "Progress", "Clock", "interleaved", "back_to_back", "median", "median_ms",
           "BackendTimer", "ForwardTimer", "kernel_events", "category", "profile_summary", "configured", "plan_backend",
           "build_model", "packed_inputs", "TIMESTEP",
           "build_pipeline", "prompt_inputs", "run_block", "psnr", "denoiser", "prompt_text", "workflow_blocks",
           "workflow_inputs", "placed_text_encoder", "seeded_lora", "LORA_SHAPES", "CPU_MAX_HIDDEN"]

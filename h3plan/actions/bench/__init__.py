"""`action=bench`: diffusers eager against the installed plan, side by side in one process.

Scope: one device, Ulysses degree 1 (degree > 1 is refused; benchmarks/parallel.py times diffusers' context
parallelism against the plan there). For every S in `bench.seq_lens`:
  - attention alone at the per-rank shape (1, S, heads, head_dim), random bf16 q/k/v: the plan's
    backend called directly against diffusers' default `dispatch_attention_fn`;
  - a stack of n transformer blocks for every n in `bench.blocks` (real width from `model`): diffusers'
    eager blocks against the same blocks with the plan installed, same inputs, repetitions
    interleaved (eager, plan, plan, eager, ...), `bench.warmup` untimed rounds, median of
    `bench.iters`; while the plan runs, device events around its backend calls give the time of
    attention inside the plan, compared with that backend on clones of the same arguments;
  - with `bench.best` (on by default): diffusers' best one-GPU setting in the same rounds, a deep copy of the
    eager blocks under `compile_repeated_blocks(fullgraph=True)` (actions/diffusers_best.py, the pipeline
    bench's best too; static shapes per S). Its first call at each (S, blocks) compiles and is timed apart
    (best_first_call_s), the warm-up rounds follow, then best_ms; speedup_vs_best = best_ms / plan_ms. A
    failing compile is recorded (best_error) and eager and the plan are timed without it.
Correctness rides along: the plan's stack output against diffusers eager with the plan's attention
backend (bitwise; lossless attention backends only) and against diffusers' default eager (relative
Frobenius error, fp32). Timing: CUDA events around each repetition, synchronized. On a CPU the same
code runs with host clocks, the files say the times mean nothing, and only the plumbing is proven.

Output, in `bench.out_dir` (null: outputs/<date>/<time>, a folder of the run's own): block-<tag>.json (records
merged by (plan, S, blocks, device), so a second invocation with another recipe into the same folder appends), block-<tag>.md and block-<tag>.png (matplotlib; without it the
PNG is skipped with a message and `benchmarks/plot.py` draws it later from the JSON). <tag>:
`bench.tag`, else the device's short name (`h200`, `cpu`). JSON and markdown are rewritten after
every configuration, so a run cut off by a timeout keeps what it measured.

Modules: measure.py (options, models, inputs, one configuration, `run`), timing.py (clock, progress,
interleaved and back-to-back repetitions, the in-plan backend timer), records.py (record schema, JSON,
markdown, targets, the chart hook). Importing the package loads no torch.
"""

from .measure import (BenchOptions, capture_block_inputs, device_tag, options, plan_label, rel_error, run,
                      run_stack, same_backend_plan)
from .records import (ANCHOR_EAGER_MS, REQUIRED_KEYS, SCHEMA_VERSION, TARGET_ATTENTION_FRACTION, TARGET_FP8_SPEEDUP,
                      TARGET_LOSSLESS_SPEEDUP, BlockRecord, check_records, fallbacks, load_doc, merge_record, new_doc,
                      record_key, render_markdown, summary_table, target_lines, write_chart, write_doc)
from .timing import BackendTimer, Clock, Progress, back_to_back, interleaved, median

__all__ = ["run", "options", "BenchOptions", "plan_label", "device_tag", "capture_block_inputs", "run_stack",
           "same_backend_plan", "rel_error", "BlockRecord", "REQUIRED_KEYS", "SCHEMA_VERSION", "ANCHOR_EAGER_MS",
           "TARGET_LOSSLESS_SPEEDUP", "TARGET_FP8_SPEEDUP", "TARGET_ATTENTION_FRACTION", "new_doc", "load_doc",
           "check_records", "record_key", "merge_record", "write_doc", "render_markdown", "target_lines", "fallbacks",
           "summary_table", "write_chart", "Progress", "Clock", "interleaved", "back_to_back", "median", "BackendTimer"]

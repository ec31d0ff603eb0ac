#!/usr/bin/env bash
# One device call: Nsight Compute of the NVFP4 producers' kernels in two or more source trees, tabled side by side.
#
#   OUT=dir bash benchmarks/probes/nvfp4_ab_h200.sh main=.gpu/main next=.      (LABEL=TREE: a tree holding h3plan/)
#
# Each tree's kernels run at that tree's planned layouts (runtime/kernels/nvfp4.py TUNED) under this checkout's
# nvfp4_producers.py --once (the h3plan it imports comes from the tree); the reports go to $OUT/ncu-LABEL.txt and
# ncu_table.py writes $OUT/ncu.{json,md} at the copy rate measured here. A tree other than the checkout travels
# as an extract, e.g. `mkdir -p .gpu/main && git archive main h3plan | tar -x -C .gpu/main` (carry it with the call).
# With the wheels the carry has little room (64 MiB in all): carry only the files that differ and build the second
# tree on the device (cp -r h3plan, then those files over it). Its runs: benchmarks/results/probes/nvfp4-session11/.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-.}"
mkdir -p "$out"
tables=()
for spec in "$@"; do
  label="${spec%%=*}"
  tree="$(cd "${spec#*=}" && pwd)"
  report="$out/ncu-$label.txt"
  PYTHONPATH="$tree:${PYTHONPATH:-}" ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis \
    -k regex:"_cast_kernel|_modulate_nvfp4_kernel|_swiglu_nvfp4_kernel" \
    python3 benchmarks/probes/nvfp4_producers.py --once --jobs 0 > "$report" 2>&1
  grep -m1 "kernels from" "$report" | sed "s|^|$label: |"  # the probe names the kernels it imported
  tables+=("$label=$report")
done
copy="$(python3 -c "import sys; sys.path.insert(0, 'benchmarks/probes'); import nvfp4_producers as p; print(p.copy_tbps())")"
python3 benchmarks/probes/ncu_table.py "$out/ncu" "${tables[@]}" --copy-tbps "$copy"

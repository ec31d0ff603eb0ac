"""Nsight Compute text reports of the NVFP4 producers' launches as one JSON and a markdown table (no GPU).

    python benchmarks/probes/ncu_table.py OUT_STEM LABEL=REPORT.txt [LABEL=REPORT.txt ...] [--copy-tbps 4.27]

Each REPORT is the text `ncu --section SpeedOfLight --section WarpStateStats --section Occupancy ...` printed for
`benchmarks/probes/nvfp4_producers.py --once` (which launches, in order, each producer's static pass, then its
dynamic amax and quantize passes: modulation, fold, SwiGLU, cast). Per launch it keeps the duration and the
throughput, occupancy and scheduler metrics; per producer and mode the time (the dynamic mode: its two passes) and
its fraction of copy bandwidth over the bytes one pass must move (nvfp4_producers.py OPS: inputs read once, codes
and scales written, the fold's h'), at the copy rate the probe measured on the same machine. Writes OUT_STEM.json
and OUT_STEM.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvfp4_producers import OPS, OUT_BYTES  # noqa: E402  (the probe's widths and bytes, in its launch order)

ROWS = 19000  # the probe's default rows, those the reports ran at
# producer (launch kind), elements, bytes one pass must move per element (inputs, extra outputs, codes + scales)
PRODUCERS = [(kind, ROWS * width, inb + extra + OUT_BYTES) for _name, kind, width, inb, extra in OPS]
PASSES = ("static", "amax", "quantize")
METRICS = {"Duration": "us", "DRAM Throughput": "dram_pct", "L1/TEX Cache Throughput": "l1_pct",
           "L2 Cache Throughput": "l2_pct", "Compute (SM) Throughput": "sm_pct",
           "Achieved Occupancy": "occupancy_pct", "Registers Per Thread": "registers",
           "Warp Cycles Per Issued Instruction": "cycles_per_issue", "Eligible Warps Per Scheduler": "eligible_warps",
           "SM Frequency": "sm_ghz"}


def launches(text: str) -> list[dict]:
    """[{kernel, grid, block, <METRICS values>}] in report order."""
    out = []
    for line in text.splitlines():
        head = re.match(r"  (\w+) \(([\d, ]+)\)x\(([\d, ]+)\)", line)
        if head:
            out.append(dict(kernel=head.group(1), grid=head.group(2), block=head.group(3)))
            continue
        m = re.match(r"\s{4}(\S.*?)\s{2,}\S*\s+([\d,.]+)$", line)
        if out and m and m.group(1) in METRICS:
            out[-1][METRICS[m.group(1)]] = float(m.group(2).replace(",", ""))
    return out


def table(reports: dict, copy_tbps: float) -> tuple[list[dict], str]:
    rows = []
    for label, items in reports.items():
        if len(items) != 3 * len(PRODUCERS):
            raise SystemExit(f"ncu_table.py: {label} has {len(items)} launches, want {3 * len(PRODUCERS)} "
                             "(nvfp4_producers.py --once over every producer)")
        for p, (name, n, per) in enumerate(PRODUCERS):
            static, amax, quant = items[3 * p:3 * p + 3]
            one = n * per
            for mode, us, launch in (("static", static["us"], [static]), ("dynamic", amax["us"] + quant["us"],
                                                                           [amax, quant])):
                rows.append(dict(layout=label, producer=name, mode=mode, us=us, elements=n, bytes_one_pass=one,
                                 fraction_of_copy=one / (us * 1e-6) / 1e12 / copy_tbps, launches=launch))
    md = ["| layout | producer | mode | kernel us (ncu) | fraction of copy | DRAM % | L1 % | L2 % | SM % "
          "| occupancy % |",
          "|---|---|---|---:|---:|---|---|---|---|---|"]
    for r in rows:
        cols = [" / ".join(f"{x[k]:.0f}" for x in r["launches"]) for k in
                ("dram_pct", "l1_pct", "l2_pct", "sm_pct", "occupancy_pct")]
        md.append(f"| {r['layout']} | {r['producer']} | {r['mode']} | {r['us']:.1f} | {r['fraction_of_copy']:.2f} | "
                  + " | ".join(cols) + " |")
    return rows, "\n".join(md) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("reports", nargs="+", help="LABEL=ncu_report.txt")
    p.add_argument("--copy-tbps", type=float, required=True, help="the copy rate the probe measured (TB/s)")
    args = p.parse_args(argv)
    reports = {}
    for spec in args.reports:
        label, _, path = spec.partition("=")
        with open(path) as f:
            reports[label] = launches(f.read())
    rows, md = table(reports, args.copy_tbps)
    with open(args.out + ".json", "w") as f:
        json.dump(dict(copy_tbps=args.copy_tbps, rows=ROWS, records=rows), f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

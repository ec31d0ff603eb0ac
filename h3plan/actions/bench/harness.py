"""The bench harness: what the block bench (measure.py) and the pipeline bench (pipeline.py) share.

A session (torch, the device, its clock, the options, the progress), the plan's label and its same-backend
reference, the device's name and short tag, the run metadata every results file keeps, the output files
(<out_dir>/<prefix>-<tag>.json, .md, .png) with the summary printed at the end, and SIGTERM turned into an
exception so a run cut off by `timeout` still writes what it measured. Torch is handed in by the caller
(imported when a run starts); importing this module loads no torch.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from omegaconf import OmegaConf

from h3plan.levers import REFERENCE_LEVERS
from h3plan.planner import resolve
from h3plan.planning.config import compose

from .timing import Clock

HOST_CLOCK_NOTE = "bench: no CUDA device: host clock on the CPU; these times mean nothing (plumbing only)"


def plan_label(plan) -> str:
    """`sm90/bf16/u1`, plus ` tier=<name>` for a named tier and `+lever=setting` for every lever the user forced."""
    hw, recipe, par = plan.get("hardware"), plan.get("recipe"), plan.get("parallel")
    u = par.get("ulysses", 1)
    label = f"{hw.get('name', '?')}/{recipe.get('name', '?')}/{par.get('name') or f'u{u}'}"
    if recipe.get("tier"):
        label += f" tier={recipe['tier']['name']}"
    forced = [f"+{d.lever}={d.setting}" for d in plan.decisions if d.forced]
    return " ".join([label] + forced)


def same_backend_plan(plan):
    """The plan cut down to its attention levers (verify's reference R): diffusers' eager blocks running
    the plan's attention backend, which a lossless plan must match bit for bit."""
    return dataclasses.replace(plan, decisions=tuple(d for d in plan.decisions if d.lever in REFERENCE_LEVERS))


def device_name(torch, device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def device_tag(device_name: str) -> str:
    """Short lower-case name for file names: 'NVIDIA H200' -> 'h200', 'cpu' -> 'cpu'."""
    if device_name.lower().startswith("cpu"):
        return "cpu"
    models = re.findall(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", device_name)
    return models[-1].lower() if models else re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def free(torch) -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Session:
    """What every timed turn of a bench needs; a bench's own session adds its models or its pipeline."""

    torch: Any
    device: Any
    opts: Any
    progress: Any
    clock: Clock = field(init=False)

    def __post_init__(self):
        self.clock = Clock(self.torch, self.device)


def run_meta(torch, device, head: Mapping[str, Any], body: Mapping[str, Any]) -> dict:
    """One entry of a results file's "runs": `head` (what names the run), the device and the versions, `body`
    (the bench's own options), the start time."""
    import diffusers  # the caller's run has imported it already: the versions are the point

    return {**head, "device": device_name(torch, device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "diffusers": diffusers.__version__, **body,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


class Output:
    """The files of one run: <out_dir>/<prefix>-<tag>.{json,md,png}; `records` is the bench's records module
    (load_doc, write_doc, write_chart, summary_table). The doc is loaded (a new one where there is none)."""

    def __init__(self, records, out_dir: str, prefix: str, tag: str):
        os.makedirs(out_dir, exist_ok=True)
        stem = os.path.join(out_dir, f"{prefix}-{tag}")
        self.records, self.json_path, self.md_path, self.png_path = records, stem + ".json", stem + ".md", stem + ".png"
        self.doc = records.load_doc(self.json_path)

    def add_run(self, meta: dict) -> None:
        """The run's metadata after every earlier run's: a committed record keeps the metadata of the run that wrote
        it (its device and versions), so no earlier run's entry is dropped."""
        self.doc["runs"] = [*self.doc["runs"], meta]

    def write(self) -> None:
        self.records.write_doc(self.doc, self.json_path, self.md_path)

    def chart(self) -> str | None:
        """The PNG; None when written, else the one-line reason it was not."""
        return self.records.write_chart(self.doc["records"], self.png_path)

    def report(self, shown: Sequence[Mapping], why: str | None) -> None:
        """The summary table of `shown` and the files written."""
        print(self.records.summary_table(shown))
        print(f"wrote {self.json_path}, {self.md_path}" + (f", {self.png_path}" if why is None else f" ({why})"))


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM (timeout?): writing what was measured")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """`timeout` sends SIGTERM: inside, it raises KeyboardInterrupt, so the caller's `finally` still writes the
    files. Only the main thread may set a signal handler; elsewhere nothing changes."""
    prev = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def configured(overrides: Sequence[str] = ()) -> tuple[dict, Any]:
    """(the packaged config composed with `overrides`, as plain data; its plan): how a script under benchmarks/
    plans, with the CLI's composition and one-line errors, and reads what a plan does not keep (`bench:`)."""
    cfg = compose(list(overrides))
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)  # a composed config is a mapping
    return plain, resolve(cfg)

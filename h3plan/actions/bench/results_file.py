"""A committed benchmark results file (JSON beside its markdown): one shape for every bench.

`ResultsFile(...)` knows its schema version, its required record keys, the key that identifies a record (a
rerun replaces the record with the same key) and, optionally, its `kind`. `load_doc` refuses a file that is not
its own (never overwritten); writes are atomic (a temporary file, then a rename), so a run cut off by a
timeout keeps the last complete file.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping


def finite(x):
    """NaN / inf (a diverged run) become null, in nested dicts and lists too: the file stays standard JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def run_folder(out_dir: str | None) -> str:
    """Where a bench writes: `bench.out_dir` as given, else a run folder of its own -- the job's folder in a sweep
    (-m), otherwise outputs/<date>/<time> under the working directory (Hydra's default run folder; h3plan's
    plain runs set hydra.run.dir=. so that a plan writes nothing). Never a shared folder by default: a killed
    run's records must not merge into the next run's table."""
    if out_dir:
        return str(out_dir)
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            return str(HydraConfig.get().runtime.output_dir)
    except ImportError:
        pass
    now = time.localtime()
    return os.path.join("outputs", time.strftime("%Y-%m-%d", now), time.strftime("%H-%M-%S", now))


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ResultsFile:
    schema_version: int
    required: tuple[str, ...]
    key: Callable[[Mapping], tuple]
    what: str  # "a block benchmark file", in the refusal
    kind: str | None = None
    nan_as_null: bool = False
    """Write NaN / inf as null (standard JSON); off: json's NaN, as the block bench's files have it."""

    def new_doc(self) -> dict:
        kind = {} if self.kind is None else {"kind": self.kind}
        return {"schema_version": self.schema_version, **kind, "runs": [], "records": []}

    def check_records(self, records: Iterable[Mapping]) -> None:
        for i, r in enumerate(records):
            missing = [k for k in self.required if k not in r]
            if missing:
                raise ValueError(f"record {i} lacks {missing}")

    def load_doc(self, path: str) -> dict:
        """The results file at `path`, or a new one; a file that is not ours is an error, never overwritten."""
        if not os.path.exists(path):
            return self.new_doc()
        try:
            with open(path) as f:
                doc = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); move it away or pick another bench.out_dir") from exc
        ours = (isinstance(doc, dict) and doc.get("schema_version") == self.schema_version
                and isinstance(doc.get("records"), list) and (self.kind is None or doc.get("kind") == self.kind))
        if not ours:
            raise ValueError(f"{path} is not {self.what} (schema_version {self.schema_version}); move it away")
        self.check_records(doc["records"])
        doc.setdefault("runs", [])
        return doc

    def write_doc(self, doc: dict, json_path: str, md_path: str, markdown: Callable[[Mapping], str]) -> None:
        """The JSON and its markdown (`markdown(doc)`), each written atomically."""
        if self.nan_as_null:
            doc["records"] = [finite(r) for r in doc["records"]]
            text = json.dumps(finite(doc), indent=1, allow_nan=False)
        else:
            text = json.dumps(doc, indent=1)
        write_atomic(json_path, text + "\n")
        write_atomic(md_path, markdown(doc))

    def merge_record(self, doc: dict, record: Mapping) -> None:
        """Replace the record with the same key, else append."""
        rec = dict(record)
        self.check_records([rec])
        doc["records"] = [r for r in doc["records"] if self.key(r) != self.key(rec)] + [rec]

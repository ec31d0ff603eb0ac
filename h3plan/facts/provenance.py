"""Provenance: where a packaged hardware fact was measured (the typed node of a `provenance:` entry). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from omegaconf import MISSING


@dataclass
class Provenance:
    """The measurement a packaged fact came from: the results file, the row in it (the fields that find it there: a
    pipeline row's run, setting, label and vae; a profile's spec; an anchor's shape and backend) and the value taken.
    benchmarks/predict_holdout.py reads it to predict each measured row without the facts fitted to it."""

    file: str = MISSING
    row: Dict[str, str] = field(default_factory=dict)
    value: str = ""
    of: str = ""
    """Which of the point's values it is (an attention point's backend); empty: the whole point."""
    commit: str = ""
    """The commit whose version of `file` holds the row (a fact kept from an earlier run); empty: the file as it is."""

"""Quality as evidence: what a lossy setting was measured to do to the output, and the rule a budget is judged by.

A `QualityPoint` is one measurement of one lever setting at given knobs against the same seed's lossless output:
video PSNR / SSIM (frames in [0, 1], every frame and channel scored and averaged), the audio's SNR where measured,
the speed-up it came with, the requests it covers (workflows), where it was measured and its source. `kind`
says whose weights: `published` (released weights, a peer's measurement, cited from docs/sources.md) or
`calibrated` (the user's checkpoint, `action=calibrate`, read from the file it wrote).

`Budget.of(mapping)` reads psnr_db_min / ssim_min / audio_snr_db_min (None: that bound is not judged);
`point.misses(budget)` lists every bound the point does not reach, a metric the point lacks counting as a miss
(a budget on audio is never met by a video-only measurement); `meets` is no misses. `verdict(points, budget)`
judges the points that apply to one plan: the calibrated ones where any exist (the user's own checkpoint), else the
published ones; the worst of them decides.

`unmeasured`, one rule for every lossy lever with its own budget (step_cache's recipe.cache, sparse_attention's
recipe.sparse): a setting whose knobs no point covers for the request (its workflow and step count) is unmeasured.
The section's `unmeasured: true` is the user's permission to run one that the user named, setting and knobs: a forced
setting (levers.<lever>=<setting>), or a section that fixes them itself (recipe.cache.policy; recipe.sparse, whose
one lossy setting runs at recipe.sparse's knobs); the plan then says no measurement backs the budget. auto never picks
an unmeasured setting by itself: where it chooses among settings and knobs by their evidence (step_cache without a
policy), none evidenced is a refusal, `unmeasured: true` or not, naming the setting to force. Without `unmeasured:
true` a named unmeasured setting is refused in one line naming the best evidenced setting. A refusal never asks for a
value the user has already set.

A calibrated points file (FORMAT, version 1; `write_points` / `read_points`; JSON, or YAML by extension):

    {"format": "h3plan.quality_points", "version": 1, "lever": "step_cache", "checkpoint": "<model.path>",
     "date": "...", "points": [{"setting", "knobs": {...}, "workflows": [...], "psnr_db", "ssim",
                                "audio_snr_db", "speedup", "where"}]}

A missing, unreadable or malformed file, or one of another lever, raises EvidenceError naming the file (one line).
Torch-free; shared by every lossy lever that cites quality (step_cache; sparse attention).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping

from h3plan.errors import ConfigError, H3PlanError

FORMAT = "h3plan.quality_points"
VERSION = 1
KINDS = ("published", "calibrated")
# (point field, budget bound, name, unit): the metrics a point reports and a budget bounds, in print order
METRICS = (("ssim", "ssim_min", "SSIM", ""), ("psnr_db", "psnr_db_min", "PSNR", " dB"),
           ("audio_snr_db", "audio_snr_db_min", "audio SNR", " dB"))
POINT_KEYS = ("setting", "knobs", "workflows", "psnr_db", "ssim", "audio_snr_db", "speedup", "where")


class EvidenceError(H3PlanError):
    """A quality points file that cannot be read as one; str() is one line naming the file."""


@dataclass(frozen=True)
class Budget:
    """Lower bounds on a lossy setting's quality against the lossless output; None: not judged."""

    psnr_db_min: float | None = None
    ssim_min: float | None = None
    audio_snr_db_min: float | None = None

    @classmethod
    def of(cls, m: Mapping[str, Any] | None) -> Budget:
        m = m or {}
        return cls(**{b: None if m.get(b) is None else float(m[b]) for _, b, _, _ in METRICS})

    @property
    def empty(self) -> bool:
        return all(getattr(self, b) is None for _, b, _, _ in METRICS)

    def text(self) -> str:
        """'SSIM >= 0.93, PSNR >= 28 dB' (the bounds set, in METRICS order)."""
        return ", ".join(f"{name} >= {getattr(self, b):g}{unit}" for _, b, name, unit in METRICS
                         if getattr(self, b) is not None) or "no bound"


def _freeze(knobs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), v) for k, v in knobs.items()))


@dataclass(frozen=True)
class QualityPoint:
    """One measured quality of `lever`=`setting` at `knobs` (module docstring)."""

    lever: str
    setting: str
    knobs: tuple[tuple[str, Any], ...]
    """The values it ran at, sorted (name, value) pairs; it applies to a plan whose own values equal every one."""
    workflows: tuple[str, ...]
    psnr_db: float | None
    ssim: float | None
    audio_snr_db: float | None = None
    speedup: float | None = None
    kind: str = "published"
    where: str = ""
    """Hardware, request and samples, in a few words."""
    source: str = ""
    """docs/sources.md#<anchor> (published) or the points file (calibrated)."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"QualityPoint.kind={self.kind!r}: one of {KINDS}")

    @classmethod
    def make(cls, lever: str, setting: str, knobs: Mapping[str, Any], workflows: Iterable[str], **kw) -> QualityPoint:
        return cls(lever, setting, _freeze(knobs), tuple(workflows), **kw)

    def knob(self, name: str, default: Any = None) -> Any:
        return dict(self.knobs).get(name, default)

    def applies(self, lever: str, setting: str, knobs: Mapping[str, Any], workflow: str | None) -> bool:
        """Measured for this lever and setting, at every knob value the plan has, on this workflow."""
        return (self.lever == lever and self.setting == setting and (workflow is None or workflow in self.workflows)
                and all(k in knobs and knobs[k] == v for k, v in self.knobs))

    def misses(self, budget: Budget) -> list[str]:
        """Every bound of `budget` this point does not reach ('SSIM 0.901 < 0.93'; a metric it lacks: 'audio SNR
        not measured')."""
        out = []
        for f, b, name, unit in METRICS:
            bound, got = getattr(budget, b), getattr(self, f)
            if bound is None:
                continue
            if got is None:
                out.append(f"{name} not measured")
            elif got < bound:
                out.append(f"{name} {got:g}{unit} < {bound:g}{unit}")
        return out

    def meets(self, budget: Budget) -> bool:
        return not self.misses(budget)

    def quality(self) -> str:
        """'SSIM 0.931 / PSNR 28.16 dB' (+ ' / audio SNR 20.7 dB' where measured)."""
        return " / ".join(f"{name} {getattr(self, f):g}{unit}" for f, _, name, unit in METRICS
                          if getattr(self, f) is not None) or "no quality figure"

    def cite(self) -> str:
        """The quality, speed, where and source in one clause (the kind is the caller's to say)."""
        speed = f" at {self.speedup:.2f}x" if self.speedup else ""
        return f"{self.quality()}{speed} ({self.where}; {self.source})"


@dataclass(frozen=True)
class Verdict:
    """How the evidence that applies to one plan stands against a budget: status `meets`, `misses` or `unmeasured`
    (no point applies); `point`: the point that decides (the worst of those judged); `misses`: its misses."""

    status: str
    point: QualityPoint | None = None
    misses: tuple[str, ...] = ()
    judged: tuple[QualityPoint, ...] = field(default=())


def verdict(points: Iterable[QualityPoint], budget: Budget) -> Verdict:
    """Judge the points that apply to a plan (already filtered with `applies`): calibrated ones where any exist,
    else the published ones; every one must meet the budget, and the worst (most misses, then lowest SSIM, PSNR)
    decides."""
    pts = list(points)
    mine = [p for p in pts if p.kind == "calibrated"]
    judged = mine or pts
    if not judged:
        return Verdict("unmeasured")

    def badness(p: QualityPoint):
        return (-len(p.misses(budget)), _num(p.ssim), _num(p.psnr_db), _num(p.audio_snr_db))

    worst = min(judged, key=badness)
    miss = worst.misses(budget)
    return Verdict("misses" if miss else "meets", worst, tuple(miss), tuple(judged))


def _num(x: float | None) -> float:
    return -math.inf if x is None else x


def best(points: Iterable[QualityPoint]) -> QualityPoint | None:
    """The point of the highest quality (SSIM, then PSNR, then audio SNR; a missing figure ranks last)."""
    pts = list(points)
    return max(pts, key=lambda p: (_num(p.ssim), _num(p.psnr_db), _num(p.audio_snr_db))) if pts else None


# ---------------------------------------------------------------- calibrated points files


def write_points(path: str, lever: str, points: Iterable[QualityPoint], *, checkpoint: str | None, date: str) -> None:
    """Write calibrated points (module docstring); JSON for a .json path, else YAML."""
    body = {"format": FORMAT, "version": VERSION, "lever": lever, "checkpoint": checkpoint, "date": date,
            "points": [{"setting": p.setting, "knobs": dict(p.knobs), "workflows": list(p.workflows),
                        "psnr_db": p.psnr_db, "ssim": p.ssim, "audio_snr_db": p.audio_snr_db, "speedup": p.speedup,
                        "where": p.where} for p in points]}
    if str(path).lower().endswith(".json"):
        text = json.dumps(body, indent=2) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(body, sort_keys=False, width=120)
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise EvidenceError(f"quality points file {path}: cannot write it ({e.strerror or e})") from None


def read_points(path: str, lever: str) -> tuple[tuple[QualityPoint, ...], str | None]:
    """(the calibrated points of `lever` in the file, the checkpoint they were measured on); EvidenceError on a file
    that is missing, unreadable, malformed, of another format or version, or of another lever."""
    where = f"quality points file {path}"
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise EvidenceError(f"{where}: {getattr(e, 'strerror', None) or e}") from None
    try:
        if str(path).lower().endswith(".json"):
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError: either way one line
        raise EvidenceError(f"{where}: not JSON or YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, Mapping) or raw.get("format") != FORMAT:
        raise EvidenceError(f"{where}: not an h3plan quality points file (format: {FORMAT}; "
                            f"action=calibrate writes one)")
    if raw.get("version") != VERSION:
        raise EvidenceError(f"{where}: version {raw.get('version')!r}, this h3plan reads {VERSION}")
    if raw.get("lever") != lever:
        raise EvidenceError(f"{where}: points of lever {raw.get('lever')!r}, not {lever}")
    pts = raw.get("points")
    if not isinstance(pts, list) or not pts:
        raise EvidenceError(f"{where}: needs a non-empty 'points' list")
    out = []
    for i, p in enumerate(pts):
        if not isinstance(p, Mapping) or set(p) - set(POINT_KEYS) or not {"setting", "knobs", "workflows"} <= set(p):
            raise EvidenceError(f"{where}: points[{i}] needs setting, knobs, workflows (keys: {', '.join(POINT_KEYS)})")
        for k in ("psnr_db", "ssim", "audio_snr_db", "speedup"):
            v = p.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise EvidenceError(f"{where}: points[{i}].{k}={v!r} must be a finite number or null")
        if not isinstance(p["knobs"], Mapping) or not isinstance(p["workflows"], list):
            raise EvidenceError(f"{where}: points[{i}]: knobs must be a mapping and workflows a list")
        out.append(QualityPoint.make(lever, str(p["setting"]), p["knobs"], [str(w) for w in p["workflows"]],
                                     psnr_db=p.get("psnr_db"), ssim=p.get("ssim"), audio_snr_db=p.get("audio_snr_db"),
                                     speedup=p.get("speedup"), kind="calibrated", where=str(p.get("where") or ""),
                                     source=os.fspath(path)))
    ckpt = raw.get("checkpoint")
    return tuple(out), None if ckpt is None else str(ckpt)


__all__ = ["Budget", "QualityPoint", "Verdict", "verdict", "best", "write_points", "read_points", "EvidenceError",
           "FORMAT", "VERSION", "METRICS"]


def with_calibrated(published: tuple[QualityPoint, ...], path: str | None, lever: str, key: str,
                    model_path: str | None) -> tuple[QualityPoint, ...]:
    """The published points, and the calibrated ones of the points file at `path` (the recipe key `key` names it;
    None: published only). A file measured on another checkpoint than `model_path` is a ConfigError on `key`; an
    unreadable one an EvidenceError (one line each). The file is read once per modification time."""
    if not path:
        return published
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = None
    mine, ckpt = _read_at(str(path), lever, stamp)
    if ckpt and model_path and not _same_path(ckpt, model_path):
        raise ConfigError(f"{key}={path}", f"was calibrated on {ckpt}, not this plan's model.path={model_path}")
    return published + mine


@lru_cache(maxsize=8)
def _read_at(path: str, lever: str, stamp) -> tuple[tuple[QualityPoint, ...], str | None]:
    return read_points(path, lever)


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))

"""The `calibrate:` config section of `python -m h3plan action=calibrate` (h3plan/actions/calibrate.py).

A plain dataclass (no torch, no omegaconf) so h3plan/planning/schema.py can type the section as it types
`verify:` and `bench:`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class CalibrateConfig:
    out: str = "fp8_scales.json"
    """Where the table goes. A table the held-out check refuses goes to <stem>.rejected.json instead (never
    loadable: its provenance says it failed) and the command exits 2."""
    inputs: Optional[str] = None
    """Captured inputs: a .pt file (one dict of MiniMaxH3Transformer3DModel.forward keyword arguments, or a list
    of them) or a directory of such files (h3plan.actions.calibration.capture_inputs writes one). null: seeded
    synthetic inputs (seeds x steps below)."""
    heldout_inputs: Optional[str] = None
    """Captured held-out inputs (same forms). null with `inputs` set: the last quarter (at least one) of the
    captured inputs, in file order, is held out and not calibrated on."""
    seeds: List[int] = field(default_factory=lambda: [0, 1])
    """Seeds of the synthetic calibration inputs (latents, text and audio conditioning)."""
    steps: Optional[List[int]] = None
    """Denoising steps (indices into the scheduler's timesteps) per seed; null: `count` steps evenly spread."""
    count: int = 4
    """Steps per seed when `steps` is null."""
    heldout_seeds: List[int] = field(default_factory=lambda: [1000])
    """Seeds of the held-out inputs; must not overlap `seeds`."""
    heldout_steps: Optional[List[int]] = None
    """Held-out steps; null: the midpoints between the calibration steps (other noise levels)."""
    num_inference_steps: int = 50
    """The schedule the steps index: diffusers' MiniMaxH3Scheduler.set_timesteps(num_inference_steps)."""
    video_shift: float = 12.0
    """Sigma shift of the video schedule (diffusers' MiniMax-H3 pipeline: shift 12 for video)."""
    audio_shift: float = 3.0
    """Sigma shift of the audio schedule (diffusers' MiniMax-H3 pipeline: shift 3 for audio)."""
    seq_len: Optional[int] = None
    """Packed rows of the synthetic inputs; null: 48 on the CPU, parallel.seq_len on a GPU."""
    margin: Optional[float] = None
    """scale = 448 / (amax * margin) in the held-out check; null: recipe.fp8_static_margin."""
    max_loss_db: Optional[float] = 3.0
    """Held-out check: on the blocks' own update (final hidden state minus the stack's input) static scales may
    lose at most this much PSNR to dynamic ones (null: only the recipe's budget on the outputs counts)."""
    statistic: str = "amax"
    """What the table stores: `amax` (max |x| over every calibration input) or `percentile` (the
    `percentile` of |x| over all of them, which clips the rarest outliers)."""
    percentile: Optional[float] = 99.99
    """Also record this percentile of |x| per site (a log2 histogram, 1/16 octave); null: skip it."""
    checkpoint: Optional[str] = None
    """A diffusers MiniMaxH3Transformer3DModel directory (from_pretrained); null: seeded random weights
    (model=..., `weights_seed`), like action=verify."""
    subfolder: Optional[str] = None
    """from_pretrained subfolder (e.g. transformer) of `checkpoint`."""
    weights_seed: int = 0
    blocks: Optional[int] = None
    """Truncate the block stack (GPU smoke runs); null: every block of the model."""
    device: str = "auto"
    dtype: str = "bf16"

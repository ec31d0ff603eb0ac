"""The shapes of published MiniMax-H3 step-distilled (Turbo) LoRAs: rank and target modules, as their publishers
load them (docs/sources.md#turbo-lora). Seeded stand-ins of these shapes test and time a plan with a LoRA
(h3plan/actions/inputs.py `seeded_lora`); no weights of theirs are used.
"""

from __future__ import annotations

from dataclasses import dataclass

from h3plan.facts.blocks import BLOCK_LINEARS

ATTENTION_FFN = BLOCK_LINEARS  # attention q, k, v, out and the SwiGLU FFN's two, in either kind of block


@dataclass(frozen=True)
class LoraShape:
    name: str
    blocks: tuple[str, ...]
    """The block lists the adapter reaches (MiniMaxH3Transformer3DModel attribute names)."""
    targets: tuple[str, ...]
    """Module paths inside each block."""
    rank: int
    extra: tuple[tuple[str, int], ...] = ()
    """(module path, rank) of single modules (per block where the path holds `{i}`), at their own rank."""
    alpha: int | None = None
    """The alpha it is loaded with (None: alpha-less, diffusers loads it at alpha == rank, scale 1)."""
    source: str = "docs/sources.md#turbo-lora"


# lightx2v/Minimax-h3-Turbo (ModelTC), the FL2VA Turbo v1.0 768p diffusers file: one rank, the attention and FFN
# linears of every transformer and token-refiner block (312 at the released 50 + 2 blocks), no AdaLN projection.
TURBO = LoraShape("turbo", ("transformer_blocks", "token_refiner.refiner_blocks"), ATTENTION_FFN, 128, alpha=128)
# larryvrh/MiniMax-H3-Turbo-Lora as diffusers 0.42.1 describes it: rank 64 on attention and FFN, 16 on the AdaLN
# projections (every block's adaln_proj.linear and norm_out.linear), alpha-less.
TURBO_ADALN = LoraShape("turbo_adaln", ("transformer_blocks",), ATTENTION_FFN, 64,
                        extra=(("transformer_blocks.{i}.adaln_proj.linear", 16), ("norm_out.linear", 16)))

SHAPES = {s.name: s for s in (TURBO, TURBO_ADALN)}

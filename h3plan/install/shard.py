"""Sequence shards for Ulysses (degree U > 1): each rank runs the block stack on its S_loc = ceil(S/U)
rows (h3plan.runtime.parallel: shard_rows pads the tail with zero rows, gather_rows restores the sequence).

The first block shards the hidden states; every block shards its own copies of the per-row inputs
(AdaLN table indices, RoPE cos/sin), which diffusers passes unsharded to each block. The output side
(`shard_heads`): the last block keeps its rows, `norm_out` runs on them (its per-row timestep indices
sharded like the blocks'), and `proj_out` / `audio_proj_out` all-gather their small float32 outputs and
trim the padding, so diffusers' row selection after them sees the full sequence. Every op there is per
row, so the bits do not change; what changes is that the float32 head GEMMs and the norm run on S/U rows,
not S, and the gather moves the heads' outputs (S x 192 and S x 128 float32 rows at MiniMax-H3's width)
instead of the (S x hidden) bf16 hidden states. Without `shard_heads` the last block gathers its rows.
The attention processor reads `seq_len` (the unpadded S) for UlyssesAttention. Padding rows carry zero
inputs (index 0, angle 0); their outputs are computed and dropped.
"""

from __future__ import annotations

from h3plan.facts.sizes import shard_len
from h3plan.levers import owner
from h3plan.runtime.parallel.comm import gather_rows, shard_rows

from .hooks import attach


class SequenceShard:
    def __init__(self, group, degree: int, first: int, last: int):
        self.group, self.degree, self.first, self.last = group, degree, first, last
        self.seq_len: int | None = None
        self.heads = False  # set by shard_heads: the last block keeps its rows for the sharded output heads

    def enter(self, block, hidden_states, adaln_indices, rotary_emb):
        S = adaln_indices.shape[0]
        self.seq_len = S
        if block._h3plan_index == self.first:
            if hidden_states.shape[1] != S:
                raise ValueError(f"first block got {hidden_states.shape[1]} rows for a sequence of {S}")
            hidden_states = shard_rows(hidden_states, self.group, dim=1)
        idx = shard_rows(adaln_indices, self.group, dim=0)
        cos, sin = (shard_rows(t, self.group, dim=0) for t in rotary_emb)
        return hidden_states, idx, (cos, sin)

    def exit(self, block, hidden_states):
        if block._h3plan_index != self.last or self.heads:
            return hidden_states
        return gather_rows(hidden_states, self.group, dim=1, seq_len=self.seq_len)


def shard_heads(model, shard: SequenceShard, state) -> None:
    """Run `norm_out`, `proj_out` and `audio_proj_out` on this rank's rows (see the module docstring): each wraps its
    forward in a hook named for the lever that owns Ulysses' degree, removed by uninstall."""
    def sharded(rows: int) -> bool:  # this call carries the shard's rows (a full-sequence call passes through)
        return shard.seq_len is not None and rows == shard_len(shard.seq_len, shard.degree) != shard.seq_len

    def norm_out(forward, hidden_states, temb, timestep_indices):
        if sharded(hidden_states.shape[1]) and timestep_indices.shape[0] == shard.seq_len:
            timestep_indices = shard_rows(timestep_indices, shard.group, dim=0)
        return forward(hidden_states, temb, timestep_indices)

    def head(forward, x):
        y = forward(x)
        return gather_rows(y, shard.group, dim=1, seq_len=shard.seq_len) if sharded(x.shape[1]) else y

    lever = owner("ulysses_degree")
    attach(model.norm_out, "norm_out", lever, norm_out, state, replaces=False)
    attach(model.proj_out, "proj_out", lever, head, state, replaces=False)
    attach(model.audio_proj_out, "audio_proj_out", lever, head, state, replaces=False)
    shard.heads = True

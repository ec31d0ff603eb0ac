"""Sequence shards for Ulysses (degree U > 1): each rank runs the block stack on its S_loc = ceil(S/U)
rows (h3plan.parallel: shard_rows pads the tail with zero rows, gather_rows restores the sequence).

The first block shards the hidden states; every block shards its own copies of the per-row inputs
(AdaLN table indices, RoPE cos/sin), which diffusers passes unsharded to each block; the last block
all-gathers its output rows and trims the padding, so `norm_out` and the heads see the full sequence.
The attention processor reads `seq_len` (the unpadded S) for UlyssesAttention. Padding rows carry zero
inputs (index 0, angle 0); their outputs are computed and dropped.
"""

from __future__ import annotations


class SequenceShard:
    def __init__(self, group, degree: int, first: int, last: int):
        self.group, self.degree, self.first, self.last = group, degree, first, last
        self.seq_len: int | None = None

    def enter(self, block, hidden_states, adaln_indices, rotary_emb):
        from h3plan.parallel.comm import shard_rows

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
        if block._h3plan_index != self.last:
            return hidden_states
        from h3plan.parallel.comm import gather_rows

        return gather_rows(hidden_states, self.group, dim=1, seq_len=self.seq_len)

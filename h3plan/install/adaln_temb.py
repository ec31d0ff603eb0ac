"""adaln_table under a whole-model compile: the timestep embedding runs as two opaque ops, so temb keeps eager's bits.

The tables (install/adaln_table.py) are keyed by the exact bits of `temb`, which diffusers' transformer computes as
`time_embedder(time_proj(timestep).to(dtype))`: the sinusoid (`get_timestep_embedding`) then a two-layer SiLU MLP.
Under `torch.compile(model)` Inductor generates its own sin/cos/exp and fuses the MLP's epilogues, so its temb differs
from eager's in the last bits, and every timestep of a call would be a table miss: each one streams all 51 linears'
weights (24 GiB at real width) over PCIe, slower than no plan (on the H200, tests/gpu/test_compile_gpu.py: with
the embedding compiled, whole-model compile counted `adaln_table.fallback` on each new timestep; diffusers' regional
compile leaves the embedding eager and hits).

So while the tables are installed, `time_proj.forward` and `time_embedder.forward` call `h3plan::timestep_sinusoid`
and `h3plan::timestep_mlp`, custom ops whose implementations are diffusers' own expressions run eagerly (the same
function, the same F.linear / F.silu calls); with a fake each, so dynamo traces them as single nodes (fullgraph, export
and AOTInductor alike). Eager calls give the very bits of diffusers' modules (tests/install/test_install_adaln_temb.py).
Grad mode, autocast, devices other than cuda / cpu and linears wrapped since install (a LoRA's PEFT layers, which
the op would bypass) call the modules' own forwards (what diffusers would run). Applied only to the modules diffusers
builds for H3 (`Timesteps`; `TimestepEmbedding` with a SiLU, no condition projection, no post-activation); any other
form keeps its forward and the table still serves eager and regional compile. Uninstall removes the hooks.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from h3plan.runtime.guards import needs_grad

from .hooks import attach


@torch.library.custom_op("h3plan::timestep_sinusoid", mutates_args=())
def timestep_sinusoid(timesteps: torch.Tensor, num_channels: int, flip_sin_to_cos: bool, downscale_freq_shift: float,
                      scale: float) -> torch.Tensor:
    """diffusers' `Timesteps.forward`: get_timestep_embedding(timesteps, num_channels, ...), run eagerly."""
    from diffusers.models.embeddings import get_timestep_embedding

    return get_timestep_embedding(timesteps, num_channels, flip_sin_to_cos=flip_sin_to_cos,
                                  downscale_freq_shift=downscale_freq_shift, scale=scale)


@timestep_sinusoid.register_fake
def _(timesteps, num_channels, flip_sin_to_cos, downscale_freq_shift, scale):
    return timesteps.new_empty((timesteps.shape[0], num_channels), dtype=torch.float32)


@torch.library.custom_op("h3plan::timestep_mlp", mutates_args=())
def timestep_mlp(x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                 b2: Optional[torch.Tensor]) -> torch.Tensor:
    """diffusers' `TimestepEmbedding.forward` with act SiLU and no condition / post-activation, run eagerly."""
    return F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)


@timestep_mlp.register_fake
def _(x, w1, b1, w2, b2):
    return x.new_empty((*x.shape[:-1], w2.shape[0]))


OP_DEVICES = ("cuda", "cpu")  # where Inductor compiles the embedding; any other device keeps the module's forward


def _eager_needed(*tensors) -> bool:
    kind = tensors[0].device.type
    return kind not in OP_DEVICES or needs_grad(*tensors) or torch.is_autocast_enabled(kind)


def sinusoid_forward(self, timesteps: torch.Tensor) -> torch.Tensor:
    if _eager_needed(timesteps):
        return type(self).forward(self, timesteps)
    return torch.ops.h3plan.timestep_sinusoid(timesteps, self.num_channels, bool(self.flip_sin_to_cos),
                                              float(self.downscale_freq_shift), float(self.scale))


def mlp_forward(self, sample: torch.Tensor, condition=None) -> torch.Tensor:
    l1, l2 = self.linear_1, self.linear_2
    if type(l1) is not torch.nn.Linear or type(l2) is not torch.nn.Linear:  # a LoRA's PEFT layers: they must run
        return type(self).forward(self, sample, condition)
    if condition is not None or _eager_needed(sample, l1.weight, l2.weight):
        return type(self).forward(self, sample, condition)
    return torch.ops.h3plan.timestep_mlp(sample, l1.weight, l1.bias, l2.weight, l2.bias)


def why_not(model) -> str | None:
    """None when the model's embedding modules are the form the ops reproduce; else why they keep their forwards."""
    from diffusers.models.embeddings import TimestepEmbedding, Timesteps

    proj, emb = getattr(model, "time_proj", None), getattr(model, "time_embedder", None)
    if type(proj) is not Timesteps:
        return f"time_proj is {type(proj).__name__}, not diffusers' Timesteps"
    if type(emb) is not TimestepEmbedding:
        return f"time_embedder is {type(emb).__name__}, not diffusers' TimestepEmbedding"
    if emb.cond_proj is not None or emb.post_act is not None or type(emb.act) is not torch.nn.SiLU:
        return "time_embedder has a condition projection, a post-activation or another activation than SiLU"
    if type(emb.linear_1) is not torch.nn.Linear or type(emb.linear_2) is not torch.nn.Linear:
        return "time_embedder's linears are not torch.nn.Linear"
    return None


def install(model, state, lever: str) -> str | None:
    """Hook the two forwards (`h3plan.<lever>`: the lever whose tables need temb's eager bits; removed by uninstall);
    returns why not, where the modules are another form."""
    why = why_not(model)
    if why is not None:
        return why
    attach(model.time_proj, "time_proj", lever, sinusoid_forward, state)
    attach(model.time_embedder, "time_embedder", lever, mlp_forward, state)
    return None


__all__ = ["install", "why_not", "timestep_sinusoid", "timestep_mlp"]

"""Is this the model the plan is for: diffusers' MiniMaxH3Transformer3DModel with the submodules the swaps touch
(`recognise`), of the widths the plan was resolved for (`check_model_facts`), with no more layers (`fewer_layers`).
Each refusal is one InstallError line."""

from __future__ import annotations

import torch

from h3plan.errors import InstallError
from h3plan.planner import Plan



def _classes():
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.models.transformers import transformer_minimax_h3 as h3

    return MiniMaxH3Transformer3DModel, h3.MiniMaxH3TransformerBlock, h3.MiniMaxH3Attention


def is_transformer(model) -> bool:
    """diffusers' MiniMaxH3Transformer3DModel (or a subclass): a model the transformer install takes."""
    return isinstance(model, _classes()[0])


def recognise(model) -> None:
    """Raise one ValueError unless `model` is a diffusers MiniMax-H3 transformer with the expected parts."""
    Model, Block, Attention = _classes()
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    if hasattr(model, "_orig_mod"):
        raise InstallError(f"h3plan.install got a torch.compile wrapper ({name}); install into the model, then compile")
    if not isinstance(model, Model):
        raise InstallError("h3plan.install supports the MiniMax-H3 VAE (diffusers' AutoencoderKLMiniMaxH3) and "
                           f"otherwise supports diffusers' MiniMaxH3Transformer3DModel only; got {name}")
    problems = []
    blocks = getattr(model, "transformer_blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
        problems.append("transformer_blocks is missing or empty")
    for i, b in enumerate(blocks or ()):
        if not isinstance(b, Block):
            problems.append(f"transformer_blocks.{i} is {type(b).__name__}")
            continue
        if not isinstance(getattr(b, "attn", None), Attention):
            problems.append(f"transformer_blocks.{i}.attn is not MiniMaxH3Attention")
        for path in ("norm1", "norm2", "adaln_proj", "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                     "attn.norm_q", "attn.norm_k", "ff.net.0.proj", "ff.net.2"):
            try:
                b.get_submodule(path)
            except AttributeError:
                problems.append(f"transformer_blocks.{i}.{path} is missing")
        if "forward" in b.__dict__ and "_diffusers_hook" not in b.__dict__:  # hooks: install/hooks.py judges them
            problems.append(f"transformer_blocks.{i} already has an instance forward (not a diffusers hook); install "
                            "before replacing forwards")
    # the output heads (sharded under Ulysses, install/shard.py)
    for path in ("norm_out", "proj_out", "audio_proj_out"):
        if not isinstance(getattr(model, path, None), torch.nn.Module):
            problems.append(f"{path} is missing")
    if problems:
        raise InstallError("h3plan.install: unexpected MiniMaxH3Transformer3DModel layout: " + "; ".join(problems[:5]))


# The model facts a plan was resolved for that must match the model it is installed into. Layer counts may be
# fewer (the report says so), never more: the plan's memory estimate, AdaLN tables and scale tables count the
# blocks it was resolved for; verify and bench, which build any number of blocks of the plan's width, say stand_in.
MODEL_FACTS = {"transformer": ("model", ("num_attention_heads", "attention_head_dim", "hidden_size", "ffn_dim",
                                         "rope_freq_dim")),
               "vae": ("vae", ("latent_channels", "decoder_num_attention_heads", "decoder_attention_head_dim",
                               "decoder_ffn_mult"))}
LAYER_FACTS = {"transformer": ("num_layers", "num_refiner_layers"), "vae": ("decoder_num_layers",)}


def fewer_layers(model, plan: Plan, kind: str) -> list[str]:
    """`num_layers 2 (plan: 50)` for each layer count of the model below the plan's (an InstallError above it)."""
    section = MODEL_FACTS[kind][0]
    planned = (plan.get(section) or {}).get("diffusers_config") or {}
    config = getattr(model, "config", {}) or {}
    out = []
    for k in LAYER_FACTS[kind]:
        if k not in planned or not isinstance(config.get(k), int):
            continue
        if config[k] > planned[k]:
            raise InstallError(f"the plan was resolved for {planned[k]} {k.replace('_', ' ').removeprefix('num ')} "
                               f"({section}.diffusers_config.{k}={planned[k]}), this {type(model).__name__} has "
                               f"{config[k]}: its memory estimate and tables count {planned[k]}; plan from what you "
                               f"have: h3plan.plan_for(model, recipe=...)")
        if config[k] < planned[k]:
            out.append(f"{k} {config[k]} (plan: {planned[k]})")
    return out


def check_model_facts(model, plan: Plan, kind: str) -> None:
    """InstallError (one line) when the plan's model facts differ from `model.config` (a plan for 56 heads into
    a 4-head model, say); plans without a model section (hand-built ones in tests) are not checked."""

    section, keys = MODEL_FACTS[kind]
    planned = (plan.get(section) or {}).get("diffusers_config") or {}
    config = getattr(model, "config", {}) or {}
    wrong = [f"{k} {planned[k]} (model: {config.get(k)})" for k in keys if k in planned and config.get(k) != planned[k]]
    if wrong:
        name = (plan.get(section) or {}).get("name", "?")
        obj = "vae" if kind == "vae" else "model"
        raise InstallError(f"the plan was resolved for {section}={name}, which does not match this "
                           f"{type(model).__name__}: " + ", ".join(wrong)
                           + f"; plan from what you have: h3plan.plan_for({obj}, recipe=..., parallel=...) "
                           f"reads the widths from its config (a pipeline or a checkpoint folder works too), or "
                           f"h3plan.install({obj}, recipe=...) plans and installs in one call")

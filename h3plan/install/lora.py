"""LoRAs (diffusers' PEFT integration) and an installed plan: a LoRA runs wherever the plan calls diffusers' own
linears, and is refused in one line where the plan would bypass its layers.

What a plan bypasses (`bypassed(model, builder)`: module fqn -> why, from the plan's install options):
- adaln_table: every block's `adaln_proj.linear` and `norm_out.linear` are served from a table computed from their
  weights at install (install/adaln_table.py); `time_embedder.linear_1` / `linear_2` compute temb, the table's key;
- gemm_quant (fp8, nvfp4): the six block linears become quantised GEMMs holding the weights' codes at install;
  PEFT has no layer for them (its own error is a multi-line ValueError);
- Ulysses or ring (degree > 1): `proj_out` and `audio_proj_out` gather the sequence inside their forward, so a LoRA
  layer around one would add a delta of the shard's rows to the gathered output.
h3plan's quantised linears already in the model when a LoRA comes (a pre-quantised checkpoint) count too. Every
other module stays diffusers' nn.Linear and the plan's forwards call it as a module, so PEFT's layers around it run:
a lossless plan with a LoRA gives diffusers' eager bits with the same LoRA.

The ways in, after install (`guard`, instance attributes that uninstall drops):
- `load_lora_adapter` (what `pipe.load_lora_weights` calls per partition) and `add_adapter` inject PEFT layers. Each
  first reads the modules the adapter targets (the state dict's module names, which is how PEFT places the layers
  diffusers hands it a state dict for; a LoraConfig matched as PEFT matches it) and, where one is bypassed, refuses
  before any layer is touched: one InstallError line naming those modules and the way to run the LoRA (uninstall,
  load and fuse, install again; or a plan without that lever). A PEFT "Target module ... is not supported" error that
  still comes becomes that one line too.
- `set_adapters`, `set_adapter`, `enable_lora` / `disable_lora`, `fuse_lora` / `unfuse_lora`, `unload_lora(_weights)`,
  `delete_adapters`: act on layers already there, which never wrap a bypassed module (refused at load or at install);
  a fuse writes into the weights of diffusers' own linears, which the plan reads at every call.
At install (`refuse_peft`): PEFT layers around a module the plan would bypass are refused in one line (fuse them
first); any others are kept and run as above. Layers injected around a bypassed module some other way (peft's
`inject_adapter_in_model`): a tabled AdaLN linear raises the same line at its next call (install/adaln_table.py), the
timestep MLP runs its module forward (its temb then misses the table, counted and served exactly:
install/adaln_temb.py), and PEFT itself refuses a quantised GEMM.
"""

from __future__ import annotations

import copy
import functools
import re
import types

from h3plan.errors import InstallError
from h3plan.levers import TERM_OWNERS
from h3plan.runtime.quant import BLOCK_LINEARS

from .components import STATE
from .hooks import effect

TEMB = ("time_embedder.linear_1", "time_embedder.linear_2")
HEADS = ("proj_out", "audio_proj_out")
QUANT_MODULES = "h3plan.runtime.quant."
# where a PEFT state-dict key's module name ends (LoRA / LoKr; kohya's `.lora.down` before diffusers converts it)
MARKERS = (".lora_", ".lora.", ".lokr_")
# load_lora_adapter's keyword arguments that locate and read the file (diffusers 0.42.1 PeftAdapterMixin)
FETCH = ("weight_name", "use_safetensors", "local_files_only", "cache_dir", "force_download", "proxies", "token",
         "revision", "subfolder")
TABLES = TERM_OWNERS["adaln_tables"]  # the lever that serves the AdaLN linears from tables
WAY = ("to run it: h3plan.uninstall(pipe), load and fuse the LoRA (pipe.load_lora_weights(...); pipe.fuse_lora(); "
       "pipe.unload_lora_weights()), then h3plan.install(pipe, plan)")


def bypassed(model, builder) -> dict[str, str]:
    """{module fqn: why} of the modules the plan recorded on `builder` serves without calling them (module doc)."""
    lin, att = builder.view("linears"), builder.view("attention")
    n = len(model.transformer_blocks)
    out = {}
    if builder.option_of(TABLES) is not None:
        table = "served from the adaln_table built from its weights at install (or plan levers.adaln_table=off)"
        out.update({f"transformer_blocks.{i}.adaln_proj.linear": table for i in range(n)})
        out["norm_out.linear"] = table
        out.update(dict.fromkeys(TEMB, "computes temb, the key of the adaln_table (or plan levers.adaln_table=off)"))
    if lin.quant is not None:
        gemm = f"replaced by an {lin.quant['format']} GEMM of its weights at install (gemm_quant; or plan recipe=bf16)"
        out.update({f"transformer_blocks.{i}.{p}": gemm for i in range(n) for p in BLOCK_LINEARS})
    if att.ulysses_degree > 1 or att.ring_degree > 1:
        out.update(dict.fromkeys(HEADS, "gathers the sequence shards inside its forward (Ulysses)"))
    return out


def _bypassed_now(model) -> dict[str, str]:
    """The installed plan's bypassed modules and any h3plan quantised linear the model holds."""
    quantised = {n: f"an h3plan {type(m).__name__} (a quantised GEMM)" for n, m in model.named_modules()
                 if type(m).__module__.startswith(QUANT_MODULES)}
    state = model.__dict__.get(STATE)
    return {**quantised, **(getattr(state, "lora_bypass", None) or {})}


def peft_layers(model) -> list[str]:
    """Names of the PEFT tuner layers in `model` (a LoRA loaded through diffusers or peft, fused or not)."""
    return [n for n, m in model.named_modules()
            if type(m).__module__.startswith("peft.") and hasattr(m, "base_layer")]


def _describe(hit: dict[str, str]) -> str:
    by_why: dict[str, list[str]] = {}
    for fqn, why in hit.items():
        by_why.setdefault(why, []).append(fqn)
    parts = []
    for why, fqns in by_why.items():
        more = f" and {len(fqns) - 3} more" if len(fqns) > 3 else ""
        parts.append(f"{', '.join(fqns[:3])}{more}: {why}")
    return "; ".join(parts)


def refuse_peft(model, bypass: dict[str, str]) -> None:
    """InstallError (one line) when PEFT layers wrap a module the plan would bypass; other PEFT layers stay and run."""
    names = set(peft_layers(model))
    layers = {n: m for n, m in model.named_modules() if n in names}
    hit = {n: bypass[n] for n in layers if n in bypass}
    if hit:
        fused = all(getattr(layers[n], "merged", False) for n in hit)
        raise InstallError(f"h3plan.install: a LoRA's PEFT layers ({'fused, layers kept' if fused else 'not fused'}) "
                           f"wrap {len(hit)} module(s) the plan would bypass ({_describe(hit)}); fuse it and drop "
                           "the PEFT layers first (pipe.fuse_lora(); pipe.unload_lora_weights()), then "
                           "h3plan.install(pipe, plan)")


def state_dict_targets(state_dict, prefix: str | None) -> set[str]:
    """The modules a LoRA state dict's keys name under `prefix` (as load_lora_adapter filters them): what precedes
    the last LoRA / LoKr infix of each key (PEFT's own rule for a state dict it is handed)."""
    out = set()
    for key in state_dict:
        if prefix is not None:
            if not key.startswith(f"{prefix}."):
                continue
            key = key[len(prefix) + 1:]
        cut = max(key.rfind(m) for m in MARKERS)
        if cut > 0:
            out.add(key[:cut].removeprefix("_orig_mod."))
    return out


def config_targets(model, config) -> set[str]:
    """The modules PEFT would wrap for `config` (a LoraConfig or another PeftConfig with target_modules): its own
    matching (`check_target_module_exists`, 'all-linear' expanded), outside the PEFT layers already there."""
    from peft.tuners.tuners_utils import BaseTunerLayer, check_target_module_exists

    if getattr(config, "target_modules", None) is None:
        return set()  # PEFT refuses or derives none for a diffusers model: its own error stands
    try:
        from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

        config = _maybe_include_all_linear_layers(copy.deepcopy(config), model)
    except ImportError:  # another peft: 'all-linear' stays a pattern (nothing matches it)
        pass
    inner = tuple(f"{n}." for n, m in model.named_modules() if isinstance(m, BaseTunerLayer))
    return {n for n, _ in model.named_modules()
            if n and not n.startswith(inner) and check_target_module_exists(config, n)}


def _refuse(who: str, targets: set[str], model) -> None:
    bypass = _bypassed_now(model)
    hit = {t: bypass[t] for t in sorted(targets) if t in bypass}
    if hit:
        raise InstallError(f"{who}: the installed plan bypasses {len(hit)} of the {len(targets)} modules this LoRA "
                           f"targets ({_describe(hit)}); {WAY}")


def _peft_refusal(who: str, exc: ValueError) -> InstallError | None:
    """PEFT's multi-line 'Target module X(...) is not supported' as one line (None for any other ValueError)."""
    m = re.match(r"Target module (\w+)", str(exc))
    if m is None or "is not supported" not in str(exc):
        return None
    return InstallError(f"{who}: PEFT cannot wrap {m.group(1)}, a module of the installed plan; {WAY}")


def _fetched(src, kwargs: dict):
    """The state dict `load_lora_adapter` would read from `src` (a dict as it is; a file or folder read once, as
    diffusers reads it, its metadata handed on in kwargs)."""
    if isinstance(src, dict):
        return src
    from diffusers.loaders.lora_base import _fetch_state_dict

    f = {k: kwargs.pop(k, None) for k in FETCH}
    state_dict, kwargs["metadata"] = _fetch_state_dict(
        src, f["weight_name"], f["use_safetensors"], f["local_files_only"], f["cache_dir"], bool(f["force_download"]),
        f["proxies"], f["token"], f["revision"], f["subfolder"],
        {"file_type": "attn_procs_weights", "framework": "pytorch"}, False, metadata=kwargs.get("metadata"))
    return state_dict


def load_lora_adapter(self, pretrained_model_name_or_path_or_dict, prefix="transformer", hotswap: bool = False,
                      **kwargs):
    """diffusers' PeftAdapterMixin.load_lora_adapter after the plan's check (module doc)."""
    state_dict = _fetched(pretrained_model_name_or_path_or_dict, kwargs)
    _refuse("load_lora_adapter", state_dict_targets(state_dict, prefix), self)
    try:
        return type(self).load_lora_adapter(self, state_dict, prefix=prefix, hotswap=hotswap, **kwargs)
    except ValueError as exc:
        one = _peft_refusal("load_lora_adapter", exc)
        if one is None:
            raise
        raise one from None


def add_adapter(self, adapter_config, adapter_name: str = "default"):
    """diffusers' PeftAdapterMixin.add_adapter after the plan's check (module doc)."""
    _refuse("add_adapter", config_targets(self, adapter_config), self)
    try:
        return type(self).add_adapter(self, adapter_config, adapter_name)
    except ValueError as exc:
        one = _peft_refusal("add_adapter", exc)
        if one is None:
            raise
        raise one from None


def guard(model, state, bypass: dict[str, str]) -> None:
    """After install: the plan's bypassed modules kept in `state.lora_bypass`, diffusers' two injecting methods checked
    against them (instance attributes; uninstall drops them)."""
    state.lora_bypass = dict(bypass)
    for name, fn in (("load_lora_adapter", load_lora_adapter), ("add_adapter", add_adapter)):
        effect(model, "lora", state, functools.partial(model.__dict__.pop, name, None),
               apply=functools.partial(setattr, model, name, types.MethodType(fn, model)), part=name)

"""LoRAs (diffusers' MiniMaxH3LoraLoaderMixin, PEFT layers) and an installed plan: merged weights only.

A plan is installed from the weights the transformer holds: the AdaLN tables are that GEMM's outputs, gemm_quant's
codes are those weights quantised. So:
- a LoRA loaded and fused before install, its PEFT layers unloaded (`pipe.load_lora_weights(...)`,
  `pipe.fuse_lora()`, `pipe.unload_lora_weights()`), is a checkpoint like any other: planned and installed as such,
  the same bits as diffusers' eager forward of the fused model;
- PEFT layers present at install (a LoRA loaded unfused, or fused and not unloaded) are refused in one line: the
  tables would hold the base weights' outputs while the layers add their delta elsewhere;
- a LoRA loaded after install is refused in one line when diffusers loads it (`load_lora_adapter`, which
  `load_lora_weights` calls for either partition), before any layer is touched; PEFT layers injected around a
  tabled AdaLN linear some other way make its next call raise the same line instead of reading the table
  (install/adaln_table.py). Never wrong bits: uninstall, load and fuse, install again.
"""

from __future__ import annotations

import types

from h3plan.errors import InstallError

FIX = ("fuse it and drop the PEFT layers first (pipe.fuse_lora(); pipe.unload_lora_weights()), then h3plan.install(pipe, "
       "plan)")
AFTER = ("a LoRA loaded after h3plan.install would bypass the installed tables and kernels: h3plan.uninstall(pipe), "
         "load and fuse the LoRA (pipe.load_lora_weights(...); pipe.fuse_lora(); pipe.unload_lora_weights()), then install")


def peft_layers(model) -> list[str]:
    """Names of the PEFT tuner layers in `model` (a LoRA loaded through diffusers or peft, fused or not)."""
    return [n for n, m in model.named_modules()
            if type(m).__module__.startswith("peft.") and hasattr(m, "base_layer")]


def refuse_peft(model) -> None:
    """InstallError (one line) when `model` holds PEFT layers."""
    names = peft_layers(model)
    if names:
        merged = all(getattr(m, "merged", False) for n, m in model.named_modules() if n in set(names))
        raise InstallError(f"h3plan.install: a LoRA is loaded as PEFT layers ({len(names)}, e.g. {names[0]}; "
                           f"{'fused, layers kept' if merged else 'not fused'}): the plan installs merged weights only; {FIX}")


def _refuse(self, *args, **kwargs):
    raise InstallError(f"load_lora_adapter: {AFTER}")


def guard(model, state) -> None:
    """After install: diffusers' `load_lora_adapter` on this model refuses (instance attribute; uninstall drops it)."""
    model.load_lora_adapter = types.MethodType(_refuse, model)
    state.undo.append(lambda: model.__dict__.pop("load_lora_adapter", None))

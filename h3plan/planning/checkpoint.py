"""The widths of what the user has, as the `model` / `vae` config groups' `diffusers_config`.

`read(obj)` takes diffusers' MiniMaxH3Transformer3DModel or AutoencoderKLMiniMaxH3 (their `.config`), a
pipeline holding them as `.transformer` / `.vae` (MiniMaxH3ModularPipeline), or a local diffusers checkpoint
folder: a pipeline folder with `transformer/` and `vae/` subfolders, or one model's folder (its config.json
names its `_class_name`). `fill(cfg, components)` writes what was read into a composed config; the planner
calls `with_model_path(cfg)` so that `model.path=DIR` plans for the checkpoint's own widths.
Torch-free: objects are read by their class names and `.config`, folders as JSON. Bad input is one UsageError.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from h3plan.errors import ConfigError, UsageError
from h3plan.facts import workflows

from . import CONF, schema, text_encoder

CLASSES = {"MiniMaxH3Transformer3DModel": "model", "AutoencoderKLMiniMaxH3": "vae"}
SUBFOLDERS = {"model": "transformer", "vae": "vae"}  # diffusers' pipeline folder layout
# a pipeline's components; the transformer partitions share their widths (facts/workflows.py)
ATTRS = {"model": workflows.PARTITIONS, "vae": ("vae",)}
WHAT = ("a MiniMaxH3Transformer3DModel, an AutoencoderKLMiniMaxH3, a pipeline holding them as .transformer / .vae, "
        "or a local diffusers checkpoint folder")


@dataclass(frozen=True)
class Components:
    """configs: section ("model", "vae") -> the component's config as read; where: section -> where it was read;
    folder: the checkpoint folder (None for objects); device: the first CUDA device a component's weights sit on."""

    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    where: Mapping[str, str] = field(default_factory=dict)
    folder: str | None = None
    device: str | None = None


def plain(config: Mapping[str, Any]) -> dict:
    """A diffusers_config as a plain dict: an OmegaConf node resolved, any other mapping copied."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(config):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:
        pass
    return dict(config)


def schema_keys(section: str) -> tuple[str, ...]:
    node = {"model": schema.TransformerKwargs, "vae": schema.VaeKwargs}[section]
    return tuple(f.name for f in dataclasses.fields(node))


def diffusers_config(section: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The schema's keys of a component config (diffusers' config has more: `_class_name`, latents_mean ...)."""
    return {k: list(config[k]) if isinstance(config[k], (list, tuple)) else config[k]
            for k in schema_keys(section) if k in config}


# ---------------------------------------------------------------- reading


def _json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a diffusers config is a JSON object, got {type(data).__name__}")
    return data


def _section(config: Mapping[str, Any], path: str) -> str:
    name = config.get("_class_name")
    if name not in CLASSES:
        raise UsageError(f"{path}: _class_name {name!r} is not one h3plan plans for ({', '.join(CLASSES)})")
    return CLASSES[name]


def read_folder(folder, partition: str = "transformer") -> Components:
    """A local diffusers checkpoint folder: DIR/config.json (one model), else DIR/<partition>/ and DIR/vae/.
    partition: the transformer's subfolder, `transformer` (t2va, fl2va) or `transformer_ref` (ref2va; its widths
    may differ); a pipeline folder without it is refused when the other one is there."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: no such folder (plan_for and model.path read a local diffusers checkpoint folder)")
    top = os.path.join(folder, "config.json")
    if os.path.isfile(top):
        config = _json(top)
        section = _section(config, top)
        return Components({section: config}, {section: top}, folder)
    configs, where = {}, {}
    for section, sub in {**SUBFOLDERS, "model": partition}.items():
        path = os.path.join(folder, sub, "config.json")
        if os.path.isfile(path):
            configs[section] = _json(path)
            if _section(configs[section], path) != section:
                raise UsageError(f"{path}: a {configs[section]['_class_name']} in the {sub}/ folder")
            where[section] = path
    other = next((p for p in ATTRS["model"] if p != partition
                  and os.path.isfile(os.path.join(folder, p, "config.json"))), None)
    if "model" not in configs and other is not None:
        workflow = " and ".join(workflows.tasks_of(partition))
        raise UsageError(f"{folder}: no {partition}/config.json, the partition {workflow} run against (it holds "
                         f"{other}/); plan the workflow its partition serves, or point model.path at a folder with "
                         f"{partition}/")
    if not configs:
        raise UsageError(f"{folder}: no config.json, {partition}/config.json or vae/config.json: not a diffusers "
                         f"checkpoint folder of MiniMax-H3")
    return Components(configs, where, folder)


def _kind(obj) -> str | None:
    names = {c.__name__ for c in type(obj).__mro__}
    return next((s for c, s in CLASSES.items() if c in names), None)


def _device(module) -> str | None:
    try:
        for p in module.parameters():
            return str(p.device) if p.device.type == "cuda" else None
    except Exception:  # noqa: BLE001 - not a torch module: no device to read
        return None
    return None


def read_object(obj) -> Components:
    """A diffusers component (its `.config`) or a pipeline holding them as `.transformer` / `.vae`."""
    obj = getattr(obj, "_orig_mod", obj)  # a torch.compile wrapper: read the model inside
    found = {}
    if _kind(obj) is not None:
        found[_kind(obj)] = (obj, type(obj).__name__)
    else:
        for section, attrs in ATTRS.items():
            for attr in attrs:
                try:
                    comp = getattr(obj, attr, None)
                except Exception:  # noqa: BLE001 - an attribute that raises is no component
                    comp = None
                comp = getattr(comp, "_orig_mod", comp)
                if comp is not None and _kind(comp) == section:
                    found[section] = (comp, f"{type(obj).__name__}.{attr}")
                    break
    if not found:
        raise UsageError(f"h3plan.plan_for reads {WHAT}; got {type(obj).__module__}.{type(obj).__qualname__}")
    configs = {s: dict(comp.config) for s, (comp, _) in found.items()}
    device = next((d for d in (_device(comp) for comp, _ in found.values()) if d), None)
    return Components(configs, {s: f"{label}.config" for s, (_, label) in found.items()}, None, device)


def read(obj) -> Components:
    return read_folder(obj) if isinstance(obj, (str, os.PathLike)) else read_object(obj)


# ---------------------------------------------------------------- writing into a config


def _packaged(section: str) -> dict[str, tuple[dict[str, Any], str]]:
    """conf/<section>/<option>.yaml -> (its diffusers_config, its source), for the files that spell out every key."""
    import yaml

    out, keys = {}, schema_keys(section)
    folder = os.path.join(CONF, section)
    for f in sorted(os.listdir(folder)):
        if f.endswith(".yaml"):
            with open(os.path.join(folder, f)) as fh:
                data = yaml.safe_load(fh) or {}
            dc = data.get("diffusers_config") or {}
            if all(k in dc for k in keys):
                out[f[:-5]] = (diffusers_config(section, dc), data.get("source", ""))
    return out


def packaged_match(section: str, config: Mapping[str, Any]) -> str | None:
    """The packaged option (conf/model/h3_tiny.yaml -> "h3_tiny") whose diffusers_config is this config's, or None."""
    values = diffusers_config(section, config)
    return next((name for name, (dc, _) in _packaged(section).items() if dc == values), None)


def _label(components: Components, section: str) -> str:
    if components.folder is not None:
        return os.path.basename(os.path.normpath(components.folder)) or "checkpoint"
    return components.where[section].rsplit(".", 1)[0]


def fill(cfg, components: Components):
    """Write each read component's diffusers_config into `cfg` (a composed DictConfig or plain dict, changed in
    place and returned); the section's name becomes the packaged option with the same config, else where it was
    read, and its source says where the widths came from (a packaged option's own source when it matched)."""
    for section, config in components.configs.items():
        node = cfg[section]
        values = diffusers_config(section, config)
        for k, v in values.items():
            try:
                node["diffusers_config"][k] = v
            except Exception as e:  # noqa: BLE001 - OmegaConf's type check: one line naming the key
                raise ConfigError(f"{section}.diffusers_config.{k}={v!r}", f"read from {components.where[section]}: "
                                  f"{str(getattr(e, 'msg', e)).splitlines()[0]}") from None
        match = packaged_match(section, values)
        if match is not None:  # the packaged option's own config: its name and source say what it is
            node["name"], node["source"] = match, _packaged(section)[match][1]
            continue
        kept = [k for k in schema_keys(section) if k not in values]
        node["name"] = _label(components, section)
        node["source"] = (f"read from {components.where[section]}" + (f"; not in it, kept from the config group: "
                                                                       f"{', '.join(kept)}" if kept else ""))
    return cfg


def transformer_folder(path, partition: str = "transformer") -> tuple[str, str | None, dict[str, Any]]:
    """(folder, subfolder, config) of the transformer at `model.path=DIR`, for its from_pretrained."""
    comps = read_folder(path, partition)
    if "model" not in comps.configs:
        raise UsageError(f"model.path={os.fspath(path)}: {comps.where['vae']} is a VAE; point model.path at the "
                         "transformer's folder or the pipeline's")
    own = os.path.dirname(comps.where["model"]) == os.path.normpath(comps.folder)
    return comps.folder, None if own else partition, dict(comps.configs["model"])


def with_model_path(cfg):
    """`cfg` itself when model.path is unset; else a copy with the widths of the checkpoint at model.path (its
    transformer, transformer_ref/ for a ref2va request (facts/workflows.py PARTITION), and, in a pipeline folder,
    its VAE)."""
    model = cfg["model"]
    path = model.get("path") if hasattr(model, "get") else None
    if not path:
        return cfg
    import copy

    video = cfg.get("video") if hasattr(cfg, "get") else None
    partition = workflows.partition(video.get("task") if video is not None else None)
    comps = read_folder(path, partition)
    if "model" not in comps.configs:
        transformer_folder(path, partition)  # raises the one-line error
    out = fill(copy.deepcopy(cfg), comps)
    # the conditioner: planning/text_encoder.py
    if os.path.isfile(os.path.join(os.fspath(path), "text_encoder", "config.json")):
        te = text_encoder.read(path)
        out["model"]["text_encoder"] = {k: te[k] for k in ("text_config", "vision_config", "tie_word_embeddings")
                                        if k in te}
    return out

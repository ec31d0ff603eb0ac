"""Seeded MiniMax-H3 transformers and realistic packed inputs, shared by verify and bench.

`build_model(diffusers_config, blocks=, device=, dtype=, seed=)`: `MiniMaxH3Transformer3DModel.from_config`
with seeded random weights (diffusers' own initialisation, created directly on the device), cast like
the released mixed-precision checkpoint: everything in `dtype` except `_keep_in_fp32_modules`
(proj_in / proj_out / audio heads, time_embedder, rope), which stay fp32 as from_pretrained keeps them.
Where the float32 build would not fit the device's free memory (the real-width model is 123 GiB in float32:
over an 80 GB card), the same values are built in `dtype` directly (_narrow_build): the peak is the cast model
plus one float32 scratch the size of its largest tensor, allocated before the model and freed after it, so every
tensor of the model has its own allocation as from_pretrained's loading gives it (a tensor a plan moves off the device
frees whole allocator segments, not holes between other tensors).

`load_model(path, blocks=, device=, dtype=)`: the same from a local checkpoint folder (`model.path`), with
`from_pretrained`.

`packed_inputs(config, seq_len, ...)`: one packed sequence laid out as diffusers' own H3 test and
pipelines pack it (tests/models/transformers/test_models_transformer_minimax_h3.py): text rows, then
audio rows, then video rows; token_tags 0 video / 1 text / 2 audio; two distinct timesteps
([0.7, 0.3]) with the audio rows on the second; position_ids (S, 3) = (t, h, w): video rows walk a
(frames, h, w) patch grid, text and audio rows advance t with h = w = 0. Latents/conditioning are
standard normal from a CPU generator (identical on every device).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

import torch
from h3plan.errors import UsageError
from h3plan.planning.checkpoint import plain, transformer_folder

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


# the two distinct timesteps of packed_inputs (adaln_table plans: h3plan.prepare(model, timesteps=[TIMESTEP]))
TIMESTEP = (0.7, 0.3)

def resolve_dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if str(name) not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}")
    return DTYPES[str(name)]


def build_model(diffusers_config: Mapping[str, Any], *, blocks: int | None = None, device="cpu",
                dtype=torch.bfloat16, seed: int = 0, narrow: bool | None = None):
    """narrow: build in `dtype` directly (True), in float32 then cast (False), or the first only where the float32
    model would not fit the CUDA device's free memory (None). Both give the same values."""
    from diffusers import MiniMaxH3Transformer3DModel

    cfg = plain(diffusers_config)
    if "patch_size" in cfg:
        cfg["patch_size"] = tuple(cfg["patch_size"])
    if blocks is not None:
        cfg["num_layers"] = int(blocks)
    dt = resolve_dtype(dtype)
    if narrow is None:
        narrow = dt != torch.float32 and _float32_over_free(MiniMaxH3Transformer3DModel, cfg, device)
    torch.manual_seed(seed)
    if torch.device(device).type == "cuda":
        torch.cuda.manual_seed(seed)
    if narrow:
        return _narrow_build(MiniMaxH3Transformer3DModel, cfg, device, dt).eval().requires_grad_(False)
    with torch.device(device):
        model = MiniMaxH3Transformer3DModel.from_config(cfg)
    return _cast(model, dt).eval().requires_grad_(False)


def _float32_over_free(cls, cfg, device) -> bool:
    """Whether `cls.from_config(cfg)` in float32 would take more than the CUDA device's free memory (built on the
    meta device to count, which draws no random numbers)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return False
    with torch.device("meta"):
        n = sum(p.numel() for p in cls.from_config(cfg).parameters())
    return 4 * n > torch.cuda.mem_get_info(dev)[0]


# nn.init's in-place initialisers (the ops that fill a new parameter): a narrow build runs each in float32
_INIT_OPS = frozenset({"uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                       "xavier_normal_", "trunc_normal_", "constant_", "fill_", "zero_", "ones_", "zeros_"})


class _Float32Init(torch.overrides.TorchFunctionMode):
    """During a build in a narrow default dtype: each initialiser called on a narrow floating tensor runs on a
    float32 tensor of its shape and device instead (the same random draws, in the same order, as the float32
    build), and the result is rounded into the tensor (what `.to(dtype)` does). Every call is recorded with the
    generator state before it, so a tensor that must end up float32 can be initialised again exactly."""

    def __init__(self, scratch: torch.Tensor | None = None):
        super().__init__()
        # id(tensor) -> [(func, args, kwargs, generator state)]; the recorded args hold the tensor, so no other
        # tensor of the build can take its id
        self.calls: dict[int, list] = {}
        # one flat float32 buffer every initialisation runs in (a view of its first numel elements: contiguous at
        # the same offset 0 as a fresh tensor, so the same draws); a tensor larger than it gets its own (counted)
        self.scratch = scratch
        self.fresh = 0

    def wide(self, t: torch.Tensor) -> torch.Tensor:
        s = self.scratch
        if s is not None and s.device == t.device and t.numel() <= s.numel():
            return s[: t.numel()].view(t.shape)
        self.fresh += 1
        return torch.empty(t.shape, dtype=torch.float32, device=t.device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        t = args[0] if args else kwargs.get("tensor")  # nn.init passes its tensor by keyword to a mode
        if name not in _INIT_OPS or not isinstance(t, torch.Tensor) or not t.is_floating_point() \
                or t.dtype == torch.float32:
            return func(*args, **kwargs)
        self.calls.setdefault(id(t), []).append((func, args, kwargs, _rng_state(t.device)))
        wide = self.wide(t)
        _call_on(func, args, kwargs, wide)
        with torch.no_grad():
            t.copy_(wide)
        return t


def _call_on(func, args, kwargs, wide: torch.Tensor) -> None:
    """func as it was called, on `wide` in place of the tensor it was given (first argument or `tensor=`)."""
    if args:
        func(wide, *args[1:], **kwargs)
    else:
        func(**{**kwargs, "tensor": wide})


def _rng_state(device: torch.device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def _narrow_build(cls, cfg, device, dtype):
    """`cls.from_config(cfg)` with every tensor created in `dtype` and the values the float32 build cast by _cast
    would hold: the initialisers run in float32 (_Float32Init), and the `_keep_in_fp32_modules`' tensors are
    initialised again in float32 from their recorded generator states, so they hold the float32 values unrounded."""
    dev = torch.device(device)
    # the scratch first, then the model's tensors one after another: no float32 temporary freed between two of
    # them (a freed temporary is where the caching allocator would put the next tensor, sharing its segment)
    mode = _Float32Init(torch.empty(_largest_numel(cls, cfg), dtype=torch.float32, device=dev))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev), mode:
            model = cls.from_config(cfg)
    finally:
        torch.set_default_dtype(previous)
    keep = tuple(model._keep_in_fp32_modules or ())
    end = _rng_state(dev)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or p.dtype == torch.float32 or not any(k in name for k in keep):
                continue
            calls = mode.calls.get(id(p))
            if not calls:
                raise RuntimeError(f"narrow build: {name} was not initialised by an nn.init call; build in float32")
            wide = mode.wide(p)
            for func, args, kw, state in calls:
                _set_rng_state(dev, state)
                _call_on(func, args, kw, wide)
            p.data = wide.clone()
        _set_rng_state(dev, end)
    mode.scratch = None
    return model


def _largest_numel(cls, cfg) -> int:
    """The most elements of one parameter or buffer of `cls.from_config(cfg)` (counted on the meta device)."""
    with torch.device("meta"):
        m = cls.from_config(cfg)
    return max((t.numel() for t in (*m.parameters(), *m.buffers())), default=0)


def _load_without_accelerate(cls, folder: str, config: Mapping[str, Any]):
    """What from_pretrained does without accelerate's empty-weight init: from_config (float32, 4 bytes a parameter
    on the host), then the folder's safetensors (one file or an index of shards), every key required. The stored
    values arrive exactly (a bf16 -> fp32 -> bf16 round trip is exact)."""
    import json

    from safetensors.torch import load_file

    index = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["diffusion_pytorch_model.safetensors"]
    missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise OSError(f"no {missing[0]} in {folder} (h3plan reads safetensors checkpoints)")
    model = cls.from_config(config)
    state = {}
    for f in files:
        state.update(load_file(os.path.join(folder, f)))
    model.load_state_dict(state, strict=True)
    return model


def _cast(model, dtype):
    """Every floating parameter and buffer to `dtype` except `_keep_in_fp32_modules`' (from_pretrained's rule)."""
    keep = tuple(model._keep_in_fp32_modules or ())
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point() and not any(k in name for k in keep):
                p.data = p.data.to(dtype)
    return model


def has_accelerate() -> bool:
    """Whether diffusers' own from_pretrained can load MiniMaxH3Transformer3DModel here (it needs accelerate)."""
    return importlib.util.find_spec("accelerate") is not None


def load_model(path, *, blocks: int | None = None, device="cpu", dtype=torch.bfloat16):
    """`model.path=DIR`: MiniMaxH3Transformer3DModel.from_pretrained of a local checkpoint folder (a pipeline's,
    with transformer/, or the transformer's own) in `dtype`, which from_pretrained applies as build_model does
    (`_keep_in_fp32_modules` stay fp32); blocks: keep the first `blocks` transformer blocks (as build_model
    builds that many). diffusers 0.42.1 loads this class only with accelerate installed; without it the
    safetensors are read into `from_config`'s model (_load_without_accelerate), with the same result. An
    unreadable folder is one UsageError."""
    from diffusers import MiniMaxH3Transformer3DModel

    folder, sub, config = transformer_folder(path)
    dtype = resolve_dtype(dtype)
    try:
        if has_accelerate():
            model = MiniMaxH3Transformer3DModel.from_pretrained(folder, subfolder=sub, torch_dtype=dtype)
        else:  # diffusers loads a model with _keep_in_fp32_modules only through accelerate
            model = _cast(_load_without_accelerate(MiniMaxH3Transformer3DModel,
                                                   os.path.join(folder, sub or ""), config), dtype)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise UsageError(f"model.path={path}: cannot load a MiniMaxH3Transformer3DModel "
                         f"({str(e).strip().splitlines()[0][:200]})") from None
    if blocks is not None:
        del model.transformer_blocks[int(blocks):]
    return model.to(device).eval().requires_grad_(False)


def layout(seq_len: int, *, n_text: int | None = None, n_audio: int | None = None) -> tuple[int, int, int]:
    """(text, audio, video) row counts of a packed sequence of seq_len rows."""
    if n_text is None:
        n_text = max(4, min(512, seq_len // 12))
    if n_audio is None:
        n_audio = max(6, seq_len // 8 if seq_len < 4096 else seq_len // 40)
    n_video = seq_len - n_text - n_audio
    if n_video < 1:
        raise ValueError(f"seq_len={seq_len} leaves no video rows after {n_text} text and {n_audio} audio rows")
    return n_text, n_audio, n_video


def packed_layout(seq_len: int, *, device="cpu", grid_hw: tuple[int, int] | None = None, **counts) -> dict:
    """The structural forward arguments of one packed sequence (see the module docstring)."""
    n_text, n_audio, n_video = layout(seq_len, **counts)
    if grid_hw is None:  # 544x960 px -> 34x60 latents -> 17x30 patches per frame at real size
        grid_hw = (17, 30) if seq_len >= 4096 else (2, 4)
    gh, gw = grid_hw
    text = torch.arange(n_text)
    audio = torch.arange(n_text, n_text + n_audio)
    video = torch.arange(n_text + n_audio, seq_len)
    tags = torch.empty(seq_len, dtype=torch.long)
    tags[text], tags[audio], tags[video] = 1, 2, 0
    tidx = torch.zeros(seq_len, dtype=torch.long)
    tidx[audio] = 1
    pos = torch.zeros(seq_len, 3, dtype=torch.float32)
    pos[text, 0] = torch.arange(n_text, dtype=torch.float32)
    pos[audio, 0] = torch.arange(n_audio, dtype=torch.float32)
    i = torch.arange(n_video)
    pos[video, 0] = (i // (gh * gw)).float()
    pos[video, 1] = ((i // gw) % gh).float()
    pos[video, 2] = (i % gw).float()
    out = {"timestep": torch.tensor(TIMESTEP), "timestep_indices": tidx, "token_tags": tags, "position_ids": pos,
           "video_indices": video, "audio_indices": audio, "text_indices": text}
    return {k: v.to(device) for k, v in out.items()}


def packed_inputs(config: Mapping[str, Any], seq_len: int, *, batch: int = 1, seed: int = 0, device="cpu",
                  **layout_kwargs) -> dict:
    """Keyword arguments of MiniMaxH3Transformer3DModel.forward for one packed sequence."""
    cfg = plain(config)
    structure = packed_layout(seq_len, device=device, **layout_kwargs)
    n_text, n_audio, n_video = (len(structure[k]) for k in ("text_indices", "audio_indices", "video_indices"))
    p = cfg.get("patch_size", (1, 2, 2))
    video_dim = cfg.get("in_channels", 24) * p[0] * p[1] * p[2]
    g = torch.Generator("cpu").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device)  # noqa: E731
    return {
        "hidden_states": rand(batch, n_video, video_dim),
        "audio_hidden_states": rand(batch, n_audio, cfg.get("audio_in_channels", 32)),
        "encoder_hidden_states": rand(batch, n_text, cfg.get("text_dim", 5120)),
        **structure,
    }


LORA_DELTA = 0.05  # the seeded LoRA's output delta per unit input row: a visible change, not a blow-up


def lora_modules(model, shape) -> dict[str, int]:
    """{module fqn: rank} of a LoRA of `shape` (h3plan.facts.lora.LoraShape) on `model`'s blocks."""
    out = {}
    for blocks in shape.blocks:
        for i in range(len(model.get_submodule(blocks))):
            out.update({f"{blocks}.{i}.{t}": shape.rank for t in shape.targets})
    for path, rank in shape.extra:
        paths = [path.format(i=i) for i in range(len(model.transformer_blocks))] if "{i}" in path else [path]
        out.update(dict.fromkeys(paths, rank))
    return out


def seeded_lora(model, shape, *, seed: int = 0, rank: int | None = None, layout: str = "peft") -> dict:
    """A seeded LoRA state dict of `shape` for `model`'s widths, in the linears' dtype, on the host; `rank` overrides
    the shape's. layout "peft": the published files' keys (`<module>.lora_A.default.weight`, no component prefix:
    what `add_adapter` + `load_state_dict` and `pipe.load_lora_weights` read); "diffusers":
    `transformer.<module>.lora_A.weight`.
    lora_A rows have unit norm over the input, lora_B gives each output a LORA_DELTA standard deviation."""
    if layout not in ("peft", "diffusers"):
        raise ValueError(f"layout={layout!r}: peft or diffusers")
    g = torch.Generator("cpu").manual_seed(seed)
    infix, prefix = (".default", "") if layout == "peft" else ("", "transformer.")
    out = {}
    for fqn, r in lora_modules(model, shape).items():
        lin = model.get_submodule(fqn)
        r = rank or r
        dtype = lin.weight.dtype
        a = torch.randn(r, lin.in_features, generator=g) / lin.in_features ** 0.5
        b = torch.randn(lin.out_features, r, generator=g) * (LORA_DELTA / r ** 0.5)
        out[f"{prefix}{fqn}.lora_A{infix}.weight"] = a.to(dtype)
        out[f"{prefix}{fqn}.lora_B{infix}.weight"] = b.to(dtype)
    return out

"""The pipeline's Qwen3-VL conditioner, tokenizer and processor built locally, seeded (no download, no tokenizer files).

Scope: what diffusers 0.42.1's `MiniMaxH3TextEncoderStep` and its fl2va / ref2va siblings take as the `text_encoder`,
`tokenizer` and `processor` components, so that `pipe(prompt="...")` runs diffusers' own text step unmodified:
- `build_text_encoder(config)`: transformers' `Qwen3VLForConditionalGeneration` from a conditioner config (the
  `text_config` / `vision_config` / token ids of model.text_encoder_default, conf/model/*.yaml), built on the meta
  device, materialised on the target device in bf16 and initialised by transformers' own `init_weights` under
  `torch.manual_seed(seed)` (normal(0, initializer_range) linears and embeddings, unit norms, the rotary tables):
  the real width in seconds, not a copy of anyone's weights.
- `build_tokenizer(config)`: a byte-level BPE without merges (every UTF-8 byte one token, ids 0-255) from the
  `tokenizers` library, with Qwen's vision special tokens at the config's own ids (`<|vision_start|>`,
  `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`), wrapped as transformers' fast Qwen2 tokenizer. diffusers'
  steps tokenize the prompt verbatim (`add_special_tokens=False`, no chat template) and look the vision tokens up
  by name, so nothing else is needed; a prompt of n UTF-8 bytes is n text rows.
- `build_processor(tokenizer, config)`: `Qwen3VLProcessor` with Qwen2-VL's image processor and Qwen3-VL's video
  processor at the vision config's patch, merge and temporal patch sizes (what fl2va keyframes and ref2va
  references go through; without torchvision no video processor, so no video references).
Needs transformers (diffusers' MiniMaxH3ModularPipeline imports it anyway).
"""

from __future__ import annotations

from typing import Any, Mapping

from h3plan.errors import UsageError

SPECIAL = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
           "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}
QWEN_IDS = {"vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
            "video_token_id": 151656}  # transformers' Qwen3VLConfig defaults, the released checkpoint's ids
BYTES = 256


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    from h3plan.planning.checkpoint import plain

    return plain(config) if not isinstance(config, dict) else dict(config)


def qwen3vl_config(config: Mapping[str, Any]):
    """transformers' Qwen3VLConfig of a conditioner config (text_config, vision_config, tie_word_embeddings, ids)."""
    from transformers import Qwen3VLConfig

    c = _plain(config)
    if "text_config" not in c or "vision_config" not in c:
        raise UsageError("text encoder config: needs text_config and vision_config (a Qwen3-VL config.json)")
    ids: dict[str, Any] = {k: int(c.get(k, v)) for k, v in QWEN_IDS.items()}
    return Qwen3VLConfig(text_config=_plain(c["text_config"]), vision_config=_plain(c["vision_config"]),
                         tie_word_embeddings=bool(c.get("tie_word_embeddings", False)), **ids)


def build_text_encoder(config: Mapping[str, Any], *, device="cpu", seed: int = 4, weight_sets: int | None = None):
    """Qwen3VLForConditionalGeneration at `config`'s widths on `device`, bf16, seeded (module docstring); weight_sets:
    share_decoder_weights(model, weight_sets) after the init."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    cfg = qwen3vl_config(config)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: a 33B float32 model would not fit the device
    try:
        with torch.device("meta"):
            model = Qwen3VLForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(default)
    model = model.to_empty(device=torch.device(device))
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights()  # transformers' own init: weights, norms and the rotary tables (non-persistent buffers)
    if weight_sets is not None:
        share_decoder_weights(model, weight_sets)
    return model.eval().requires_grad_(False)


def share_decoder_weights(model, sets: int) -> None:
    """Decoder layer i computes with layer (i mod sets)'s parameters and buffers (the same tensors): every layer, width
    and hidden state the conditioner has, in `sets` layers' worth of memory. For a host smaller than the whole seeded
    pipeline resting on it (benchmarks/memory.py --text-encoder-weight-sets): streamed at memory.text_encoder=host
    the device still holds one layer at a time at the real width (install/text_encoder.py gives a shared tensor one
    host master), and diffusers' hidden_states[50] still exists. Seeded weights say nothing about quality either way."""
    layers = model.model.language_model.layers
    if not 1 <= sets <= len(layers):
        raise UsageError(f"text encoder weight sets {sets}: between 1 and its {len(layers)} decoder layers")
    for i in range(sets, len(layers)):
        for dst, src in zip(layers[i].modules(), layers[i % sets].modules()):
            for table, other in ((dst._parameters, src._parameters), (dst._buffers, src._buffers)):
                for name in table:
                    table[name] = other[name]


def build_tokenizer(config: Mapping[str, Any]):
    """A byte-level BPE (no merges) with Qwen's vision tokens at the config's ids, as transformers' Qwen2 fast
    tokenizer (module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer  # transformers 5: the fast tokenizer (Qwen2TokenizerFast is this class)

    c = _plain(config)
    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}  # ids 0-255, a fixed order
    if len(vocab) != BYTES:
        raise RuntimeError(f"tokenizers' byte-level alphabet has {len(vocab)} symbols, expected {BYTES}")
    specials = {SPECIAL[k]: int(c.get(k, v)) for k, v in QWEN_IDS.items()}
    vocab_size = int(_plain(c["text_config"])["vocab_size"])
    bad = {t: i for t, i in specials.items() if not BYTES <= i < vocab_size}
    if bad:
        raise UsageError(f"text encoder config: special token ids {bad} outside [{BYTES}, vocab_size {vocab_size})")
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    none: dict[str, Any] = dict(unk_token=None, bos_token=None, eos_token=None, pad_token=None)  # no token added
    return Qwen2Tokenizer(tokenizer_object=tok, **none)


def build_processor(tokenizer, config: Mapping[str, Any]):
    """Qwen3VLProcessor over `tokenizer` with image / video processors at the vision config's geometry."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    v = _plain(_plain(config)["vision_config"])
    geo: dict[str, Any] = dict(patch_size=int(v["patch_size"]), merge_size=int(v["spatial_merge_size"]),
                               temporal_patch_size=int(v["temporal_patch_size"]))
    image = Qwen2VLImageProcessor(**geo)
    try:
        return Qwen3VLProcessor(image_processor=image, tokenizer=tokenizer,
                                video_processor=Qwen3VLVideoProcessor(**geo))
    except ImportError:  # the video processor needs torchvision; only video references (ref2va) go through it

        class Qwen3VLProcessorNoVideo(Qwen3VLProcessor):
            """Qwen3VLProcessor without a video processor (transformers checks every attribute's class)."""

            def check_argument_for_proper_class(self, argument_name, argument):
                if argument_name == "video_processor" and argument is None:
                    return None
                return super().check_argument_for_proper_class(argument_name, argument)

        return Qwen3VLProcessorNoVideo(image_processor=image, tokenizer=tokenizer, video_processor=None)


def conditioner_components(config: Mapping[str, Any], *, device="cpu", seed: int = 4,
                           weight_sets: int | None = None) -> dict:
    """The three components diffusers' text encoder steps expect: text_encoder, tokenizer, processor."""
    tokenizer = build_tokenizer(config)
    return {"text_encoder": build_text_encoder(config, device=device, seed=seed, weight_sets=weight_sets),
            "tokenizer": tokenizer,
            "processor": build_processor(tokenizer, config)}


__all__ = ["build_text_encoder", "build_tokenizer", "build_processor", "conditioner_components", "qwen3vl_config",
           "share_decoder_weights"]

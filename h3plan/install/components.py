"""The components of diffusers' MiniMaxH3ModularPipeline that h3plan knows, and how a pipeline is told apart from
a model (what the front door, install/__init__.py, and the adaln tables' prepare dispatch on; pipeline.py installs)."""

from h3plan.facts.workflows import PARTITIONS

TRANSFORMERS = PARTITIONS  # the transformer partitions of a pipeline
STATE = "_h3plan_state"  # the attribute an installed model keeps its plan and its hooks in (installer.py)
COMPONENTS = TRANSFORMERS + ("vae", "audio_vae")
NO_LEVER = {"audio_vae": "no lever applies: AutoencoderKLMiniMaxH3Audio is a DAC encoder + BigVGAN convolutional "
                         "decoder; h3plan's levers target the transformer blocks and the video VAE's ViT decoder"}


def is_pipeline(obj) -> bool:
    """A diffusers ModularPipeline of any model (cheap: no diffusers import for other objects)."""
    return any(c.__name__ == "ModularPipeline" and c.__module__.startswith("diffusers.") for c in type(obj).__mro__)

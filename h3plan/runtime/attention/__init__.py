"""The attention backends' runtime: base.py the interface, sdpa.py / fa4.py / cudnn.py the
implementations, fp8.py the FP8 scales, ops.py the custom ops (the registry: h3plan.facts.attention)."""

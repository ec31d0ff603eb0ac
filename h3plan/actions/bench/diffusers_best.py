"""diffusers' best one-GPU setting as its users write it: `compile_repeated_blocks(fullgraph=True)`.

Scope: the regional compile (diffusers' ModelMixin: `torch.compile` of every module named in the model's
`_repeated_blocks`, here MiniMaxH3TransformerBlock) with diffusers' default attention. Shared by the block
bench (a deep copy of its eager model, measure.py) and the pipeline bench's `Best` setting (the one
transformer the settings share, pipeline_settings.py); the context-parallel part of Best at U > 1 stays there.
Nothing falls back: a compile error is the caller's to record. Numerics: Inductor fuses and reorders, so the
output is not eager's bits (2.7e-3 relative on the H200: benchmarks/anchors/h200-torch-compile-block.json);
backend="eager" (dynamo only, the CPU tests) runs diffusers' ops unchanged.
"""

from __future__ import annotations


def compile_call(target: str, backend: str = "inductor", dynamic: bool | None = None) -> str:
    """The call as written: `transformer.compile_repeated_blocks(fullgraph=True)`, plus any non-default argument."""
    args = ["fullgraph=True"] + ([] if backend == "inductor" else [f"backend={backend!r}"])
    args += [] if dynamic is None else [f"dynamic={dynamic}"]
    return f"{target}.compile_repeated_blocks({', '.join(args)})"


def regional_compile(model, backend: str = "inductor", dynamic: bool | None = None) -> list:
    """Compile `model`'s repeated blocks in place (the compile itself happens at each block's first call);
    returns those blocks: `block._compiled_call_impl` is what runs, None runs the plain block again."""
    kw = {} if backend == "inductor" else {"backend": backend}
    if dynamic is not None:
        kw["dynamic"] = dynamic
    model.compile_repeated_blocks(fullgraph=True, **kw)
    return [m for m in model.modules() if type(m).__name__ in model._repeated_blocks]

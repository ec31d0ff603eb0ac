"""diffusers' best one-GPU setting (h3plan/actions/bench/diffusers_best.py), shared by the block and pipeline
benches."""

from __future__ import annotations

import pytest

from h3plan.actions.bench.diffusers_best import compile_call, regional_compile


@pytest.mark.parametrize("args, text", [
    (("transformer",), "transformer.compile_repeated_blocks(fullgraph=True)"),
    (("transformer", "eager"), "transformer.compile_repeated_blocks(fullgraph=True, backend='eager')"),
    (("model", "inductor", False), "model.compile_repeated_blocks(fullgraph=True, dynamic=False)"),
])
def test_compile_call_reads_as_a_diffusers_user_writes_it(args, text):
    assert compile_call(*args) == text


def test_regional_compile_wraps_exactly_the_repeated_blocks():
    """No compile happens here (dynamo compiles at a block's first call): the blocks get a compiled callable,
    nothing else in the model does."""
    from omegaconf import OmegaConf

    from h3plan.actions.inputs import build_model

    dc = OmegaConf.to_container(OmegaConf.load("conf/model/h3_tiny.yaml").diffusers_config)
    model = build_model(dc, blocks=2, seed=0)
    blocks = regional_compile(model, backend="eager", dynamic=False)
    kinds = sorted({type(b).__name__ for b in blocks})
    assert kinds == ["MiniMaxH3TokenRefinerBlock", "MiniMaxH3TransformerBlock"]  # the model's _repeated_blocks
    assert [b for b in blocks if b in list(model.transformer_blocks)] == list(model.transformer_blocks)
    compiled = [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert compiled == blocks

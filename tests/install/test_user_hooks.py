"""diffusers' own hooks a user applies to the transformer, before or after a plan: group offloading and
FirstBlockCache, each case either composing (the forward as with the user's hook alone, uninstall leaving the hook
working) or refused in one line naming the hook.

group offloading runs with onload_device = offload_device = cpu (diffusers takes that without streams): its hooks
move nothing here, so a composed forward must equal the user's alone bit for bit (the plans are lossless: a table,
sdpa, the exact gated residual). What moving tensors adds on a GPU is not covered here.
"""

import pytest
from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache, apply_group_offloading
from install_helpers import bitwise, forward, plan, tiny_inputs, tiny_model
from test_named_hooks import BLOCKS, NO_BLOCKS, REG, _plan

from h3plan.errors import InstallError
from h3plan.install import install, uninstall
from h3plan.install.hooks import PREFIX, installed

OFFLOAD = "group_offloading"  # the name diffusers registers its offloading hooks under


def _offload(model, kind: str):
    apply_group_offloading(model, onload_device="cpu", offload_device="cpu", offload_type=kind, num_blocks_per_group=1)
    return model


def _theirs(model) -> dict[str, list[str]]:
    """fqn -> the hooks not a plan's, on every module that has one."""
    out = {}
    for fqn, m in model.named_modules():
        reg = m.__dict__.get("_diffusers_hook")
        names = [] if reg is None else [n for n in reg._hook_order if not n.startswith(PREFIX)]
        if names:
            out[fqn] = names
    return out


@pytest.fixture(scope="module")
def inputs():
    return tiny_inputs()


@pytest.fixture(scope="module")
def eager(inputs):
    return forward(tiny_model(), inputs)


@pytest.mark.parametrize("kind", ["block_level", "leaf_level"])
def test_group_offloading_alone_is_diffusers_forward_here(inputs, eager, kind):
    bitwise(forward(_offload(tiny_model(), kind), inputs), eager)


def test_group_offloading_before_a_plan_that_replaces_the_blocks_is_refused_naming_both_hooks(inputs, eager):
    """The plan's block forward would run outside the offloading hook, whose onload would then never run."""
    model = _offload(tiny_model(), "block_level")
    theirs = _theirs(model)
    with pytest.raises(InstallError) as e:
        install(model, _plan(**BLOCKS), registry=REG)
    msg = str(e.value)
    assert "\n" not in msg and f"'{OFFLOAD}'" in msg and f"'{PREFIX}gated_residual'" in msg, msg
    assert installed(model) == [] and _theirs(model) == theirs
    bitwise(forward(model, inputs), eager)


def test_block_level_group_offloading_before_a_plan_that_leaves_the_blocks_alone_composes(inputs, eager):
    model = _offload(tiny_model(), "block_level")
    theirs = _theirs(model)
    install(model, _plan(**NO_BLOCKS), registry=REG)
    assert installed(model) and _theirs(model) == theirs
    bitwise(forward(model, inputs), eager)
    assert uninstall(model) and installed(model) == [] and _theirs(model) == theirs
    bitwise(forward(model, inputs), eager)


@pytest.mark.parametrize("settings, lever, hooked", [
    (dict(attention="sdpa", gemm_quant="fp8"), "gemm_quant", r"transformer_blocks\.0\.attn\.to_q"),
    (None, "adaln_table", r"transformer_blocks\.0\.adaln_proj\.linear"),
])
def test_leaf_level_group_offloading_before_install_is_refused_naming_it(inputs, eager, settings, lever, hooked):
    """Leaf-level offloading hooks every linear: a block linear swapped for a quantised one would leave its hook behind
    (the quantised linear unhooked), an AdaLN linear's table hook would bypass it."""
    model = _offload(tiny_model(), "leaf_level")
    theirs = _theirs(model)
    p = plan(**settings) if settings else _plan(**NO_BLOCKS)
    with pytest.raises(InstallError, match=rf"^{lever}: {hooked} carries the diffusers hook '{OFFLOAD}'") as e:
        install(model, p, registry=REG)
    assert "\n" not in str(e.value)
    assert installed(model) == [] and _theirs(model) == theirs
    bitwise(forward(model, inputs), eager)


@pytest.mark.parametrize("kind", ["block_level", "leaf_level"])
def test_group_offloading_after_install_wraps_the_plan_and_outlives_uninstall(inputs, eager, kind):
    model = tiny_model()
    install(model, _plan(**BLOCKS), registry=REG)
    hooks = installed(model)
    _offload(model, kind)
    theirs = _theirs(model)
    assert theirs and installed(model) == hooks
    bitwise(forward(model, inputs), eager)
    assert uninstall(model) and installed(model) == [] and _theirs(model) == theirs
    bitwise(forward(model, inputs), eager)


def _first_block_cache(model):
    apply_first_block_cache(model, FirstBlockCacheConfig(threshold=0.05))


def test_first_block_cache_before_install_is_refused_by_diffusers_itself(inputs, eager):
    """diffusers' FirstBlockCache takes only blocks in its TransformerBlockRegistry; MiniMaxH3TransformerBlock is not
    there, so apply_first_block_cache raises its own ValueError as it registers the first hook (before any plan is
    involved) and registers none: what the user sees is diffusers' error, and the plan then installs as usual."""
    model = tiny_model()
    with pytest.raises(ValueError, match="MiniMaxH3TransformerBlock'> not registered"):
        _first_block_cache(model)
    assert _theirs(model) == {}
    install(model, _plan(**BLOCKS), registry=REG)
    bitwise(forward(model, inputs), eager)
    assert uninstall(model)


def test_first_block_cache_after_install_is_refused_by_diffusers_itself_and_the_plan_runs_on(inputs, eager):
    model = tiny_model()
    install(model, _plan(**BLOCKS), registry=REG)
    hooks = installed(model)
    with pytest.raises(ValueError, match="MiniMaxH3TransformerBlock'> not registered"):
        _first_block_cache(model)
    assert installed(model) == hooks and _theirs(model) == {}
    bitwise(forward(model, inputs), eager)
    assert uninstall(model) and installed(model) == []

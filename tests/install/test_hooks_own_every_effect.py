"""Every effect an install has on a module is a diffusers hook on that module named `h3plan.<lever>[.<part>]`
(install/hooks.py), and uninstall is removing them: `installed(model)` lists one for every swap, parked weight and
attribute the plan sets; after uninstall no `h3plan.` hook and no registry the install made remains, every module's
`__dict__` is as before and `state_dict()` is bit for bit the loaded one. A failing install takes its hooks back.
The install code keeps no undo list of callbacks (a structural rule, checked on the source).
"""

import re
from pathlib import Path

import pytest
import torch
from install_helpers import LEVERS, bitwise, forward, plan, tiny_inputs, tiny_model

from h3plan.install import install, parking, uninstall
from h3plan.install.hooks import PREFIX, EffectHook, installed, lever_of
from h3plan.install.parking import HostMemoryError
from h3plan.runtime.quant import BLOCK_LINEARS

ROOT = Path(__file__).resolve().parents[2]
FP8 = dict(attention="sdpa", gemm_quant="fp8")


def _dicts(model):
    return {name: dict(m.__dict__) for name, m in model.named_modules()}


def _same_dicts(a, b):
    """The same attribute names, each the same object (the modules' own state untouched)."""
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), (name, a[name].keys() ^ b[name].keys())
        assert all(a[name][k] is b[name][k] for k in a[name] if k not in ("_modules",)), name


def _bitwise_state(model, before):
    sd = model.state_dict()
    assert sd.keys() == before.keys()
    assert all(v.dtype == before[k].dtype and torch.equal(v, before[k]) for k, v in sd.items())


@pytest.fixture(scope="module")
def inputs():
    return tiny_inputs()


def test_an_fp8_install_lists_every_linear_swap_and_parked_block_as_a_hook():
    model = tiny_model()
    install(model, plan(**FP8), registry=LEVERS)
    hooks = set(installed(model))
    for i in range(len(model.transformer_blocks)):
        for path in BLOCK_LINEARS:
            parent, _, child = path.rpartition(".")
            assert (f"transformer_blocks.{i}.{parent}", f"{PREFIX}gemm_quant.{child}") in hooks, (i, path)
        assert (f"transformer_blocks.{i}", f"{PREFIX}gemm_quant.parked") in hooks
        assert (f"transformer_blocks.{i}.attn", f"{PREFIX}attention.processor") in hooks
    assert {lever_of(n) for _, n in hooks} <= {"gemm_quant", "attention", "lora"}
    uninstall(model)


def test_uninstall_leaves_no_hook_no_registry_and_the_weights_bit_for_bit(inputs):
    model = tiny_model()
    before, sd, want = _dicts(model), {k: v.clone() for k, v in model.state_dict().items()}, forward(model, inputs)
    install(model, plan(**FP8), registry=LEVERS)
    assert installed(model)
    forward(model, inputs)
    assert uninstall(model)
    assert installed(model) == []
    assert not any("_diffusers_hook" in m.__dict__ for m in model.modules())
    _same_dicts(_dicts(model), before)
    _bitwise_state(model, sd)
    bitwise(forward(model, inputs), want)


def test_an_install_that_fails_part_way_takes_its_hooks_back(monkeypatch):
    """The host runs short on the 4th parked copy (test_host_memory's case): the hooks registered up to there are
    removed, the last first, and the model is as loaded."""
    monkeypatch.setattr(parking, "STAY", ("meta",))
    model = tiny_model()
    before, sd = _dicts(model), {k: v.clone() for k, v in model.state_dict().items()}
    copies = []

    def available():
        copies.append(1)
        return parking.HOST_RESERVE + (1 << 40 if len(copies) <= 3 else 0)

    monkeypatch.setattr(parking, "host_available", available)
    with pytest.raises(HostMemoryError):
        install(model, plan(**FP8), registry=LEVERS)
    assert installed(model) == [] and not any("_diffusers_hook" in m.__dict__ for m in model.modules())
    _same_dicts(_dicts(model), before)
    _bitwise_state(model, sd)


def test_an_effect_hook_leaves_the_forward_alone_and_its_removal_restores_exactly():
    """An effect hook is registered through diffusers' registry but wraps no forward: the module's forward is the
    object it was, a user's hook registered on top still runs, and removal restores the effect only."""
    from types import SimpleNamespace

    from diffusers.hooks import HookRegistry, ModelHook

    from h3plan.install.hooks import effect, registered, remove_all

    lin = torch.nn.Linear(2, 2)
    state = SimpleNamespace(hooks=[])
    effect(lin, "x", state, lambda: lin.__dict__.pop("tag"), apply=lambda: setattr(lin, "tag", 1))
    assert lin.tag == 1 and "forward" not in lin.__dict__ and registered(lin) == [f"{PREFIX}x"]
    assert isinstance(lin._diffusers_hook.get_hook(f"{PREFIX}x"), EffectHook)

    class Double(ModelHook):
        def new_forward(self, module, *args, **kwargs):
            return self.fn_ref.original_forward(*args, **kwargs) * 2

    HookRegistry.check_if_exists_or_initialize(lin).register_hook(Double(), "user.double")
    x = torch.ones(1, 2)
    want = torch.nn.functional.linear(x, lin.weight, lin.bias) * 2
    assert torch.equal(lin(x), want)
    remove_all(state)
    assert "tag" not in lin.__dict__ and registered(lin) == ["user.double"] and torch.equal(lin(x), want)


def test_no_undo_list_remains_in_the_install_code():
    """Uninstall is removing the hooks: no install module keeps callbacks to run back (`undo.append`, `.undo`)."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "h3plan/install").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bundo\.append\b|\.undo\b|\bundo: list\b", line)]
    assert not found, found


@pytest.fixture
def fbc_block():
    """diffusers' FirstBlockCache takes only the blocks in its TransformerBlockRegistry, which lacks
    MiniMaxH3TransformerBlock (test_user_hooks.py: refused by diffusers itself): registered here for the test only
    (the block returns its hidden states alone)."""
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry

    block = type(tiny_model().transformer_blocks[0])
    TransformerBlockRegistry._register()
    TransformerBlockRegistry.register(block, TransformerBlockMetadata(return_hidden_states_index=0))
    yield
    del TransformerBlockRegistry._registry[block]


def _fbc(model):
    from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache

    apply_first_block_cache(model, FirstBlockCacheConfig(threshold=0.05))
    return model


def _cached(model, inputs, name="cond"):
    with model.cache_context(name):  # a context name of its own: a first call, every block computed
        return forward(model, inputs)


BLOCKS = dict(attention="sdpa", gated_residual="on")  # lossless; the blocks' forwards replaced (gated_residual)
NO_BLOCKS = dict(attention="sdpa")  # lossless; the blocks keep diffusers' forward


@pytest.mark.parametrize("settings", [BLOCKS, NO_BLOCKS], ids=["blocks", "no_blocks"])
def test_first_block_cache_after_install_composes_and_outlives_uninstall(fbc_block, inputs, settings):
    want = _cached(_fbc(tiny_model()), inputs)
    model = tiny_model()
    install(model, plan(**settings), registry=LEVERS)
    _fbc(model)
    bitwise(_cached(model, inputs), want)
    assert uninstall(model) and installed(model) == []
    assert "fbc_leader_block_hook" in model.transformer_blocks[0]._diffusers_hook._hook_order
    bitwise(_cached(model, inputs, "again"), want)


def test_first_block_cache_before_install(fbc_block, inputs):
    """Before a plan that replaces the blocks' forwards: refused in one line naming diffusers' hook, nothing left;
    before one that leaves them alone: composes, and uninstall leaves the cache working."""
    from h3plan.errors import InstallError

    want = _cached(_fbc(tiny_model()), inputs)
    model = _fbc(tiny_model())
    with pytest.raises(InstallError, match=r"transformer_blocks\.0 carries the diffusers hook 'fbc_leader_block_hook'"
                       ) as e:
        install(model, plan(**BLOCKS), registry=LEVERS)
    assert "\n" not in str(e.value) and installed(model) == []
    install(model, plan(**NO_BLOCKS), registry=LEVERS)
    bitwise(_cached(model, inputs), want)
    assert uninstall(model) and installed(model) == []
    bitwise(_cached(model, inputs, "again"), want)

"""What a plan attaches to forwards is a diffusers hook named `h3plan.<lever>` (install/hooks.py), and a user's own
hooks meet it one of two ways: around a module the plan only wraps or leaves alone they compose; on a module whose
forward the plan replaces (a transformer block) a hook registered before install is refused in one line naming it,
and one registered after install wraps the plan's forward and outlives uninstall.

The user hook here is a ModelHook of the test's own; diffusers' group offloading and FirstBlockCache are
test_user_hooks.py's.
Numerics: the plans are lossless (a table, sdpa, the exact gated residual), so outputs compare bitwise.
"""

import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook
from install_helpers import LEVERS, bitwise, forward, plan, tiny_inputs, tiny_model

from h3plan.errors import InstallError
from h3plan.install import install, uninstall
from h3plan.install.hooks import OWN, PREFIX, installed, lever_of, registered
from h3plan.levers import REGISTRY
from h3plan.planner import make_plan
from h3plan.facts.decision import make_decision

REG = dict(LEVERS, adaln_table=REGISTRY["adaln_table"].install)
TABLE = dict(video_shift=12.0, audio_shift=3.0, keyframe_noise_aug=0.999, audio=True, condition_video=False,
             condition_audio=False, steps=[5])


def _plan(**settings):
    base = plan(**settings)
    d = make_decision("adaln_table", "on", True, ["test"], params=TABLE)
    return make_plan(dict(base.config), {}, [d, *base.decisions])


BLOCKS = dict(attention="sdpa", gated_residual="on")  # the blocks' forwards replaced (gated_residual)
NO_BLOCKS = dict(attention="sdpa")  # the blocks keep diffusers' forward (processors and the table only)


class Scale(ModelHook):
    """A user's hook: the module's output times `factor`, counting its calls."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor, self.calls = factor, 0

    def new_forward(self, module, *args, **kwargs):
        self.calls += 1
        return self.fn_ref.original_forward(*args, **kwargs) * self.factor


def _dicts(model):
    return {name: set(m.__dict__) for name, m in model.named_modules()}


@pytest.fixture(scope="module")
def inputs():
    return tiny_inputs()


@pytest.fixture(scope="module")
def eager(inputs):
    return forward(tiny_model(), inputs)


def test_every_hook_is_named_for_a_lever_of_the_plan_and_uninstall_leaves_none(inputs, eager):
    model = tiny_model()
    before = _dicts(model)
    p = _plan(**BLOCKS)
    install(model, p, registry=REG)
    hooks = installed(model)
    levers = {d.lever for d in p.decisions}
    assert {fqn for fqn, _ in hooks} >= {f"transformer_blocks.{i}" for i in range(len(model.transformer_blocks))}
    assert {fqn for fqn, _ in hooks} >= {"norm_out", "time_proj", "time_embedder"}
    assert all(n.startswith(PREFIX) and lever_of(n) in {*levers, *OWN} for _, n in hooks), hooks
    bitwise(forward(model, inputs), eager)
    assert uninstall(model)
    assert installed(model) == [] and _dicts(model) == before  # no registry, no instance forward left
    bitwise(forward(model, inputs), eager)


def test_a_user_hook_on_a_block_the_plan_replaces_is_refused_naming_it(inputs, eager):
    model = tiny_model()
    mine = Scale(1.0)
    HookRegistry.check_if_exists_or_initialize(model.transformer_blocks[1]).register_hook(mine, "user.scale")
    with pytest.raises(InstallError, match=r"transformer_blocks\.1 carries the diffusers hook 'user\.scale'") as e:
        install(model, _plan(**BLOCKS), registry=REG)
    assert "\n" not in str(e.value)
    assert installed(model) == [] and registered(model.transformer_blocks[1]) == ["user.scale"]  # nothing half-left
    bitwise(forward(model, inputs), eager)
    assert mine.calls == 1


def test_a_user_hook_on_a_block_the_plan_leaves_alone_composes(inputs, eager):
    model = tiny_model()
    mine = Scale(1.0)
    HookRegistry.check_if_exists_or_initialize(model.transformer_blocks[0]).register_hook(mine, "user.scale")
    install(model, _plan(**NO_BLOCKS), registry=REG)
    assert registered(model.transformer_blocks[0]) == ["user.scale"]
    assert any(n.startswith(PREFIX) for _, n in installed(model))
    bitwise(forward(model, inputs), eager)
    assert mine.calls == 1
    assert uninstall(model) and registered(model.transformer_blocks[0]) == ["user.scale"]


def test_a_user_hook_registered_after_install_wraps_the_plan_and_outlives_uninstall(inputs):
    ref = tiny_model()
    HookRegistry.check_if_exists_or_initialize(ref.transformer_blocks[0]).register_hook(Scale(2.0), "user.scale")
    want = forward(ref, inputs)
    model = tiny_model()
    install(model, _plan(**BLOCKS), registry=REG)
    mine = Scale(2.0)
    HookRegistry.check_if_exists_or_initialize(model.transformer_blocks[0]).register_hook(mine, "user.scale")
    assert registered(model.transformer_blocks[0])[-1] == "user.scale" and len(installed(model)) > 0
    bitwise(forward(model, inputs), want)
    assert uninstall(model) and installed(model) == []
    assert registered(model.transformer_blocks[0]) == ["user.scale"]
    bitwise(forward(model, inputs), want)  # the user's hook still runs, around diffusers' forward now
    assert mine.calls == 2


def test_the_vae_hooks_are_named_for_its_levers_and_uninstall_leaves_none():
    """The installed decode's numbers are test_install_vae.py's; here: names, and the VAE as before after uninstall."""
    from test_install_vae import decode, latent, tiny_vae, vae_plan

    vae, z = tiny_vae(), latent()
    before, want = _dicts(vae), decode(vae, z)
    p = vae_plan(["swiglu"])
    install(vae, p)
    hooks = installed(vae)
    blocks = range(len(vae.decoder.transformer_blocks))
    # "": the effects on the VAE itself (its tiles, its casts)
    assert {fqn for fqn, _ in hooks} == {"", *(f"decoder.transformer_blocks.{i}" for i in blocks)}
    assert all(n.startswith(PREFIX) and lever_of(n) in {*(d.lever for d in p.decisions), *OWN} for _, n in hooks), hooks
    decode(vae, z)
    assert uninstall(vae) and installed(vae) == [] and _dicts(vae) == before
    assert torch.equal(decode(vae, z), want)


def _hooks(model):
    return [m._diffusers_hook.hooks[n] for _, m in model.named_modules() if "_diffusers_hook" in m.__dict__
            for n in m._diffusers_hook._hook_order if n.startswith(PREFIX)]


def test_every_hook_is_an_instance_of_a_module_level_class():
    """dynamo guards a hooked forward on its hook's type (`___check_type_id(function_reference.pre_forward.__self__)`
    in diffusers' new_forward): a class made per install would make every block's hook a new type."""
    model = tiny_model()
    install(model, _plan(**BLOCKS), registry=REG)
    types_ = {type(h) for h in _hooks(model)}
    assert types_ and all("<locals>" not in t.__qualname__ for t in types_), types_
    assert len({type(model.transformer_blocks[i]._diffusers_hook.hooks[n]) for i in range(2)
                for n in registered(model.transformer_blocks[i])}) == 1


def test_regional_compile_of_hooked_blocks_compiles_one_graph_for_every_block(inputs):
    """diffusers' compile_repeated_blocks (fullgraph) over blocks whose forwards the plan replaced: the code of the
    hooked forward is shared by every block, so a guard that tells one block's hook from another's recompiles. The CPU
    torch guards the hook's type only where the hook's forward reads the hook's attributes (the GPU suite's torch
    guards it on `pre_forward.__self__` as well), so the class check above is what holds every hook to one type."""
    import torch._dynamo

    model = tiny_model()
    install(model, _plan(**BLOCKS), registry=REG)
    assert len(model.transformer_blocks) > 1 and all(registered(b) for b in model.transformer_blocks)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            model.compile_repeated_blocks(fullgraph=True, backend="eager")
            forward(model, inputs)
            forward(model, inputs)
    finally:
        torch._dynamo.reset()


def test_an_uninstalled_model_is_freed_by_reference_counting():
    """Uninstall leaves no reference cycle through a removed hook (a hook and its diffusers function reference point
    at each other, and at the module): `del model` frees the hooked modules' tensors at once, not at the next garbage
    collection, so a device's memory is back when the user drops the model. The AdaLN linears are left out: the
    tables' slots hold them in a cycle of the tables' own."""
    import gc
    import weakref

    from h3plan.install.adaln_table import tables_of

    model = tiny_model()
    install(model, _plan(**BLOCKS), registry=REG)
    hooked = {fqn for fqn, _ in installed(model)}
    assert {"transformer_blocks.0", "norm_out", "time_embedder"} <= hooked
    tabled = {id(p) for s in tables_of(model).slots for p in s.linear.parameters()}
    uninstall(model)
    weights = [(n, weakref.ref(p)) for n, p in model.named_parameters() if id(p) not in tabled]
    assert any(n.startswith("transformer_blocks.0.") for n, _ in weights)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del model
        alive = [n for n, w in weights if w() is not None]
    finally:
        if enabled:
            gc.enable()
    assert not alive, f"{len(alive)} of {len(weights)} parameters wait for the garbage collector: {alive[:4]}"

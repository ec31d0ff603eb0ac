"""Every lever's declared state-dict effects (`Spec.state`, levers/base.py `StateKeys`) against what its install does.

Each setting of every lever is planned for the tiny models (model=h3_tiny, vae=h3_tiny_pipe) and installed alone (a
transformer lever with the plan's attention decision, which every transformer install reads) into a model loaded on
the host, with install(..., device="lazy"): torch's lazy device, a second device on the CPU (install_helpers), so what
the plan parks stays on the host where everything else moves. The state dict after install against the one before:
a key added is owned, a key whose dtype or shape changed is replaced, a key left on the host is parked, and no key
may go. Every changed key is covered by a declaration of its kind and every declared pattern matches a changed key,
so the declaration cannot drift from the install; a few whole plans check that levers installed together change
nothing none of them declares. uninstall gives back the state dict as it was (keys, dtypes, shapes, host).
"""

from fnmatch import fnmatchcase

import pytest
from install_helpers import lazy_device, tiny_model
from sparse_attention_worker import sparse_decisions
from test_install_vae import tiny_vae

import h3plan
from h3plan.install import install, uninstall
from h3plan.levers import BACKEND_LEVER, NAMES, SPECS
from h3plan.planner import make_plan

TINY = {"model": "h3_tiny", "vae": "h3_tiny_pipe", "levers.vae_graphs": "off"}
BASES = ({"hardware": "sm100", "recipe": "bf16"}, {"hardware": "sm90", "recipe": "bf16"},
         {"hardware": "sm100", "recipe": "fp8"}, {"hardware": "sm90", "recipe": "fp8"},
         {"hardware": "sm100", "recipe": "nvfp4"})
FL2VA = {"video.task": "fl2va", "video.keyframes": ["first", "last"]}
# what a setting needs besides the lever forced: seeded weights carry no evidence, so a cache schedule runs unmeasured
EXTRA = {
    "step_cache": {"pipeline.num_inference_steps": 6, "recipe.cache": {"psnr_db_min": 28.0, "ssim_min": 0.93,
                                                                      "unmeasured": True}},
    "vae_precision": {"recipe.vae": "fp16"},
    "vae_encode_precision": FL2VA,
    "vae_encode_tiles": FL2VA,
}
# settings one process cannot plan or install here; they must declare no state (a declaration here is untested)
NOT_HERE = {
    **{("ulysses_padding", s): "Ulysses degree > 1" for s in ("padded", "fixed_valid", "valid_only")},
    ("ulysses_overlap", "on"): "Ulysses degree > 1", ("a2a_fp8_codes", "on"): "Ulysses degree > 1",
    ("prefix_inplace", "on"): "Ulysses degree > 1", ("ulysses_exchange", "projection"): "Ulysses degree > 1",
    ("ulysses_exchange", "projection_split"): "Ulysses degree > 1", ("ring", "on"): "parallel.ring > 1",
    ("vae_parallel", "tiles"): "Ulysses degree > 1",
    ("fa4_tile", "tuned"): "a tuned device (hardware.tuned)", ("fp8_scales", "static"): "a calibrated scale table",
    ("vae_tiles", "custom"): "a custom tile (vae.custom_tile)",
}
OWN_DECISIONS = {("sparse_attention", "block_sparse"): sparse_decisions}  # planned for the tiny sequence by hand


@pytest.fixture(scope="module", autouse=True)
def lazy():
    lazy_device()


@pytest.fixture(scope="module")
def models():
    return {"transformer": tiny_model(), "vae": tiny_vae()}


def _plan(lever, setting):
    """The plan of `setting` alone (with the attention decision for a transformer lever), or None."""
    if (lever, setting) in OWN_DECISIONS:
        return make_plan({"model": {"name": "h3_tiny"}}, {}, OWN_DECISIONS[lever, setting]())
    for base, extra in ((b, e) for b in BASES for e in (EXTRA.get(lever, {}), {})):
        try:
            p = h3plan.resolve_config(**{**TINY, **base, **extra, f"levers.{lever}": setting})
        except h3plan.H3PlanError:
            continue
        keep = {lever} | ({BACKEND_LEVER} if SPECS[lever].model == "transformer" else set())
        return make_plan(dict(p.config), p.derived, [d for d in p.decisions if d.lever in keep])
    return None


def _state(model):
    return {k: (v.dtype, tuple(v.shape), v.device.type) for k, v in model.state_dict().items()}


def changed_keys(model, plan) -> dict[str, str]:
    """key -> owns / replaces / parks / removed: what installing `plan` did to the host-loaded model's state dict."""
    before = _state(model)
    install(model, plan, device="lazy", stand_in=True)
    try:
        after = _state(model)
    finally:
        uninstall(model)
    assert _state(model) == before, "uninstall did not give back the state dict"
    out = {k: "removed" for k in before.keys() - after.keys()}
    out.update({k: "owns" for k in after.keys() - before.keys()})
    for k in before.keys() & after.keys():
        if before[k][:2] != after[k][:2]:
            out[k] = "replaces"
        elif after[k][2] != "lazy":
            out[k] = "parks"
    return out


def drift(changed: dict[str, str], declared) -> list[str]:
    """Every way `changed` and the declared StateKeys disagree: an undeclared change, a pattern that matched nothing."""
    out = [f"{key}: {kind}, not declared" for key, kind in sorted(changed.items())
           if not any(d.kind == kind and d.covers(key) for d in declared)]
    for d in declared:
        out += [f"declared {d.kind} {pattern!r} matched no changed key" for pattern in d.keys
                if not any(kind == d.kind and fnmatchcase(key, pattern) for key, kind in changed.items())]
    return out


SETTINGS = [(lever, s) for lever in NAMES for s in SPECS[lever].settings]


@pytest.mark.parametrize("lever, setting", SETTINGS, ids=[f"{lv}={s}" for lv, s in SETTINGS])
def test_each_setting_changes_exactly_the_keys_it_declares(models, lever, setting):
    declared = SPECS[lever].state.get(setting, ())
    if (lever, setting) in NOT_HERE:
        assert not declared, f"{lever}={setting} declares state keys no CPU test installs ({NOT_HERE[lever, setting]})"
        pytest.skip(f"needs {NOT_HERE[lever, setting]}")
    plan = _plan(lever, setting)
    assert plan is not None, f"{lever}={setting}: no plan on the tiny models; add its overrides to EXTRA or NOT_HERE"
    problems = drift(changed_keys(models[SPECS[lever].model], plan), declared)
    assert not problems, f"{lever}={setting}: " + "; ".join(problems)


@pytest.mark.parametrize("over", [
    {"hardware": "sm100", "recipe": "fp8", "levers.adaln_table": "on"},
    {"hardware": "sm100", "recipe": "nvfp4", "levers.adaln_table": "on"},
    {"hardware": "sm90", "recipe": "bf16", "recipe.vae": "fp16", "levers.vae_encode_precision": "fp16", **FL2VA},
], ids=["fp8+tables", "nvfp4+tables", "vae-fp16+encode"])
def test_a_whole_plan_changes_only_what_its_levers_declare(models, over):
    p = h3plan.resolve_config(**{**TINY, **over})
    seen = 0
    for model_kind, model in models.items():
        ds = [d for d in p.decisions if SPECS[d.lever].model == model_kind]
        declared = [k for d in ds for k in SPECS[d.lever].state.get(d.setting, ())]
        changed = changed_keys(model, make_plan(dict(p.config), p.derived, ds))
        assert not drift(changed, declared), f"{model_kind}: " + "; ".join(drift(changed, declared))
        seen += len(changed)
    assert seen


def test_the_declarations_are_of_known_kinds_and_settings():
    from h3plan.levers.base import STATE_KINDS, StateKeys

    with pytest.raises(ValueError, match="kind 'moves'"):
        StateKeys("moves", ("x",))
    assert all(k.kind in STATE_KINDS for s in SPECS.values() for ks in s.state.values() for k in ks)


def test_drift_names_an_undeclared_change_and_a_pattern_that_matched_nothing():
    from h3plan.levers.base import StateKeys

    declared = (StateKeys("owns", ("a.*.scale",)), StateKeys("parks", ("b.*",)))
    assert drift({"a.0.scale": "owns", "b.w": "parks"}, declared) == []
    assert drift({"a.0.scale": "replaces", "c": "owns"}, declared) == [
        "a.0.scale: replaces, not declared", "c: owns, not declared",
        "declared owns 'a.*.scale' matched no changed key", "declared parks 'b.*' matched no changed key"]

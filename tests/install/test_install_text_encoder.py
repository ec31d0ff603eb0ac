"""The plan's memory.text_encoder carried out (h3plan/install/text_encoder.py) on the tiny pipeline with diffusers'
text encoder step and the seeded tiny Qwen3-VL (model=h3_tiny's text_encoder_default), on the CPU.

Contracts: every placement leaves the frames of `pipe(prompt=...)` bitwise those of the unplaced pipeline (rtol=0,
atol=0); each moves what it says when it says (resident once; offload_after to the device and back around the
encode; host one part at a time); `h3plan.install(pipe, plan)` places the conditioner by the plan and uninstall undoes
it; a plan that places none leaves it alone. On the CPU the device and the host are one device: the moves are read
from the placement's log, the bytes never leave; tests/gpu would see them (not run here).
"""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.errors import InstallError  # noqa: E402
from h3plan.install.text_encoder import place, placed  # noqa: E402
from test_install_pipeline import _cfg  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module")
def pipe():
    import yaml

    from h3plan.actions.pipeline_build import build_pipeline, workflow_blocks
    from h3plan.planning import CONF

    return build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=1, blocks=workflow_blocks(text_encoder=True),
                          text_encoder=yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"])


def _call(pipe):
    from h3plan.actions.pipeline_build import prompt_text

    return pipe(prompt=prompt_text(9), height=SIZE, width=SIZE, num_frames=124, num_inference_steps=2,
                output_type="pt", output="videos", generator=torch.Generator("cpu").manual_seed(0))


@pytest.fixture(scope="module")
def unplaced(pipe):
    return _call(pipe)


@pytest.mark.slow  # ~20 s: the tiny pipeline with its conditioner, four calls
@pytest.mark.parametrize("setting", ["resident", "offload_after", "host"])
def test_each_placement_keeps_the_frames_and_moves_what_it_says(pipe, unplaced, setting):
    p = place(pipe.text_encoder, setting, "cpu")
    try:
        assert pipe._execution_device == torch.device("cpu")
        assert torch.equal(_call(pipe), unplaced)
        names = [n for n, _ in p.moves]
        layers = pipe.text_encoder.config.text_config.num_hidden_layers
        if setting == "resident":
            assert names == ["text_encoder"]
        elif setting == "offload_after":  # to the host at placing, then to the device and back around the one encode
            assert names == ["text_encoder"] * 3
        else:  # to the host at placing, then each part there and back (no vision input: the tower never runs)
            assert names[0] == "text_encoder" and "embed_tokens" not in names and names.count("norm") == 2
            assert all(names.count(f"layers.{i}") == 2 for i in range(layers)) and "visual" not in names
    finally:
        p.restore()
    assert placed(pipe.text_encoder) is None and "_hf_hook" not in pipe.text_encoder.__dict__


EAGER = {"levers.attention": "sdpa", "levers.adaln_table": "off", "levers.vae_graphs": "off", "levers.vae_ops": "eager",
         "levers.qk_norm_rope": "eager", "levers.modulation": "eager", "levers.gated_residual": "off",
         "levers.swiglu": "off"}  # the kernels are the installer tests' business; this is about the conditioner


@pytest.mark.slow
def test_install_places_it_by_the_plan_and_uninstall_undoes_it(pipe, unplaced):
    plan = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe",
                                 **{"memory.text_encoder": "offload_after", **EAGER})
    assert plan.derived_value("text_encoder")["setting"] == "offload_after"
    from h3plan.install.hooks import registered

    report = h3plan.install(pipe, plan)
    try:
        assert placed(pipe.text_encoder).setting == "offload_after"
        assert report.skipped["text_encoder"].startswith("offload_after (the plan's memory.text_encoder)")
        # the placement is a hook on the conditioner, over the placement's own release hook
        assert registered(pipe.text_encoder)[-1] == "h3plan.placement"
        assert torch.equal(_call(pipe), unplaced)
    finally:
        h3plan.uninstall(pipe)
    assert placed(pipe.text_encoder) is None
    assert "_diffusers_hook" not in pipe.text_encoder.__dict__ and "forward" not in pipe.text_encoder.__dict__
    h3plan.install(pipe, h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **EAGER))
    try:  # prompt_embeds given: the plan places nothing
        assert placed(pipe.text_encoder) is None
    finally:
        h3plan.uninstall(pipe)


def test_bad_placements_are_one_line():
    import yaml

    from h3plan.actions.text_encoder_build import build_text_encoder
    from h3plan.planning import CONF

    te = build_text_encoder(yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"])
    with pytest.raises(InstallError, match=r"^text encoder placement 'none': one of resident, offload_after, host"):
        place(te, "none", "cpu")
    with pytest.raises(InstallError, match="a Qwen3VLForConditionalGeneration is expected, got Linear"):
        place(torch.nn.Linear(2, 2), "host", "cpu")
    p = place(te, "host", "cpu")
    try:
        with pytest.raises(InstallError, match=r"already placed \(host\); restore\(\) it first"):
            place(te, "resident", "cpu")
    finally:
        p.restore()
    assert placed(te) is None and "_hf_hook" not in te.__dict__


@pytest.mark.parametrize("setting", ["offload_after", "resident"])
def test_build_pipeline_places_the_conditioner_and_builds_it_first_when_it_leaves_the_device(monkeypatch, setting):
    """build_pipeline(text_encoder_placement=...): off the device (offload_after, host) the conditioner is built and
    placed before the VAE and the transformer (whose float32 staging needs the room: at the real widths 62 GiB of
    conditioner beside 123 GiB of staging did not fit an H200); resident keeps today's order (built last)."""
    import yaml

    import h3plan.actions.pipeline_build as pb
    from h3plan.planning import CONF

    seen = []
    real_vae, real_te = pb.build_vae, pb.conditioner_components
    monkeypatch.setattr(pb, "build_vae", lambda *a, **k: (seen.append("vae"), real_vae(*a, **k))[1])
    monkeypatch.setattr(pb, "conditioner_components",
                        lambda *a, **k: (seen.append("text_encoder"), real_te(*a, **k))[1])
    p = pb.build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=1, blocks=pb.workflow_blocks(text_encoder=True), text_encoder_placement=setting,
                          text_encoder=yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"])
    assert seen == (["text_encoder", "vae"] if setting != "resident" else ["vae", "text_encoder"])
    state = placed(p.text_encoder)
    assert state is not None and state.setting == setting
    state.restore()


def test_masters_that_cannot_be_pinned_stay_pageable_and_the_line_says_why(monkeypatch):
    """offload_after toward a CUDA device pins its host masters; where pinning fails, the masters stay pageable, the
    moves still run, and the placement's line names the reason (nothing is copied twice: the masters are the
    parameters' storage between calls)."""
    import yaml

    import h3plan.install.text_encoder as ite
    from h3plan.actions.text_encoder_build import build_text_encoder
    from h3plan.planning import CONF

    real_empty = torch.empty

    def no_pinning(*a, pin_memory=False, **k):
        if pin_memory:
            raise RuntimeError("cudaHostAlloc failed: out of memory\nsecond line")
        return real_empty(*a, **k)

    monkeypatch.setattr(ite.torch, "empty", no_pinning)
    te = build_text_encoder(yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"])
    before = {n: t.clone() for n, t in te.state_dict().items()}
    p = place(te, "offload_after", "cuda")
    try:
        assert p.why_not_pinned == "pinning the host masters failed (cudaHostAlloc failed: out of memory); pageable"
        assert p.line.endswith("; host masters pageable: " + p.why_not_pinned)
        slots = p.masters["text_encoder"].slots
        assert slots and all(getattr(o, "_parameters" if is_p else "_buffers")[n] is not None
                             for o, n, is_p, _ in slots)
        assert all((o._parameters[n].data if is_p else o._buffers[n]).data_ptr() == m.data_ptr()
                   for o, n, is_p, m in slots)
        p.masters["text_encoder"].up(torch.device("cpu"))  # the way up, to the one device this machine has
        assert all(torch.equal(t, before[n]) for n, t in te.state_dict().items())
    finally:
        p.restore()
    assert placed(te) is None and all(torch.equal(t, before[n]) for n, t in te.state_dict().items())


@pytest.mark.parametrize("setting", ["offload_after", "host"])
def test_an_encode_that_raises_still_moves_the_conditioner_back(setting):
    """An encode that fails inside the conditioner (out of memory, a bad input) still moves what it moved to the device
    back to the host (the hooks move back in a `finally`): a failed call leaves no 62 GiB conditioner on the device for
    the next one. The device is named `cpu:1` so that the placement's log tells a move up from a move down on this
    one-device machine; the failure is raised inside the last decoder layer (its first norm), after every move up."""
    import yaml

    from h3plan.actions.text_encoder_build import build_text_encoder
    from h3plan.planning import CONF

    te = build_text_encoder(yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"])
    layers = te.model.language_model.layers
    p = place(te, setting, "cpu:1")
    fail = layers[-1].input_layernorm.register_forward_pre_hook(
        lambda m, a: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")))
    try:
        with pytest.raises(torch.OutOfMemoryError):
            te.model(input_ids=torch.tensor([[1, 2, 3]]))
        ups = [n for n, d in p.moves if d == "cpu:1"]
        assert ups == (["text_encoder"] if setting == "offload_after" else [f"layers.{i}" for i in range(len(layers))])
        last = dict(p.moves)  # the last move of each part
        assert all(last[n] == "cpu" for n in ups), list(p.moves)
    finally:
        fail.remove()
        p.restore()


def test_shared_decoder_weights_keep_every_layer_and_host_gives_each_shared_tensor_one_master():
    """text_encoder_build.share_decoder_weights (benchmarks/memory.py --text-encoder-weight-sets, for a host smaller
    than the seeded pipeline): every decoder layer stays, layer i computing with layer (i mod sets)'s tensors; placed
    at `host`, a tensor two layers share gets one host master (not one per layer: 64 pinned copies of 16 layers'
    weights would fill the host the sharing saves), each layer still moves up and back on its own, and the encode is
    bitwise the unplaced one. Out-of-range counts are one line."""
    import yaml

    from h3plan.actions.text_encoder_build import build_text_encoder, share_decoder_weights
    from h3plan.errors import UsageError
    from h3plan.planning import CONF

    cfg = yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"]
    te = build_text_encoder(cfg, weight_sets=2)
    layers = te.model.language_model.layers
    n = cfg["text_config"]["num_hidden_layers"]
    assert len(layers) == n > 50  # diffusers' hidden_states[50] still exists
    w = [layer.mlp.gate_proj.weight for layer in layers]
    assert all(w[i] is w[i % 2] for i in range(n)) and w[0] is not w[1]
    assert not torch.equal(w[0], w[1])  # two seeded sets, not one copied
    distinct = {id(t) for t in te.parameters()}
    assert len(distinct) == len(list(te.parameters()))  # parameters() yields each shared tensor once
    ids = torch.tensor([[1, 2, 3, 4]])
    expect = te.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    assert len(expect) == n + 1

    p = place(te, "host", "cpu:1")
    try:
        masters = {id(m) for ms in p.masters.values() for *_, m in ms.slots}
        per_layer = sum(1 for _ in layers[0].parameters())
        parts = {name: ms for name, ms in p.masters.items() if name.startswith("layers.")}
        assert len(parts) == n  # every layer is a part of its own
        layer_masters = {id(m) for ms in parts.values() for *_, m in ms.slots}
        assert len(layer_masters) == 2 * per_layer, (len(layer_masters), per_layer)
        assert len(masters) < len([s for ms in p.masters.values() for s in ms.slots])
        got = te.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        assert all(torch.equal(a, b) for a, b in zip(got, expect))
        ups = [name for name, d in p.moves if d == "cpu:1" and name.startswith("layers.")]
        assert ups == [f"layers.{i}" for i in range(n)]
    finally:
        p.restore()
    assert layers[3].mlp.gate_proj.weight is layers[1].mlp.gate_proj.weight  # restore keeps the sharing
    for bad in (0, n + 1):
        with pytest.raises(UsageError,
                           match=rf"^text encoder weight sets {bad}: between 1 and its {n} decoder layers$"):
            share_decoder_weights(te, bad)


@pytest.mark.parametrize("setting", ["none", "resident", "offload_after", "host"])
def test_the_lever_installs_through_the_builder(setting):
    """The text_encoder lever records its placement as the `pipeline` scope's option (none: a skip, nothing placed);
    the installer's placements are the settings that option takes."""
    from h3plan.install.builder import Builder
    from h3plan.install.text_encoder import PLACED
    from h3plan.levers import MEMORY_REGISTRY

    lever = MEMORY_REGISTRY["text_encoder"]
    decision = lever.from_derived({"setting": setting, "reasons": ["why"]})
    builder = Builder()
    lever.install(builder, decision)
    assert builder.view("pipeline").text_encoder == (None if setting == "none" else setting)
    assert builder.skipped == ([("text_encoder", "why")] if setting == "none" else [])
    assert PLACED == ("resident", "offload_after", "host")


@pytest.mark.parametrize("setting", ["resident", "offload_after", "host"])
def test_verify_encodes_placed_against_unplaced(setting, capsys):
    """action=verify's text_encoder check (actions/verify_text_encoder.py): model=h3_tiny's seeded conditioner, every
    hidden state bitwise the unplaced encode's; a plan that places none adds no line."""
    from h3plan.actions.verify import Report, compare
    from h3plan.actions.verify_text_encoder import check

    rep = Report()
    check(h3plan.resolve_config(model="h3_tiny", **{"memory.text_encoder": setting}), rep, compare)
    out = capsys.readouterr().out
    assert rep.ok and rep.results == [(f"text_encoder={setting}", True, rep.results[0][2])], out
    assert f"PASS  {'text_encoder=' + setting:<34} bitwise equal to unplaced; 52 hidden states" in out
    rep = Report()
    check(h3plan.resolve_config(model="h3_tiny"), rep, compare)
    assert rep.results == [] and capsys.readouterr().out == ""


def test_verify_leaves_a_wide_conditioner_to_the_gpu(capsys):
    from h3plan.actions.verify import Report, compare
    from h3plan.actions.verify_text_encoder import check

    rep = Report()
    check(h3plan.resolve_config(**{"memory.text_encoder": "host"}), rep, compare)
    assert rep.ok and list(rep.not_run) == ["text_encoder=host"] and rep.verdict()[1] == 0
    assert "too wide for the CPU" in capsys.readouterr().out


def test_a_transformer_built_before_a_resident_conditioner_on_the_gpu_is_built_narrow():
    """A resident conditioner built on the same CUDA device after the transformer (whole-tier-fl2va / -ref2va on the
    H200 ran out of memory there, with the float32 staging's 12 GiB still reserved): the transformer is built narrow;
    everywhere else build_model decides by the free memory."""
    from h3plan.actions.pipeline_build import _narrow_before_conditioner as narrow

    assert narrow(True, "cuda", "cuda") is True
    assert narrow(True, "cpu", "cuda") is None  # built on the host (its weight sets shared), placed after
    assert narrow(False, "cuda", "cuda") is None  # built and placed off the device first, or no conditioner
    assert narrow(True, "cpu", "cpu") is None

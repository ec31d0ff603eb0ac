"""planning/direct.py composes the config Hydra composes: the same values, node types and flags, node by node, for
every preset and the override forms it reads; every other command line (and every error) is left to Hydra."""

import dataclasses
import itertools
from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from h3plan.planning import config, direct

REPO = Path(__file__).resolve().parents[2]

PRESETS = [[f"hardware={h}", f"recipe={r}", f"parallel={p}"]
           for h, r, p in itertools.product(("sm90", "sm100", "sm103", "sm107"), ("bf16", "fp8", "nvfp4"),
                                            ("u1", "u2", "u4", "u8", "r2u4"))]
FORMS = [
    [],
    ["video.height=704", "video.width=1280", "video.seconds=10"],  # video_overrides adds video.frames=null, a list
    ["levers.attention=sdpa", "levers.swiglu=off", "levers.qk_norm_rope=auto", "format=json", "detail=full"],
    ["hardware.device.memory_gb=80", "parallel.seq_len=20000", "memory.reserve_fraction=0.1", "strict=true"],
    ["model=h3_tiny", "action=verify", "video=t2v_768x1344_10s", "pipeline=h3", "strict=False", "out=null"],
    ["out=/tmp/a-b/plan.yaml", "plan=saved.json"],
    ["video.frames=125", "video.audio=false", "parallel.seq_len=-3"],
    # a search path: a tuned hardware file (defaults: its base preset, then _self_) and a group option only there
    [f"hydra.searchpath=[file://{REPO}/docs/tuned]", "hardware=sm90_h200", "recipe=fp8", "levers.attention=sdpa"],
    ["recipe=bf16", f"hydra.searchpath=[file://{REPO}/tests/planner/data/conf,file://{REPO}/docs/tuned]",
     "hardware=tuned_synthetic"],
    [f"hydra.searchpath=[file://{REPO}/docs/tuned]", "hardware=sm100"],
    # a `# @package _global_` option (its defaults: /vae/h3@vae, then _self_, which also sets parallel.seq_len)
    ["vae=h3_tiny"],
    ["model=h3_tiny", "vae=h3_tiny", "parallel.seq_len=64", "recipe=fp8"],
    # a flat mapping merged into its node; a key set twice (the last wins, each checked)
    ["levers.step_cache=fixed", "recipe.cache={psnr_db_min:28.0,ssim_min:0.93,computed:34}",
     "pipeline.num_inference_steps=50"],
    ["levers.attention=fa4", "levers.attention=sdpa", "parallel.seq_len=100", "parallel.seq_len=200"],
    # a group with no default option (tier: null), chosen: a `_global_` file overriding another group's choice
    ["tier=quality"],
    ["tier=quality", "recipe=bf16", "recipe.sparse.keep=0.5"],  # the command line's recipe wins over the tier's
]


def _hydra(overrides):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(direct, "compose", lambda overrides: None)
        return config.compose(overrides)


def _nodes(cfg, path=""):
    """(path, node metadata, node class, value when a leaf) for every node, depth first (Hydra's root caches the
    resolved `${now:}` of its own hydra node: not config)."""
    yield path, dataclasses.replace(cfg._metadata, resolver_cache={}), type(cfg), None
    items = cfg.items_ex(resolve=False) if isinstance(cfg, DictConfig) else enumerate(cfg)
    for key, _ in items:
        node = cfg._get_node(key)
        if isinstance(node, (DictConfig, ListConfig)) and not node._is_none() and not node._is_missing():
            yield from _nodes(node, f"{path}.{key}")
        else:
            yield f"{path}.{key}", node._metadata, type(node), node._value()


@pytest.mark.parametrize("overrides", PRESETS[::7] + FORMS)  # 9 presets: each hardware, recipe and parallel
def test_direct_composes_hydras_config(overrides):
    before = direct.FALLBACKS.copy()
    with config.libyaml():
        fast = direct.compose(config.video_overrides(overrides))
    assert fast is not None and direct.FALLBACKS == before, (overrides, direct.FALLBACKS - before)
    slow = _hydra(overrides)
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(slow)
    assert list(_nodes(fast)) == list(_nodes(slow))


@pytest.mark.parametrize("overrides", [
    ["+extra=1"], ["~out"], ["++strict=true"], ["recipe=bf16,fp8"], ["out='a b'"], ["out=1e3.yaml"],
    ["hardware=sm90", "hardware=sm100"], ["vae=h3_tiny", "vae=h3"], ["recipe=bogus"],
    ["parallel.seq_len=1e3"], ["parallel.seq_len=${oc.env:N}"], ["hydra.job.chdir=false"], ["video.audio=inf"],
    ["hydra.searchpath=[file:///no/such/folder]"], ["hydra.searchpath=[pkg://h3plan.conf]"],
    ["hydra.searchpath=[file://docs]"],
    [f"hydra.searchpath=[file://{REPO}/docs/tuned]", "hardware=sm90_h2000"],
    ["recipe.cache={psnr_db_min: 28}"], ["recipe.cache={psnr_db_min:[28]}"], ["recipe.cache={}"],
    ["recipe.cache={warmup:1,warmup:2}"], ["recipe.cache={true:1}"], ["recipe.cache={psnr_db_min:{a:1}}"],
    ["verify.nope={out:/tmp/x.yaml}"],
])
def test_other_forms_and_errors_are_left_to_hydra(overrides):
    before = direct.FALLBACKS.copy()
    with config.libyaml():
        assert direct.compose(overrides) is None
    assert sum((direct.FALLBACKS - before).values()) == 1  # counted once, with its reason


@pytest.mark.parametrize("overrides", [
    # an unknown key (top level, nested, in a mapping); a value its choices, int, float, bool or mapping refuse
    ["nope=1"], ["levers.atention=fa4"], ["recipe.cache={nope:1}"], ["levers.attention=bogus"],
    ["parallel.seq_len=abc"],
    ["hardware.device.memory_gb=lots"], ["bench.best=maybe"], ["recipe.cache={warmup:x}"],
    ["hardware=sm107", "recipe=nvfp4", "parallel.seq_len=100", "levers.swiglu=maybe", "levers.attention=bogus"],
    [f"hydra.searchpath=[file://{REPO}/docs/tuned]", "hardware=sm90_h200", "hardware.nope=1"],
])
def test_a_refused_key_override_is_hydras_line_without_hydra(overrides):
    """OmegaConf refuses a key override in direct's composition as in Hydra's (the same update on the same node): the
    one line is Hydra's, byte for byte, and Hydra never composes."""
    from h3plan.errors import H3PlanError

    before = direct.FALLBACKS.copy()
    with pytest.raises(direct.Refused):
        with config.libyaml():
            direct.compose(config.video_overrides(overrides))
    with pytest.raises(H3PlanError) as fast:
        config.compose(overrides)
    assert direct.FALLBACKS == before
    with pytest.raises(H3PlanError) as slow:
        _hydra(overrides)
    assert (type(fast.value), str(fast.value)) == (type(slow.value), str(slow.value))


@pytest.mark.parametrize("text,value", [("null", None), ("NULL", None), ("True", True), ("false", False), ("12", 12),
                                        ("-0", 0), ("+7", 7), ("0.25", 0.25), ("fa4", "fa4"),
                                        ("t2v_768x1344_5s", "t2v_768x1344_5s"),
                                        ("[a,b]", ["a", "b"]), ("plan.yaml", "plan.yaml"),
                                        ("/tmp/pytest-of-root/p-1/test_x0/plan.yaml",
                                         "/tmp/pytest-of-root/p-1/test_x0/plan.yaml"),
                                        ("./out/x_1.json", "./out/x_1.json"), ("1.yaml", "1.yaml"), ("a-b/c", "a-b/c"),
                                        ("[]", []), ("[1,null]", [1, None]),
                                        ("{a:1}", {"a": 1}), ("{psnr_db_min:28.0,ssim_min:0.93,computed:null,name:fa4}",
                                                               {"psnr_db_min": 28.0, "ssim_min": 0.93,
                                                                "computed": None, "name": "fa4"})])
def test_values_read_as_hydras_grammar_reads_them(text, value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert direct._value(text) == value
    assert OverridesParser.create().parse_override(f"k={text}").value() == value


def test_a_repeated_composition_is_its_own_copy_of_the_same_config():
    """The merged groups are cached per choices (direct._MERGED): a second composition is equal node by node to the
    first and to Hydra's, and editing one (as an override or a caller does) leaves the next untouched."""
    overrides = ["hardware=sm100", "recipe=fp8", "parallel=u2"]
    with config.libyaml():
        first = direct.compose(overrides)
        first.parallel.seq_len = 7
        first.levers.attention = "sdpa"
        again = direct.compose(overrides + ["levers.swiglu=off"])
        third = direct.compose(overrides)
    assert again is not first and third is not again and third is not first
    assert list(_nodes(again)) == list(_nodes(_hydra(overrides + ["levers.swiglu=off"])))
    assert list(_nodes(third)) == list(_nodes(_hydra(overrides)))


def test_an_edited_group_file_is_read_again(tmp_path, monkeypatch):
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(direct.CONF, conf)
    monkeypatch.setattr(direct, "CONF", str(conf))
    with config.libyaml():
        assert direct.compose(["hardware=sm90"]).hardware.device.memory_gb != 12.5
        text = (conf / "hardware" / "sm90.yaml").read_text()
        (conf / "hardware" / "sm90.yaml").write_text(text.replace("memory_gb:", "memory_gb: 12.5 #", 1))
        assert direct.compose(["hardware=sm90"]).hardware.device.memory_gb == 12.5


def _left_to_hydra(tmp_path, text: str) -> None:
    """hardware=mine from a searchpath folder holding `text`: direct.py leaves it to Hydra, and counts it once."""
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "mine.yaml").write_text(text)
    before = direct.FALLBACKS.copy()
    with config.libyaml():
        assert direct.compose([f"hydra.searchpath=[file://{tmp_path}]", "hardware=mine"]) is None
    assert sum((direct.FALLBACKS - before).values()) == 1


@pytest.mark.parametrize("defaults", ["[sm90]", "[/recipe: fp8, _self_]", "[sm90, mine, _self_]",
                                      "[sm90, sm90, _self_]"])
def test_a_user_file_with_other_defaults_is_left_to_hydra(tmp_path, defaults):
    """Only the same group's options and an explicit `_self_`, each file once; a cycle or any other entry: Hydra."""
    _left_to_hydra(tmp_path, f"defaults: {defaults}\nname: mine\n")


@pytest.mark.parametrize("header", ["# @package hardware\n", "# @package _global_\n# @other x\n",
                                    "# @package _global_\n"])
def test_a_user_file_with_another_header_or_global_defaults_is_left_to_hydra(tmp_path, header):
    """A `_global_` option's defaults are `/group/option@group` entries of its own group and `_self_` only."""
    _left_to_hydra(tmp_path, f"{header}defaults: [sm90, _self_]\nhardware: {{name: mine}}\n")


def test_a_user_file_composes_as_hydra_composes_it(tmp_path):
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "mine.yaml").write_text("defaults: [sm100, _self_]\nname: mine\ndevice: {memory_gb: 96}\n")
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "hardware=mine", "parallel=u2"]
    with config.libyaml():
        fast = direct.compose(overrides)
    # name: mine over sm100's measured and verified facts, none of its own: they stay sm100's (direct.inherited_name)
    assert fast is not None and (fast.hardware.name, fast.hardware.device.memory_gb) == ("sm100", 96)
    assert list(_nodes(fast)) == list(_nodes(_hydra(overrides)))

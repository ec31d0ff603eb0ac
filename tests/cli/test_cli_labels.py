"""The summary's header lines say what the rows say: the device the hardware group assumes and what a plan may use
of it, one unit, the attention whose bits "lossless" keeps, labels that agree with the overrides and the rows."""

import pytest

import h3plan
from h3plan import cli
from h3plan.levers import SPECS
from h3plan.planning.memory import usable_gib


def _label(text: str, label: str) -> str:
    """The text of a labelled line and its continuation lines, on one line ('' when absent)."""
    out, inside = [], False
    for x in text.splitlines():
        if x.startswith(f"{label:<8} "):
            inside = True
            out.append(x[9:])
        elif inside and x.startswith(" " * 9):
            out.append(x[9:])
        else:
            inside = False
    return " ".join(" ".join(out).split())


def _summary(**kw) -> str:
    return cli.render_summary(h3plan.resolve_config(**kw))


def test_the_header_names_the_device_the_hardware_group_assumes():
    head = _summary(hardware="sm90").splitlines()[0]
    assert "hardware=sm90 (H200, 141 GB)" in head
    assert "hardware=sm90 (H200, 80 GB)" in _summary(**{"hardware": "sm90",
                                                        "hardware.device.memory_gb": 80}).splitlines()[0]
    assert "hardware=sm90 (H200)  recipe" in _summary(**{"hardware": "sm90",
                                                         "hardware.device.memory_gb": None}).splitlines()[0]


def test_the_memory_line_is_in_gib_with_the_usable_memory_and_how_to_change_it():
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1")
    line = _label(cli.render_summary(plan), "memory")
    usable = usable_gib(141, plan.get("memory")["reserve_fraction"])
    assert (f"peak {plan.derived_value('memory_peak_gib_per_gpu'):.1f} GiB per GPU while denoising, "
            f"of {usable:.1f} GiB usable") in line
    assert "141 GB = 131.3 GiB less the 8% memory.reserve_fraction; another card: hardware.device.memory_gb=80" in line
    items = plan.derived_value("memory_peak_items")
    assert len(items) > 3 and f"its largest 3 of {len(items)} items: transformer_weights 37.4," in line
    assert line.endswith(" GiB") and " GB" not in line.replace("141 GB", "").replace("memory_gb=80", "")


def test_another_card_is_never_the_card_the_command_set():
    line = _label(_summary(**{"hardware.device.memory_gb": 80}), "memory")
    assert "(80 GB = 74.5 GiB less the 8% memory.reserve_fraction; another card: hardware.device.memory_gb=141)" in line
    assert "memory_gb=80" not in line


def test_the_install_line_says_in_plain_words_what_each_way_of_loading_holds():
    plan = h3plan.resolve_config(**{"hardware.device.memory_gb": 80})
    line = _label(cli.render_summary(plan), "install")
    assert "loaded on the GPU first" not in line
    assert (f'install(pipe, plan, device="cuda") on a pipeline loaded on the host peaks at '
            f'{plan.derived_value("memory_install_gib"):.1f} GiB per GPU' in line)
    assert line.endswith(f'moved to the GPU whole before install (pipe.to("cuda")) holds '
                         f'{plan.derived_value("memory_loaded_gib"):.1f} GiB (does not fit: load it on the host)')


def test_lossless_says_whose_frames_and_the_setting_that_keeps_stock_bits():
    line = _label(_summary(hardware="sm90", recipe="bf16"), "lossless")
    assert line.startswith("the frames are diffusers' eager frames with fa4 as the attention, bit for bit")
    # the committed measurement (benchmarks/results/pipeline-h200.json, eager with sm90/bf16/u1's attention: 76.34 dB)
    assert "not stock diffusers' frames (PSNR 76.3 dB from them at 768x1344x124 on sm90)" in line
    assert line.endswith("stock diffusers' bits on one GPU: levers.attention=sdpa (diffusers' default, torch SDPA)")
    stock = _label(_summary(**{"hardware": "sm90", "recipe": "bf16", "levers.attention": "sdpa"}), "lossless")
    assert stock.endswith("stock diffusers' frames, bit for bit")
    two = _label(_summary(**{"recipe": "bf16", "parallel": "u2", "levers.attention": "sdpa"}), "lossless")
    assert "stock diffusers' frames, bit for bit on one GPU (Ulysses 2:" in two
    # no measurement on sm100: the words without a number
    other = _label(_summary(hardware="sm100", recipe="bf16"), "lossless")
    assert "not stock diffusers' frames;" in other and "PSNR" not in other


@pytest.mark.parametrize("over,lever", [({"recipe.vae": "fp16"}, "vae_precision"),
                                        ({"recipe.cache": {"psnr_db_min": 28, "ssim_min": 0.93}}, "step_cache")])
def test_a_lossless_recipe_with_a_lossy_setting_of_its_own_never_says_lossless(over, lever):
    """The header, the lossy line and the note name the lossy setting and the evidence its decision carries (read from
    the decisions' lossless flags), never "lossless", a budget of None, or a measured error the plan does not have."""
    plan = h3plan.resolve_config(recipe="bf16", **over)
    text = cli.render_summary(plan)
    head = text.splitlines()[0]
    assert f"recipe=bf16 (lossy by its own choice: {lever})" in head and "lossless)" not in head
    assert "None" not in text and _label(text, "lossless") == ""
    d = plan.decision(lever)
    from h3plan.planning.render import evidence

    assert evidence(d), d.reasons  # the decision says what backs it (measured, published, or never measured)
    note = next(n for n in plan.notes if n.startswith("lossy by the recipe's own choice"))
    assert f"{lever}={d.setting} (" in note and all(x in note for x in evidence(d))
    assert "each line gives its measured error" not in note
    if lever == "vae_precision":
        line = _label(text, "lossy")
        assert line.startswith("vae_precision=fp16, the recipe's own lossy choice outside its lossless policy: "
                               "measured on sm90: fp16 decode against the fp32 decode") and "PSNR 81.7 dB" in line
    full = cli.render_table(plan)
    assert "lossless)" not in full.splitlines()[0]


def test_the_parallel_label_names_an_override_of_its_preset():
    head = _summary(**{"parallel": "u1", "parallel.ulysses": 56}).splitlines()[0]
    assert "parallel=u1 with parallel.ulysses=56 (Ulysses 56," in head
    assert "parallel=u2 (Ulysses 2," in _summary(parallel="u2").splitlines()[0]
    assert "parallel=r2u4 (Ulysses 4 x ring 2," in _summary(parallel="r2u4", recipe="fp8").splitlines()[0]


def test_runs_leaves_out_the_ulysses_levers_at_degree_1():
    plan = h3plan.resolve_config(parallel="u1")
    assert plan.decision("ulysses_exchange").setting == "packed"  # planned, and its row says there is no exchange
    runs = _label(cli.render_summary(plan), "runs")
    assert "ulysses_exchange" not in runs and "attention=fa4" in runs
    assert "ulysses_exchange=" in _label(_summary(parallel="u2"), "runs")
    assert all(not SPECS[x.split("=")[0]].ulysses for x in runs.split(", "))


def test_untested_lists_only_settings_that_run():
    plan = h3plan.resolve_config(hardware="sm90", recipe="fp8", parallel="u8")
    line = _label(cli.render_summary(plan), "untested")
    listed = [x.split("=")[0] for x in line.split(": never run")[0].split(", ")]
    off = [d.lever for d in plan.decisions if not d.hardware_verified and not d.enabled]
    assert listed and not set(listed) & set(off)
    assert all(plan.decision(x).enabled for x in listed)


def test_a_hardware_file_of_your_own_is_named_with_the_one_it_extends(tmp_path, capsys):
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "myhw.yaml").write_text("defaults:\n  - sm90\n  - _self_\nproducts: [H100]\ndevice:\n  "
                                                     "memory_gb: 80\n")
    assert cli.run([f"hydra.searchpath=[file://{tmp_path}]", "hardware=myhw"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(
        "h3plan  hardware=myhw (as sm90: H100, 80 GB)  recipe=bf16")
    plan = h3plan.resolve_config(**{"hydra.searchpath": [f"file://{tmp_path}"], "hardware": "myhw"})
    assert (plan.get("hardware")["option"], plan.get("hardware")["name"]) == ("myhw", "sm90")


@pytest.mark.parametrize("hydra", [False, True], ids=["direct", "hydra"])
def test_a_file_that_renames_what_it_inherits_credits_it_to_the_packaged_gpu(tmp_path, capsys, monkeypatch, hydra):
    """`name: myhw` over sm90's measured and verified facts: the plan names sm90 for them ("as sm90"), never "measured
    on myhw" or "verified ... on myhw"; a file carrying its own measurements or verification keeps its name."""
    from h3plan.planning import direct

    if hydra:  # the same through Hydra's composition (a command line direct.py leaves to it)
        monkeypatch.setattr(direct, "compose", lambda overrides: None)
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "myhw.yaml").write_text("defaults:\n  - sm90\n  - _self_\nname: myhw\n"
                                                     "device:\n  memory_gb: 80\n")
    argv = [f"hydra.searchpath=[file://{tmp_path}]", "hardware=myhw"]
    assert cli.run(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("h3plan  hardware=myhw (as sm90: H200, 80 GB)  recipe=bf16")
    assert "on myhw" not in out and "myhw:" not in out and "(measured on sm90)" in _label(out, "speed")
    assert _label(out, "verified").startswith("every setting here passed h3plan's GPU suite on sm90")
    assert cli.run(argv + ["detail=full"]) == 0 and "myhw" not in capsys.readouterr().out.replace("hardware=myhw", "")
    (tmp_path / "hardware" / "own.yaml").write_text("defaults:\n  - sm90\n  - _self_\nname: own\nverified:\n"
                                                    "  max_ulysses_degree: 1\n  source: our own GPU suite run\n")
    plan = h3plan.resolve_config(**{"hydra.searchpath": [f"file://{tmp_path}"], "hardware": "own"})
    assert plan.get("hardware")["name"] == "own"


@pytest.mark.parametrize("argv", [["hardware=myhw"], ["hardware=myhw", "recipe=fp8"]])
def test_a_missing_hardware_file_says_where_it_must_sit(argv, capsys):
    assert cli.run(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("hardware=myhw: no such option; available: sm100, sm103, sm107, sm90; a file of your own sits "
                         "in a folder on the search path: /path/to/conf/hardware/myhw.yaml with "
                         "hydra.searchpath=[file:///path/to/conf]")


@pytest.mark.parametrize("kw", [{}, {"recipe": "fp8", "parallel": "u8"},
                                {"hardware": "sm107", "recipe": "nvfp4", "parallel": "u8"},
                                {"recipe.vae": "fp16", "levers.attention": "sdpa"}, {"video": "fl2va_turbo_768x1344"}],
                         ids=["bf16", "fp8-u8", "sm107-nvfp4", "vae-fp16-forced", "turbo"])
def test_detail_full_is_a_superset_of_the_summary(kw):
    """detail=full starts with every line the summary prints above its lever table (speed, runs, lossless or lossy,
    verified or untested, forced, and the caveats in them), then every reason."""
    plan = h3plan.resolve_config(**kw)
    summary, full = cli.render_summary(plan), cli.render_table(plan)
    head = summary.split("\n\nlever ")[0]
    assert full.startswith(head + "\n\nlever ")
    for label in ("speed", "runs", "verified" if "\nverified " in summary else "untested"):
        assert _label(full, label) == _label(summary, label) != ""

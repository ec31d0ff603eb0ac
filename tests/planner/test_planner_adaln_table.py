"""adaln_table: the decision table (auto, forced, the tiny model), the numbers its plan line prints, the memory it
frees in the estimate, and the 80 GB fit (fits with the tables, refused without them naming the nearest option)."""

import pytest

from h3plan.planning import memory as M
from h3plan.errors import PlanningError
from h3plan.levers import adaln_table as L

GiB = 2**30
H3 = dict(hidden_size=5376, time_embed_dim=2688, num_layers=50)
PIPE = {"num_inference_steps": 50, "schedulers": {"video_shift": 12.0, "audio_shift": 3.0}, "keyframe_noise_aug": 0.999}

ROWS = [  # (overrides, setting, why)
    ([], "on", "table 0.88 GiB per GPU (49 timestep vectors, 97 rows x 51 linears) frees 23.41 GiB"),
    (["recipe=fp8"], "on", "misses expected for the request: 0 of 49 forwards"),
    (["parallel=u4"], "on", "wait in pinned host memory"),
    (["pipeline.num_inference_steps=30"], "on", "29 timestep vectors, 57 rows"),
    (["video.audio=false"], "on", "49 timestep vectors, 49 rows"),
    (["model=h3_tiny", "vae=h3_tiny_pipe"], "off", "would be no smaller than the 3 AdaLN linears it replaces"),
    (["levers.adaln_table=off"], "off", "forced by levers.adaln_table=off"),
    (["model=h3_tiny", "vae=h3_tiny_pipe", "levers.adaln_table=on"], "on", "forced by levers.adaln_table=on"),
]


@pytest.mark.parametrize("overrides,setting,why", ROWS, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_decision_table(plan, overrides, setting, why):
    d = plan(*overrides).decision("adaln_table")
    assert d.setting == setting and d.lossless
    assert any(why in r for r in d.reasons), d.reasons


def test_plan_params_are_what_install_reads(plan):
    d = plan().decision("adaln_table")
    assert d.param("steps") == [50] and d.param("video_shift") == 12.0 and d.param("audio_shift") == 3.0
    assert d.param("vectors") == 49 and d.param("rows") == 97 and d.param("expected_misses") == 0
    assert d.param("table_gib") == pytest.approx(0.876, abs=1e-3)
    assert d.param("frees_gib") == pytest.approx(23.41, abs=1e-2)
    from h3plan.install.builder import Builder

    b = Builder()
    L.install(b, d)
    assert b.values["adaln_table"] == {"steps": [50], "video_shift": 12.0, "audio_shift": 3.0,
                                       "keyframe_noise_aug": 0.999,
                                       "audio": True, "condition_video": False, "condition_audio": False}


def test_sizes_follow_the_model_dims():
    """51 linears: 50 x (2688 + 1) x 96,768 + (2688 + 1) x 10,752 = 13.04B parameters (24.29 GiB in bf16); a row of
    the table is 50 x 96,768 + 10,752 bf16 values."""
    p = L.table_plan(H3, PIPE)
    assert p["parameters"] == 50 * 2689 * 96768 + 2689 * 10752 and p["weight_bytes"] == 2 * p["parameters"]
    assert p["table_bytes"] == 97 * 2 * (50 * 96768 + 10752)
    assert p["linears"] == 51 and p["forwards"] == 49


@pytest.mark.parametrize("steps", [2, 3, 10, 50, 77, 200])
def test_planned_counts_match_diffusers(steps):
    pytest.importorskip("diffusers")
    from h3plan.install.adaln_table import timestep_vectors

    got = timestep_vectors([steps])
    p = L.table_plan(H3, {**PIPE, "num_inference_steps": steps})
    assert p["vectors"] == len(got) and p["rows"] == sum(v.numel() for v in got)


# ---- memory ------------------------------------------------------------------------------------------------


def test_estimate_moves_the_adaln_weights_off_the_device(compose):
    from h3plan.planning import schema
    from h3plan.planning.derive import shape

    s = schema.validate(compose())
    shp = shape(s)
    off = M.estimate(s, shp, {"adaln_table": "off"})
    on = M.estimate(s, shp, {"adaln_table": "on"})
    p = L.table_plan(s["model"], s["pipeline"])
    b_on, b_off = on["breakdown"], off["breakdown"]
    assert (b_off["transformer_weights"] - b_on["transformer_weights"]
            == pytest.approx(p["weight_bytes"] / GiB, abs=2e-3))
    assert b_on["adaln_tables"] == pytest.approx(p["table_bytes"] / GiB, abs=1e-3) and "adaln_tables" not in b_off
    assert "adaln_tables" in on["phases"]["denoise"]["items"] and "adaln_tables" in on["phases"]["decode"]["items"]
    assert off["peak_gib"] - on["peak_gib"] == pytest.approx((p["weight_bytes"] - p["table_bytes"]) / GiB, abs=2e-3)


def test_install_phase_of_a_host_loaded_pipeline(compose):
    """install(pipe, plan, device="cuda"): the resident weights + one staged AdaLN linear (the largest tensor staged),
    below the denoise peak; the pipeline as loaded on the GPU holds the AdaLN weights too."""
    from h3plan.planning import schema
    from h3plan.planning.derive import shape

    s = schema.validate(compose())
    shp = shape(s)
    on, off = M.estimate(s, shp, {"adaln_table": "on"}), M.estimate(s, shp, {"adaln_table": "off"})
    b, dc = on["breakdown"], s["model"]["diffusers_config"]
    one = 2 * L.MODULATION_OUT * dc["hidden_size"] * (dc["time_embed_dim"] + 1)
    assert b["install_staging"] == pytest.approx(one / GiB, abs=1e-3) and off["breakdown"]["install_staging"] == 0
    resident = [k for k in on["phases"]["install"]["items"] if k != "install_staging"]
    assert set(resident) == {"transformer_weights", "adaln_tables", "vae_weights", "audio_vae_weights"}
    assert on["install_gib"] == pytest.approx(sum(b[k] for k in resident) + b["install_staging"], abs=2e-3)
    assert on["install_gib"] < on["phases"]["denoise"]["gib"] and on["peak_phase"] == "denoise"
    # bf16: nothing parked off
    assert on["loaded_gib"] == off["loaded_gib"] == pytest.approx(off["install_gib"], abs=1.0)


def test_the_memory_line_names_the_peak_phase_items_and_the_install(plan):
    from h3plan import cli

    p = plan("hardware.device.memory_gb=80")
    items, br = p.derived_value("memory_peak_items"), p.derived_value("memory_breakdown_gib")
    assert p.derived_value("memory_peak_phase") == "denoise" and "video_postprocess" not in items
    line = " ".join(" ".join(cli._request_lines(p, 200)).split())
    top = sorted(items, key=lambda k: -br[k])[:3]
    assert f"its largest 3 of {len(items)} items: {', '.join(f'{k} {br[k]:.1f}' for k in top)} GiB" in line
    assert (f"on a pipeline loaded on the host peaks at {p.derived_value('memory_install_gib'):.1f} GiB" in line
            and "(does not fit: load it on the host) host " in line)


def test_released_model_fits_80_gb_with_the_tables(plan):
    p = plan("hardware.device.memory_gb=80")
    assert p.decision("adaln_table").setting == "on" and p.get("memory")["offload"] == "none"
    assert p.derived_value("memory_peak_gib_per_gpu") < 80e9 / GiB * 0.92
    assert p.derived_value("memory_peak_gib_tables_off") > 80e9 / GiB * 0.92
    fp8 = plan("hardware.device.memory_gb=80", "recipe=fp8")
    assert fp8.derived_value("memory_peak_gib_per_gpu") < p.derived_value("memory_peak_gib_per_gpu") - 10


def test_without_tables_80_gb_is_refused_naming_the_tables(plan):
    with pytest.raises(PlanningError) as e:
        plan("hardware.device.memory_gb=80", "levers.adaln_table=off")
    msg = str(e.value)
    assert "\n" not in msg and "nearest fit: levers.adaln_table=on (54.6 GiB)" in msg and "> 68.5 GiB usable" in msg


# (hardware GB, plan overrides, None = fits, or the nearest change that fits)
FIT = [
    (80, ["video=t2v_768x1344_14s"], None),                         # the 14 s preset on one 80 GB GPU, no offload
    (80, ["video=t2v_768x1344_14s", "levers.adaln_table=off"], "levers.adaln_table=on"),
    # tables on and still too big: the next option that fits
    (60, ["video=t2v_768x1344_14s"], "recipe=fp8"),
    (48, [], "recipe=fp8"),
    (48, ["parallel=u2"], "recipe=fp8"),
    (64, ["levers.adaln_table=off", "memory.offload=model"], "levers.adaln_table=on"),
    (40, ["recipe=fp8"], "parallel.ulysses=2"),  # tables on: 34.5 GiB > 34.3 usable (H200: 33.7 GiB at 3 steps' tables)
    (44, ["recipe=fp8"], None),
    (64, [], None),                                                  # VAE decode without offload on a 64 GB card
    # tables on: 54.6 GiB > 51.5 usable; the resident fp32 VAE keeps every Ulysses degree above
    (56, [], "memory.offload=model"),
]


@pytest.mark.parametrize("gb,overrides,nearest", FIT, ids=lambda x: " ".join(map(str, x))
                         if isinstance(x, list) else None)
def test_fit_decision_table(plan, gb, overrides, nearest):
    args = [f"hardware.device.memory_gb={gb}", *overrides]
    if nearest is None:
        assert plan(*args).derived_value("memory_peak_gib_per_gpu") <= gb * 1e9 / GiB * 0.92
        return
    with pytest.raises(PlanningError) as e:
        plan(*args)
    assert f"nearest fit: {nearest}" in str(e.value), str(e.value)


@pytest.mark.parametrize("u", ["u1", "u2", "u4", "u8"])
def test_the_plan_prints_the_per_gpu_peak_the_tables_give_at_each_degree(plan, u):
    p = plan(f"parallel={u}")
    on, off = p.derived_value("memory_peak_gib_per_gpu"), p.derived_value("memory_peak_gib_tables_off")
    assert off - on == pytest.approx(23.41, abs=0.05)
    from h3plan.cli import render_table

    text = render_table(p)
    assert "memory_peak_gib_tables_off" in text and "the tables free 23.4 GiB" in " ".join(text.split())


def test_memory_gib_override(plan):
    p = plan("hardware.device.memory_gib=80")
    assert p.get("hardware")["device"]["memory_gb"] == pytest.approx(85.899, abs=1e-3)
    assert p.derived_value("memory_peak_gib_per_gpu") < 80 * 0.92
    from h3plan.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^hardware.device.memory_gib=0.0: must be a positive number of GiB$"):
        plan("hardware.device.memory_gib=0")

"""Decision table of the ring lever (parallel.ring, h3plan/levers/ring.py) and the levers it constrains."""

import re

import pytest

from h3plan.errors import ConfigError, PlanningError
from h3plan.facts.ring_plan import NUMERICS, preset_degrees, ring_degree, ring_ulysses_cost, world_size


def test_no_ring_is_off_and_hardware_verified(plan):
    d = plan("hardware=sm90", "recipe=fp8", "parallel=u4").decision("ring")
    assert (d.setting, d.lossless, d.forced, d.hardware_verified) == ("off", True, False, True)
    assert d.reasons[0] == "parallel.ring=1: one ring block, no key/value rotation"


@pytest.mark.parametrize("preset, ring, U", [("u4", 2, 4), ("u1", 2, 1), ("u8", 4, 8), ("r2u4", None, 4)])
def test_ring_is_on_lossy_with_its_cost_and_numerics(plan, preset, ring, U):
    over = [f"parallel.ring={ring}"] if ring else []
    p = plan("hardware=sm90", "recipe=fp8", f"parallel={preset}", *over)
    R = ring or 2
    d = p.decision("ring")
    assert (d.setting, d.lossless, d.forced, d.hardware_verified) == ("on", False, False, False)
    assert d.reasons[0] == f"parallel.ring={R}: the sequence spans {R} ring blocks"
    text = "\n".join(d.reasons)
    tflops = float(re.search(r"block attention: fa4 ([0-9.]+) TFLOP/s measured", text).group(1))  # the stated basis
    c = ring_ulysses_cost(37820, ring=R, ulysses=U, attention_tflops=tflops, ring_gbps=50.0,
                          a2a_gbps={4: 235.0}.get(U, 450.0), hbm_tbps=4.8)
    assert d.param("cost")["ring_bytes"] == c.ring_bytes and d.param("cost")["a2a_bytes"] == c.a2a_bytes
    assert d.param("cost")["ring_exposed_ms_p2p"] == c.ring_exposed_ms_p2p and d.param("cost")["total_ms"] == c.total_ms
    assert f"sent {R - 1}x = {c.ring_bytes / 1e6:.1f} MB per rank" in text
    assert "ASSUMED 50 GB/s one way" in text and "never measured" in text
    assert ("235 GB/s leaving a rank, measured at degree 4" in text) == (U == 4)
    assert "numerics: " + NUMERICS in d.reasons
    assert "the installed ring plan at ring 2 x ulysses 1 (tests/gpu/test_install_ring_nccl.py" in text
    assert "not hardware-verified: on has never run on sm90" in text
    assert p.decision("attention").setting == "fa4"  # cudnn_fp8 gives no log-sum-exp
    assert "FP8 attention returns none here" in p.decision("attention").reasons[0]
    assert p.decision("compile").setting == "off" and p.decision("ulysses_padding").setting == "none"
    assert p.derived_value("local_rows") == -(-37820 // (R * U))


def test_a_measured_network_rate_replaces_the_assumption(plan):
    d = plan("hardware=sm90", "recipe=fp8", "parallel=u4", "parallel.ring=2",
             "hardware.device.nic_gbps=25.0").decision("ring")
    text = "\n".join(d.reasons)
    assert "hardware.device.nic_gbps 25 GB/s one way" in text and "ASSUMED" not in text
    assert d.param("cost")["ring_transfer_ms"] == ring_ulysses_cost(37820, ring=2, ulysses=4,
                                                                    ring_gbps=25.0).ring_transfer_ms


@pytest.mark.parametrize("overrides, message", [
    (("recipe=bf16",), "levers.ring=on cannot apply: recipe bf16 has policy lossless and the ring is lossy"),
    (("levers.ring=off",), "levers.ring=off cannot apply: parallel.ring=2 shards the sequence over 2 ring blocks"),
    (("levers.attention=cudnn_fp8",), "levers.attention=cudnn_fp8 cannot apply: parallel.ring=2: the ring merges key "
                                      "blocks through their log-sum-exp"),
    (("levers.compile=regional",), "parallel.ring=2: the ring's P2P rotation is not traceable"),
    (("levers.ulysses_padding=fixed_valid", "parallel.seq_len=37822"),
     "levers.ulysses_padding=fixed_valid cannot apply: "
     "parallel.ring=2: the ring skips padding keys"),
    (("levers.fa4_tile=tuned",), "levers.fa4_tile=tuned cannot apply: parallel.ring=2: the ring's FA4 block call "
                                 "(h3plan/runtime/parallel/lse.py) takes no tile"),
])
def test_refusals_are_one_line_planning_errors(plan, overrides, message):
    with pytest.raises(PlanningError) as e:
        plan("hardware=sm90", "recipe=fp8", "parallel=u4", "parallel.ring=2", *overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_forcing_ring_without_a_ring_fails(plan):
    with pytest.raises(PlanningError, match=r"levers.ring=on cannot apply: parallel.ring=1: one ring block"):
        plan("hardware=sm90", "recipe=bf16", "parallel=u4", "levers.ring=on")


@pytest.mark.parametrize("overrides, message", [
    (("parallel.ring=0",), "parallel.ring=0: must be an integer >= 1 (1 = no ring)"),
    (("parallel.ring=2", "parallel.seq_len=7"), "parallel.seq_len=7: must be at least ring 2 x ulysses 4 = 8"),
    (("parallel.ulysses=3", "parallel.ring=2"), "parallel.ulysses=3: the Ulysses degree must divide the 56"),
])
def test_bad_parallel_values_are_one_line_config_errors(plan, overrides, message):
    with pytest.raises(ConfigError) as e:
        plan("hardware=sm90", "recipe=fp8", "parallel=u4", *overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("hw", ["sm103", "sm107"])
def test_levers_yield_to_the_ring(plan, hw):
    """Where FA4 2-CTA is auto's pick (sm103, sm107), a ring plan keeps FA4's default CTA mode instead of refusing
    itself; forcing 2-CTA is refused naming parallel.ring."""
    assert plan(f"hardware={hw}", "recipe=fp8", "parallel=u4",
                "levers.attention=fa4").decision("fa4_2cta").setting == "on"
    p = plan(f"hardware={hw}", "recipe=fp8", "parallel=r2u4")
    d = p.decision("fa4_2cta")
    assert (p.decision("attention").setting, d.setting, p.decision("ring").setting) == ("fa4", "off", "on")
    assert d.reasons[0].startswith("parallel.ring=2: the ring's FA4 block call (h3plan/runtime/parallel/lse.py) takes "
                                   "no 2-CTA switch")
    with pytest.raises(PlanningError, match=r"^levers.fa4_2cta=on cannot apply: parallel.ring=2: the ring's FA4 block "
                                            r"call"):
        plan(f"hardware={hw}", "recipe=fp8", "parallel=r2u4", "levers.fa4_2cta=on")


@pytest.mark.parametrize("parallel, ring, world", [({"ulysses": 4}, 1, 4), ({"ring": 2, "ulysses": 4}, 2, 8),
                                                   ({"ring": None, "ulysses": 2}, 1, 2), ({}, 1, 1)])
def test_the_mesh_degrees_of_a_parallel_section(parallel, ring, world):
    assert (ring_degree(parallel), world_size(parallel)) == (ring, world)


@pytest.mark.parametrize("name, degrees", [("u8", {"ring": 1, "ulysses": 8}), ("r2u4", {"ring": 2, "ulysses": 4}),
                                           ("mine", None), ("r2", None)])
def test_a_preset_name_gives_its_degrees(name, degrees):
    assert preset_degrees(name) == degrees

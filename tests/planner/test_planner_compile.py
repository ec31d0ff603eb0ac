"""The compile lever: decided from hardware.measured.compile (every run faster, the nearest length within 2x),
off for lossless recipes, off and refused at Ulysses degree > 1."""
import pytest

from h3plan import H3PlanError
from h3plan.levers.base import LeverError


@pytest.mark.parametrize("overrides, setting, says", [
    # the H200's three runs (conf/hardware/sm90.yaml): not faster in every run at either length
    (["recipe=fp8", "parallel.seq_len=19000"], "off", "not faster in every run: 1.032x, 0.998x at 19,000 tokens"),
    (["recipe=fp8", "parallel.seq_len=37820"], "off", "not faster in every run: 0.986x, 1.012x"),
    (["recipe=fp8", "model=h3_tiny", "parallel.seq_len=48"], "off",
     "never measured on sm90 for recipe fp8 within 2x of 48"),
    (["recipe=fp8", "parallel=u2", "parallel.seq_len=19000"], "off", "Ulysses degree 2: dynamo cannot trace"),
    (["recipe=bf16", "parallel.seq_len=37820"], "off", "lossless"),
    (["recipe=fp8", "parallel.seq_len=19000", "hardware=sm100"], "off", "never measured on sm100"),
])
def test_decision_table(plan, overrides, setting, says):
    d = plan("hardware=sm90", "parallel=u1", *overrides).decision("compile")
    assert d.setting == setting and says in " ".join(d.reasons), d.reasons


@pytest.mark.parametrize("seq_len", [19000, 26000])  # 26,000 is 1.37x away from the measured 19,000
def test_regional_where_every_run_was_faster(seq_len):
    from h3plan.planning.config import compose
    from h3plan.planner import resolve

    faster = "hardware.measured.compile=[{recipe:fp8,seq_len:19000,speedups:[1.032],source:test}]"
    d = resolve(compose(["hardware=sm90", "parallel=u1", "recipe=fp8",
                         f"parallel.seq_len={seq_len}", faster])).decision("compile")
    assert d.setting == "regional" and "faster in every run: 1.032x at 19,000 tokens" in " ".join(d.reasons), d.reasons


def test_regional_at_degree_2_is_refused_in_one_line(plan):
    with pytest.raises((LeverError, H3PlanError), match="levers.compile=regional cannot apply: Ulysses degree 2"):
        plan("hardware=sm90", "recipe=fp8", "parallel=u2", "levers.compile=regional")

"""The compile lever: decided from hardware.measured.compile (every run faster, the nearest length within 2x),
off for lossless recipes, off and refused at Ulysses degree > 1."""
import pytest

from h3plan import H3PlanError
from h3plan.levers.base import LeverError


@pytest.mark.parametrize("overrides, setting, says", [
    (["recipe=fp8", "parallel.seq_len=19000"], "regional", "1.032x at 19,000 tokens"),
    (["recipe=fp8", "parallel.seq_len=26000"], "regional", "1.032x at 19,000 tokens"),  # 1.37x away from 19,000
    (["recipe=fp8", "parallel.seq_len=37820"], "off", "not faster in every run: 0.986x"),
    (["recipe=fp8", "model=h3_tiny", "parallel.seq_len=48"], "off", "never measured on sm90 for recipe fp8 within 2x of 48"),
    (["recipe=fp8", "parallel=u2", "parallel.seq_len=19000"], "off", "Ulysses degree 2: dynamo cannot trace"),
    (["recipe=bf16", "parallel.seq_len=37820"], "off", "lossless"),
    (["recipe=fp8", "parallel.seq_len=19000", "hardware=sm100"], "off", "never measured on sm100"),
])
def test_decision_table(plan, overrides, setting, says):
    d = plan("hardware=sm90", "parallel=u1", *overrides).decision("compile")
    assert d.setting == setting and says in " ".join(d.reasons), d.reasons


def test_regional_at_degree_2_is_refused_in_one_line(plan):
    with pytest.raises((LeverError, H3PlanError), match="levers.compile=regional cannot apply: Ulysses degree 2"):
        plan("hardware=sm90", "recipe=fp8", "parallel=u2", "levers.compile=regional")

"""bench.pipeline.stock_bits: the pipeline bench's row for the stock-bits plan (the lossless plan with diffusers'
default attention), compared with diffusers eager itself rather than through a reference row of its own."""

import pytest

from h3plan.actions.bench.pipeline import extra_plans, options, row_specs
from h3plan.errors import UsageError
from h3plan.planner import resolve
from h3plan.planning.config import compose


def _cfg(*overrides):
    c = compose(["action=bench", "bench.target=pipeline", *overrides])
    return c, resolve(c)


def test_stock_bits_adds_the_sdpa_plan_without_a_reference_row():
    c, plan = _cfg("recipe=bf16", "bench.pipeline.stock_bits=true", "levers.vae_graphs=off")
    o = options(c, plan)
    assert o.stock_bits
    (stock,) = extra_plans(c, o)
    assert stock.decision("attention").setting == "sdpa" and stock.lossless
    assert stock.decision("vae_graphs").setting == "off"  # the run's forced levers kept
    assert plan.decision("attention").setting == "fa4"
    specs = row_specs([plan, stock], o, 1)
    assert [(k, p is stock) for k, _, p in specs if p is not None] == [
        ("reference", False), ("plan", False), ("plan", True)]


def test_stock_bits_is_off_by_default_and_refused_for_a_lossy_recipe():
    c, plan = _cfg("recipe=bf16")
    assert extra_plans(c, options(c, plan)) == []
    c, plan = _cfg("recipe=fp8", "bench.pipeline.stock_bits=true")
    with pytest.raises(UsageError, match=r"^bench.pipeline.stock_bits=true: recipe fp8 is lossy"):
        extra_plans(c, options(c, plan))

"""first_block under Ulysses (2 gloo ranks, different local data): the statistic is reduced across the ranks, so every
rank takes the same skip decision, the one the whole sequence gives; alone, the two ranks would disagree."""

import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_ranks_agree_on_the_reduced_statistic(tmp_path):
    import step_cache_worker as W
    from gloo_spawn import spawn

    spawn(W.worker, 2, str(tmp_path), timeout_s=240)
    r = [json.load(open(os.path.join(tmp_path, f"rank{i}.json"))) for i in range(2)]
    threshold = 0.3
    assert (r[0]["local"] < threshold) != (r[1]["local"] < threshold)  # alone they would disagree
    assert r[0]["reduced"] == r[1]["reduced"]
    assert abs(r[0]["reduced"] - r[0]["global"]) <= 1e-6 * r[0]["global"]  # fp32 sums, two summation orders
    assert r[0]["skip"] == r[1]["skip"] == (r[0]["global"] < threshold)

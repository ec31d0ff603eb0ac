"""The pipeline bench's row bookkeeping (h3plan/actions/bench/pipeline.py), without a pipeline: a step-cache row's notes
(a check for the fixed schedules, a report for first_block), the frames' comparison when the device has no room left,
and a row that starts with memory an earlier row left."""

import pytest
import torch

from h3plan.actions.bench import pipeline as P


def _full(mode, e2e, computed=20, forwards=49, skipped_s=2.6):
    return {"e2e_s": e2e, "forwards": forwards, "computed": computed, "skipped": forwards - computed,
            "skipped_s": skipped_s, "mode": mode}


def test_a_fixed_schedule_is_checked_against_its_overhead_bound():
    ok = P.step_cache_notes(_full("fixed", 186.6, computed=34), 5.365, 4.24)
    assert ok[0].startswith("step_cache: the whole call, 34 of 49 forwards computed") and "reused or extrapolated" in ok[0]
    assert ok[1].startswith("overhead check: E2E 186.60 s <= 1.03 x (34 x 5.365 s + rest 4.24 s)") and ok[1].endswith("PASS")
    over = P.step_cache_notes(_full("fixed", 200.0, computed=34), 5.365, 4.24)
    assert over[1].endswith("FAIL") and "> 1.03" in over[1]


def test_first_block_reports_its_overhead_without_a_verdict():
    """Every skipped forward of an adaptive cache runs the first block and the decision: its overhead is reported
    against computed forwards + rest (session 16's row: 86.50 s = 1.031 x 83.86 s), never PASS / FAIL at the fixed
    schedules' 1.03."""
    notes = P.step_cache_notes(_full("first_block", 86.5), 4.051, 2.85)
    assert "each ran the first block and the decision" in notes[0] and "took 2.600 s" in notes[0]
    assert notes[1] == "overhead (first_block, reported): E2E 86.50 s = 1.031 x (20 x 4.051 s + rest 2.85 s) = 83.87 s"
    assert not any("PASS" in n or "FAIL" in n for n in notes)
    assert len(P.step_cache_notes(_full("first_block", 86.5), None, 2.85)) == 1  # no forward measured: no ratio


def test_frames_are_compared_on_the_host_when_the_device_has_no_room(monkeypatch):
    a = torch.rand(2, 3, 8, 8)
    real, seen = P._compared, []

    def full_device(torch_, x, y):
        seen.append(x.device.type)
        if len(seen) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.43 GiB")
        return real(torch_, x, y)

    monkeypatch.setattr(P, "_compared", full_device)
    out = P._compare(torch, torch.device("cpu"), a, a.clone())
    assert len(seen) == 2 and out["bitwise"] is True and out["note"] == "compared on the host (no device memory left)"


@pytest.mark.parametrize("left, noted", [(0.0, False), (1.4, True)])
def test_a_row_that_starts_with_memory_left_by_another_says_so(monkeypatch, left, noted):
    """_Session.settle records what an earlier row still holds after gc (the fl2va reference row of
    session 16 ran out of memory with about 1.4 GiB more than the eager row had); the record names it."""
    s = P._Session.__new__(P._Session)
    s.torch, s.device, s.resting, s.tensors = torch, torch.device("cuda"), None, None
    allocated = iter([10 * 2**30, (10 + left) * 2**30])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: next(allocated))
    first, second = P._Row(P.Setting(), [], []), P._Row(P.Setting(), [], [])
    s.settle(first)
    s.settle(second)
    assert first.left_gib is None and (second.left_gib == pytest.approx(left) if noted else second.left_gib is None)
    assert second.left_what == ("none that Python reaches" if noted else "")  # this machine's tensors are no CUDA's


def test_what_an_earlier_row_left_is_named_by_its_tensors_beyond_the_first_rows():
    """A weight put back in new memory (an uninstall) counts as the one it replaced; what is left over is named,
    largest first."""
    from collections import Counter

    w, frames = (2**26, (4096, 8192), "bfloat16"), (1535115264, (1, 124, 3, 768, 1344), "float32")
    before = Counter([w, w])
    assert P.extra_tensors(Counter([w, w]), before) == "none that Python reaches"
    assert P.extra_tensors(Counter([w, w, frames, w]), before) == \
        "[1, 124, 3, 768, 1344] float32 1464 MiB, [4096, 8192] bfloat16 64 MiB"

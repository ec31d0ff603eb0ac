"""H200: the one timer (h3plan/actions/bench/timing.py) on CUDA events.

Contracts: a GPU spin of twice the cycles measures twice the time (events bracket the GPU's work, back to back or
synced); a lead spin ahead of a short call leaves the call's own time, not the host's launch; synced timing of a
tiny kernel includes the host round trip, so it is never below the back-to-back time; `Clock.timed` returns the
call's result; a ForwardTimer on a module times each forward.

    python -m pytest tests/gpu/test_timing_gpu.py -m gpu -q -s
"""

import pytest
import torch

from h3plan.actions.bench import Clock, ForwardTimer, interleaved, median_ms

pytestmark = pytest.mark.gpu
CYCLES = 2_000_000  # about 1 ms at the H200's ~2 GHz


def _spin(n: int):
    return lambda: torch.cuda._sleep(n)


def test_twice_the_spin_measures_twice_the_time():
    one, two = median_ms(_spin(CYCLES), 2, 9), median_ms(_spin(2 * CYCLES), 2, 9)
    s1, s2 = median_ms(_spin(CYCLES), 2, 9, synced=True), median_ms(_spin(2 * CYCLES), 2, 9, synced=True)
    print(f"\n[gpu] spin x1 {one:.3f} ms, x2 {two:.3f} ms; synced {s1:.3f}, {s2:.3f} ms")
    assert 0.2 < one < 5.0  # a clock between 0.4 and 10 GHz: the events measure the spin, not nothing
    assert two / one == pytest.approx(2.0, rel=0.1) and s2 / s1 == pytest.approx(2.0, rel=0.1)


def test_lead_spin_hides_the_launch_and_synced_includes_it():
    x = torch.ones(1024, device="cuda")
    plain = median_ms(lambda: x.add_(1), 3, 21)
    lead = median_ms(lambda: x.add_(1), 3, 21, lead_us=200)
    synced = median_ms(lambda: x.add_(1), 3, 21, synced=True)
    print(f"\n[gpu] tiny add: back to back {plain * 1e3:.1f} us, with a lead spin {lead * 1e3:.1f} us, "
          f"synced {synced * 1e3:.1f} us")
    assert lead <= plain * 1.05 + 1e-3 and synced >= lead


def test_clock_timed_returns_the_result_and_interleaved_runs_before():
    clock, order = Clock(), []
    ms, out = clock.timed(lambda: torch.arange(4, device="cuda") * 2)
    assert ms >= 0 and out.tolist() == [0, 2, 4, 6]
    times = interleaved(clock, {"a": _spin(CYCLES // 4), "b": _spin(CYCLES // 2)}, 1, 4,
                        before=lambda: order.append("|"))
    assert len(order) == 8 and {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4}
    assert sorted(times["b"])[2] > sorted(times["a"])[2]


def test_forward_timer_times_each_forward():
    lin = torch.nn.Linear(4096, 4096, device="cuda")
    x = torch.randn(8192, 4096, device="cuda")
    t = ForwardTimer(torch, True)
    handles = [lin.register_forward_pre_hook(t.pre), lin.register_forward_hook(t.post)]
    t.on = True
    with torch.no_grad():
        for _ in range(3):
            lin(x)
    for h in handles:
        h.remove()
    secs = t.seconds()
    print(f"\n[gpu] 8192x4096x4096 fp32 linear: {[round(s * 1e3, 3) for s in secs]} ms")
    assert len(secs) == 3 and all(s > 0 for s in secs)

"""The bench action's timing plumbing on the CPU: interleaving, the backend timer, progress, inputs capture."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from h3plan.actions import bench
from h3plan.runtime.attention.sdpa import SDPABackend


class FakeClock:
    kind = "fake"

    def __init__(self):
        self.calls = []

    def sync(self):
        self.calls.append("sync")

    def __call__(self, fn):
        fn()
        return float(len(self.calls))


def test_interleaved_alternates_the_order_and_counts_warmup_apart():
    order = []
    clock = FakeClock()
    times = bench.interleaved(clock, {"eager": lambda: order.append("e"), "plan": lambda: order.append("p")}, 2, 4)
    assert order == ["e", "p", "e", "p"] + ["e", "p", "p", "e", "e", "p", "p", "e"]
    assert {k: len(v) for k, v in times.items()} == {"eager": 4, "plan": 4}
    assert bench.median([3.0, 1.0, 2.0]) == 2.0 and bench.median([]) is None


def test_back_to_back_counts_calls_and_progress(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    calls = []
    p = bench.Progress(5, "b2b")
    ts = bench.back_to_back(bench.Clock(torch, torch.device("cpu")), lambda: calls.append(1), 2, 3, p, "x")
    assert len(calls) == 5 and len(ts) == 3 and all(t >= 0 for t in ts) and p.n == 5


def test_back_to_back_runs_before_ahead_of_each_timed_call_only():
    calls = []
    ts = bench.back_to_back(bench.Clock(torch, torch.device("cpu")), lambda: calls.append("c"), 1, 3,
                            before=lambda: calls.append("b"))
    assert len(ts) == 3 and calls == ["c", "b", "c", "b", "c", "b", "c"]  # warmup alone, then before + call


def test_host_clock_times_in_ms():
    clock = bench.Clock(torch, torch.device("cpu"))
    assert clock.kind == "host-clock"
    import time

    assert 15.0 <= clock(lambda: time.sleep(0.02)) < 500.0


class ListClock(FakeClock):
    """A host clock (cuda False) that reads the next of `values` per timed call."""

    cuda = False

    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def __call__(self, fn):
        fn()
        return self.values.pop(0)


def test_interleaved_runs_before_ahead_of_every_timed_call_only():
    calls = []
    bench.interleaved(FakeClock(), {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 1, 2,
                      before=lambda: calls.append("|"))
    assert calls == ["a", "b", "|", "a", "|", "b", "|", "b", "|", "a"]


def test_median_ms_is_the_median_of_the_clock_back_to_back_or_synced():
    calls = []
    assert bench.median_ms(lambda: calls.append(1), 2, 3, clock=ListClock([5.0, 1.0, 3.0])) == 3.0
    assert len(calls) == 5
    assert bench.median_ms(lambda: calls.append(1), 1, 4, clock=ListClock([4.0, 1.0, 2.0, 9.0]), synced=True) == 3.0
    assert len(calls) == 10


def test_clock_timed_returns_the_time_and_the_result():
    ms, out = bench.Clock(torch, torch.device("cpu")).timed(lambda: "frames")
    assert out == "frames" and ms >= 0.0


def test_backend_timer_keeps_isinstance_captures_clones_and_detaches():
    backend = SDPABackend()
    timer = bench.BackendTimer(torch, cuda=False)
    timer.attach(backend)
    assert isinstance(backend, SDPABackend) and type(backend) is not SDPABackend
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    timer.capture = True
    out = backend(q, k, v)
    q.add_(1.0)  # the capture is a clone: later writes to q do not reach it
    backend(q, k, v)
    assert len(timer.drain_ms()) == 2 and timer.drain_ms() == []
    b, args, kwargs = timer.captured
    assert b is backend and kwargs == {} and torch.equal(args[0] + 1.0, q)
    plain = timer.original(backend)
    torch.testing.assert_close(plain(*args), out, rtol=0, atol=0)
    assert timer.events == []  # the original call is not timed
    timer.detach()
    assert type(backend) is SDPABackend


def test_progress_without_tqdm_prints_lines(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    p = bench.Progress(3, "bench x")
    p.step("a")
    p.step("b", 2)
    p.write("note")
    p.close()
    out = capsys.readouterr().out
    assert "bench x: 3 steps" in out and "[1/3] a" in out and "[3/3] b" in out and "note" in out


def test_steps_match_the_progress_updates_of_a_run():
    # per S: attention (w + i); per block count: correctness 1 + stack (w + i) + standalone (w + i)
    # + standalone after a plan forward (i) + diffusers' best first call (1, bench.best only)
    o = bench.BenchOptions((19000, 37820), (1, 4), 3, 10, "x", None, best=False)
    from h3plan.actions.bench.measure import _steps

    assert _steps(o) == 2 * (13 + 2 * (1 + 26 + 10))
    assert _steps(dataclasses.replace(o, best=True)) == 2 * (13 + 2 * (1 + 1 + 26 + 10))


@pytest.fixture(scope="module")
def tiny():
    from omegaconf import OmegaConf

    from h3plan.actions.inputs import build_model, packed_inputs

    dc = OmegaConf.to_container(OmegaConf.load("conf/model/h3_tiny.yaml").diffusers_config)
    return build_model(dc, blocks=2, seed=0), packed_inputs(dc, 40, seed=0)


def test_captured_block_inputs_reproduce_the_model_exactly(tiny):
    """rtol=0, atol=0: the stack on the captured inputs is the model's own block loop, op for op."""
    model, inputs = tiny
    h, temb, idx, rope = bench.capture_block_inputs(torch, model, inputs)
    assert h.shape == (1, 40, 96) and h.dtype == torch.bfloat16 and temb.dtype == torch.float32 and idx.shape == (40,)
    seen = {}

    def keep(module, args):
        seen["h"] = args[0].clone()

    handle = model.norm_out.register_forward_pre_hook(keep)
    with torch.no_grad():
        model(**inputs)
        mine = bench.run_stack(model.transformer_blocks, h, temb, idx, rope)
    handle.remove()
    torch.testing.assert_close(mine, seen["h"], rtol=0, atol=0)
    assert not model.transformer_blocks[0]._forward_pre_hooks  # the capture hook is gone


def test_rel_error():
    ref = torch.tensor([3.0, 4.0])
    rel, mx = bench.rel_error(torch, torch.tensor([3.0, 4.5]), ref)
    assert rel == pytest.approx(0.1) and mx == pytest.approx(0.5)


class FakeEvent:
    """Stands in for torch.cuda.Event: record() reads the host clock, elapsed_time() is in ms."""

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, other):
        assert self.t is not None and other.t is not None, "elapsed_time on an event never recorded"
        return (other.t - self.t) * 1e3


def _fake_cuda_torch():
    import types

    syncs = []
    cuda = types.SimpleNamespace(Event=FakeEvent, synchronize=lambda: syncs.append(1))
    return types.SimpleNamespace(cuda=cuda, Tensor=torch.Tensor), syncs


def test_cuda_code_paths_with_fake_events():
    """The event-based branches (GPU only in real use) run with a fake torch.cuda: same plumbing, host times."""
    fake, syncs = _fake_cuda_torch()
    clock = bench.Clock(fake, type("Dev", (), {"type": "cuda"})())
    assert clock.kind == "cuda-events" and clock.cuda
    calls = []
    times = bench.interleaved(clock, {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 1, 3)
    assert len(times["a"]) == 3 and len(syncs) == 1 + 6  # one per warmup round, one per timed call
    ts = bench.back_to_back(clock, lambda: calls.append("c"), 2, 4)
    assert len(ts) == 4 and len(syncs) == 7 + 2  # after the warmup, after the timed calls
    calls.clear()
    ts = bench.back_to_back(clock, lambda: calls.append("c"), 0, 2, before=lambda: calls.append("b"))
    assert len(ts) == 2 and calls == ["b", "c", "b", "c"] and len(syncs) == 9 + 2
    timer = bench.BackendTimer(fake, cuda=True)
    backend = SDPABackend()
    timer.attach(backend)
    q = torch.randn(1, 4, 2, 8)
    backend(q, q, q)
    backend(q, q, q)
    ms = timer.drain_ms()
    assert len(ms) == 2 and all(m >= 0 for m in ms)
    timer.detach()


def test_profile_summary_groups_the_gpu_kernels_by_category_and_finds_the_gaps():
    import types

    from torch.autograd import DeviceType

    def ev(name, start, end, dev=DeviceType.CUDA):
        span = types.SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
        return types.SimpleNamespace(name=name, device_type=dev, time_range=span)

    events = [ev("gemm_sm90", 0, 1000), ev("nccl:all_to_all", 1000, 3000), ev("flash_fwd", 1500, 2500),
              ev("cpu_op", 0, 5000, DeviceType.CPU), ev("memset", 2600, 2700)]
    prof = types.SimpleNamespace(events=lambda: events)
    table = (("gemm", ("gemm",)), ("attention", ("FLASH",)))
    s = bench.profile_summary(prof, table)
    assert s["ops"] == 3 and s["by_category_ms"] == {"gemm": 1.0, "attention": 1.0, "other": 0.1}
    assert s["span_ms"] == 2.7 and s["idle_ms"] == pytest.approx(0.6)  # gaps 1000 -> 1500 and 2500 -> 2600 us
    assert [e.name for e in bench.kernel_events(prof, skip=("memset", "nccl:"))] == ["gemm_sm90", "flash_fwd"]
    assert bench.category("relu_kernel", table, "elementwise") == "elementwise"

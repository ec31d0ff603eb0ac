"""In Triton's interpreter the row-wise kernels take INTERPRET_ROWS rows a program (`_common.interpreter_tile`), not
their GPU tile: the interpreter's cost is per program and per op, so the GPU's one-token tile made the CPU pipeline
smoke take over 15 minutes. The count must change no bit: each kernel here runs once with the GPU's tile (the
module's `interpreter_tile` made the identity) and once with the interpreter's, on a row count that leaves a partial
last program under both, and the outputs are bitwise equal (and equal to the reference where the kernel is exact)."""

import pytest
import torch

from h3plan.runtime.kernels import _common, gated_residual, modulation, qk_fp8_lean, qk_norm_rope, swiglu

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ROWS = 70  # > INTERPRET_ROWS, not a multiple of it nor of any GPU tile: a partial last program either way


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8) if t.element_size() == 1 else t


def both(module, monkeypatch, fn):
    """fn() with the interpreter's tile, then with the GPU's tile (the module's interpreter_tile the identity)."""
    assert _common.INTERPRET, "tests run in Triton's interpreter (conftest sets TRITON_INTERPRET=1)"
    wide = fn()
    with monkeypatch.context() as m:
        m.setattr(module, "interpreter_tile", lambda rows: int(rows))
        gpu = fn()
    return wide, gpu


def test_the_interpreter_takes_wide_programs(monkeypatch):
    assert _common.interpreter_tile(1) == _common.INTERPRET_ROWS
    assert _common.interpreter_tile(2 * _common.INTERPRET_ROWS) == 2 * _common.INTERPRET_ROWS
    assert modulation._config(96)[0] >= _common.INTERPRET_ROWS
    assert swiglu._config(128)[0] >= _common.INTERPRET_ROWS
    assert gated_residual._config(96)[0] >= _common.INTERPRET_ROWS
    for module in (modulation, swiglu, gated_residual):  # `both`'s second arm: the GPU's tile
        monkeypatch.setattr(module, "interpreter_tile", lambda rows: int(rows))
    assert (modulation._config(96)[0], swiglu._config(128)[0], gated_residual._config(96)[0]) == (2, 16, 16)


def _qk_inputs(S=ROWS, H=3, D=64, R=32):
    g = torch.Generator().manual_seed(1)
    q, k, v = ((torch.randn(1, S, H * D, generator=g) * 3).bfloat16() for _ in range(3))
    wq, wk = (torch.randn(D, generator=g).bfloat16() for _ in range(2))
    ang = torch.randn(S, R, generator=g)
    return q, k, v, wq, wk, ang.cos(), ang.sin()


def test_qk_norm_rope(monkeypatch):
    q, k, v, wq, wk, cos, sin = _qk_inputs()
    wide, gpu = both(qk_norm_rope, monkeypatch, lambda: qk_norm_rope.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, v=v))
    ref = qk_norm_rope.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-6, v=v)
    for a, b, r in zip(wide, gpu, ref):
        assert torch.equal(bits(a), bits(b))
        assert torch.equal(bits(a), bits(r.contiguous()))


def test_qk_norm_rope_fp8_lean(monkeypatch):
    q, k, v, wq, wk, cos, sin = _qk_inputs()
    wide, gpu = both(qk_fp8_lean, monkeypatch,
                     lambda: qk_fp8_lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-6))
    flat = [t for t in wide if isinstance(t, torch.Tensor)]
    assert flat and any(t.dtype == torch.float8_e4m3fn and t.float().abs().sum() > 0 for t in flat)
    for a, b in zip(wide, gpu):
        if isinstance(a, torch.Tensor):
            assert torch.equal(bits(a), bits(b))


def test_rmsnorm_modulate(monkeypatch):
    g = torch.Generator().manual_seed(2)
    D = 96
    x = (torch.randn(1, ROWS, D, generator=g) * 2).bfloat16()
    w = torch.randn(D, generator=g).bfloat16()
    scale, shift = (torch.randn(4, D, generator=g).bfloat16() for _ in range(2))
    index = torch.randint(0, 4, (ROWS,), generator=g)
    wide, gpu = both(modulation, monkeypatch, lambda: modulation.rmsnorm_modulate(x, w, scale, shift, index))
    assert torch.equal(bits(wide), bits(gpu))
    assert torch.equal(bits(wide), bits(modulation.rmsnorm_modulate_ref(x, w, scale, shift, index)))


def test_gated_residual(monkeypatch):
    g = torch.Generator().manual_seed(3)
    D = 96
    h, y = ((torch.randn(1, ROWS, D, generator=g) * 4).bfloat16() for _ in range(2))
    gate = torch.randn(5, D, generator=g).bfloat16()
    index = torch.randint(0, 5, (ROWS,), generator=g)
    wide, gpu = both(gated_residual, monkeypatch, lambda: gated_residual.gated_residual(h, gate, index, y))
    assert torch.equal(bits(wide), bits(gpu))
    assert torch.equal(bits(wide), bits(gated_residual.gated_residual_ref(h, gate, index, y)))


def test_swiglu(monkeypatch):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(1, ROWS, 2 * 128, generator=g) * 2).bfloat16()
    wide, gpu = both(swiglu, monkeypatch, lambda: swiglu.swiglu(x))
    assert torch.equal(bits(wide), bits(gpu))
    assert wide.float().abs().sum() > 0

"""The cuDNN backends' plumbing on the CPU, against a stand-in cudnn-frontend.

The stand-in keeps the pygraph calls anchors/probe2.py made on the H200 (tensor, sdpa, sdpa_fp8,
set_output/set_dim/set_stride/set_data_type, validate ... build_plans, execute(pack, workspace, handle)),
checks every bound buffer against its declared dims and strides, and computes the attention in fp32 into
the bound output. This proves the graph cache, the (B, S, H, D) -> (B, H, S, D) stride declarations, the
prefix-in-place write and the FP8 scale bookkeeping; the real kernels run in tests/gpu/test_install_gpu.py.
"""

import math
import sys
import types

import pytest
import torch

import h3plan.runtime.attention.cudnn as cd
from h3plan.runtime.attention import get_backend

E4M3 = torch.float8_e4m3fn


class _T:
    def __init__(self, dim=None, stride=None, data_type=None):
        self.dim, self.stride, self.data_type, self.output = dim, stride, data_type, False

    def set_output(self, v):
        self.output = v
        return self

    def set_dim(self, d):
        self.dim = list(d)
        return self

    def set_stride(self, s):
        self.stride = list(s)
        return self

    def set_data_type(self, t):
        self.data_type = t
        return self


class _Graph:
    built = []

    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None, handle=None):
        self.io, self.steps, self.tensors = io_data_type, [], []
        _Graph.built.append(self)

    def tensor(self, dim, stride, data_type):
        t = _T(list(dim), list(stride), data_type)
        self.tensors.append(t)
        return t

    def sdpa(self, q, k, v, is_inference, attn_scale):
        assert is_inference is True
        self.op = dict(kind="sdpa", q=q, k=k, v=v, scale=attn_scale, o=_T())
        return self.op["o"], None

    def sdpa_fp8(self, q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, is_inference, attn_scale):
        self.op = dict(kind="fp8", q=q, k=k, v=v, dq=descale_q, dk=descale_k, dv=descale_v, ds=descale_s,
                       ss=scale_s, so=scale_o, scale=attn_scale, o=_T(), amax_s=_T(), amax_o=_T())
        return self.op["o"], None, self.op["amax_s"], self.op["amax_o"]

    def __getattr__(self, name):
        if name in ("validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans"):
            return lambda *a: self.steps.append(name)
        raise AttributeError(name)

    def get_workspace_size(self):
        return 64

    def execute(self, pack, ws, handle=None):
        assert self.steps == ["validate", "build_operation_graph", "create_execution_plans", "check_support",
                              "build_plans"] and handle == "handle"
        for t, buf in pack.items():
            assert (list(buf.shape) == t.dim
                    and list(buf.stride()) == t.stride), (t.dim, t.stride, buf.shape, buf.stride())
        op = self.op
        val = lambda name: pack[op[name]].float()  # noqa: E731
        q, k, v = val("q"), val("k"), val("v")
        if op["kind"] == "fp8":
            q, k, v = q * val("dq"), k * val("dk"), v * val("dv")
            assert float(val("ss")) == 448.0 and float(val("ds")) == pytest.approx(1 / 448.0, rel=1e-7)
        o = torch.softmax(q @ k.transpose(-1, -2) * op["scale"], -1) @ v
        out = pack[op["o"]]
        if op["kind"] == "fp8":
            o = (o * val("so")).clamp(-448, 448)
        out.copy_(o.to(out.dtype))


@pytest.fixture
def fake_cudnn(monkeypatch):
    dt = types.SimpleNamespace(BFLOAT16="bf16", HALF="f16", FP8_E4M3="e4m3", FLOAT="f32")
    mod = types.ModuleType("cudnn")
    mod.pygraph, mod.data_type = _Graph, dt
    mod.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    mod.backend_version = lambda: 91900
    monkeypatch.setitem(sys.modules, "cudnn", mod)
    monkeypatch.setattr(cd, "_handle", lambda device: "handle")
    monkeypatch.setattr(cd, "_GRAPHS", {})
    monkeypatch.setattr(cd.CudnnFP8Backend, "_bf16_out", {torch.device("cpu"): False})  # SM90: FP8 output
    _Graph.built.clear()
    return _Graph.built


def _qkv(S=40, H=3, D=32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, S, H, D, generator=g) * scale).to(torch.bfloat16) for _ in range(3)]


def _sdpa(q, k, v):
    return get_backend("sdpa")(q.float(), k.float(), v.float())


def test_bf16_graph_cache_and_prefix_in_place(fake_cudnn):
    q, k, v = _qkv()
    be = get_backend("cudnn_bf16")
    out = be(q, k, v)
    g = fake_cudnn[0]
    assert g.tensors[0].dim == [1, 3, 40, 32] and g.tensors[0].stride == [3840, 32, 96, 1]  # BSHD memory, BHSD dims
    assert g.op["scale"] == 1 / math.sqrt(32) and g.op["o"].data_type == "bf16"
    torch.testing.assert_close(out.float(), _sdpa(q, k, v), rtol=2**-8, atol=1e-6)  # one bf16 rounding
    be(q, k, v)
    assert len(fake_cudnn) == 1  # built once per shape
    qp, kp, vp = _qkv(S=48, seed=1)
    buf = torch.full((1, 48, 3, 32), float("nan"), dtype=torch.bfloat16)
    buf[:, 40:].zero_()
    res = be(qp[:, :40], kp[:, :40], vp[:, :40], out=buf[:, :40])
    assert res.data_ptr() == buf.data_ptr() and not buf[:, 40:].any() and not buf.isnan().any()
    assert len(fake_cudnn) == 1  # the batch-1 prefix views reuse the contiguous graph (size-1 strides canonical)
    torch.testing.assert_close(buf[:, :40], be(qp[:, :40].contiguous(), kp[:, :40].contiguous(),
                                               vp[:, :40].contiguous()),
                               rtol=0, atol=0)


def test_fp8_sm90_writes_fp8_and_dequantises(fake_cudnn):
    q, k, v = _qkv(scale=0.05)
    be = get_backend("cudnn_fp8")
    out = be(q, k, v)
    g = fake_cudnn[0]
    assert g.op["o"].data_type == "e4m3" and out.dtype == torch.bfloat16
    # tolerance: e4m3 codes of q, k, v and of O (2^-4 relative each, ~3.6% rms) -> 8% of ||O||
    ref = _sdpa(q, k, v)
    assert float((out.float() - ref).norm() / ref.norm()) < 0.08
    q8, k8, v8, d = cd.f8.quantize_qkv(q, k, v)
    codes_out = be(q8, k8, v8, descales=d)
    torch.testing.assert_close(codes_out, out, rtol=0, atol=0)  # pre-quantised codes: same result
    with pytest.raises(ValueError, match="need their descales"):
        be(q8, k8, v8)
    buf = torch.zeros(1, 48, 3, 32, dtype=torch.bfloat16)
    assert be(q, k, v, out=buf[:, :40]).data_ptr() == buf.data_ptr() and torch.equal(buf[:, :40], out)
    assert len(fake_cudnn) == 1


def test_fp8_scale_o_is_one_over_descale_v(fake_cudnn, monkeypatch):
    seen = {}
    real = _Graph.execute

    def spy(self, pack, ws, handle=None):
        seen["so"] = float(pack[self.op["so"]])
        seen["dv"] = float(pack[self.op["dv"]])
        return real(self, pack, ws, handle)

    monkeypatch.setattr(_Graph, "execute", spy)
    q, k, v = _qkv(scale=0.01)
    get_backend("cudnn_fp8")(q, k, v)
    assert seen["so"] == pytest.approx(1 / seen["dv"], rel=1e-7)
    assert seen["dv"] == pytest.approx(float(v.float().abs().amax()) / 448, rel=1e-6)


def test_fp8_bf16_output_on_blackwell_writes_in_place(fake_cudnn, monkeypatch):
    monkeypatch.setattr(cd.CudnnFP8Backend, "_bf16_out", {torch.device("cpu"): True})
    q, k, v = _qkv()
    buf = torch.zeros(1, 48, 3, 32, dtype=torch.bfloat16)
    res = get_backend("cudnn_fp8")(q, k, v, out=buf[:, :40])
    g = fake_cudnn[0]
    assert g.op["o"].data_type == "bf16" and res.data_ptr() == buf.data_ptr() and buf[:, :40].abs().sum() > 0

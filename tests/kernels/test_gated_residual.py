"""gated_residual (runtime/kernels/gated_residual.py) in Triton's CPU interpreter, and the benchmark driver's
--smoke run. Contract: bit-identical to eager (rtol=0, atol=0) -- the kernel rounds where eager rounds
(the product, then the sum) -- including zeros, infinities, subnormals and overflow; NaNs where eager
has NaNs (their payload bits are the platform's)."""

import json

import pytest
import torch

from h3plan.runtime.kernels import gated_residual as gr
from h3plan.runtime.kernels.gated_residual import gated_residual, gated_residual_check, gated_residual_ref
from scripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf/nan inputs



def same(a, b):
    nan = torch.isnan(b)
    return torch.equal(torch.isnan(a), nan) and torch.equal(a.view(torch.int16)[~nan], b.view(torch.int16)[~nan])


def make(B, S, D, R=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(B, S, D, generator=g) * 4).bfloat16()
    y = torch.randn(B, S, D, generator=g).bfloat16()
    gate = (torch.randn(R, 6 * D, generator=g)).bfloat16().chunk(6, dim=-1)[2]  # row stride 6D
    index = torch.randint(0, R, (S,), generator=g)
    return h, gate, index, y


@pytest.mark.parametrize("B,S,D,config", [
    (2, 7, 96, None),
    (3, 5, 100, (4, 64, 4)),  # 15 rows over programs of 4; 100 columns over blocks of 64
    (1, 3, 5376, None),
    (1, 4, 5376, (2, 1024, 4)),
])
def test_exact(B, S, D, config):
    h, gate, index, y = make(B, S, D, seed=B + S + D)
    assert torch.equal(gr._launch(h, gate, index, y, config).view(torch.int16),
                       gated_residual_ref(h, gate, index, y).view(torch.int16))


def test_special_values():
    h, gate, index, y = make(2, 4, 96, seed=7)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-39, -3e-40, 3e38, 1e-20])
    g = torch.Generator().manual_seed(1)
    for t in (h, y):
        flat = t.view(-1)
        flat[torch.randint(0, flat.numel(), (60,), generator=g)] = specials.repeat(7)[:60].bfloat16()
    gate[0, :9] = specials.bfloat16()
    index[0] = 0
    assert same(gated_residual(h, gate, index, y), gated_residual_ref(h, gate, index, y))


@pytest.mark.parametrize("change,reason", [
    (lambda h, g, i, y: dict(h=h.float()), "h dtype"),
    (lambda h, g, i, y: dict(y=torch.cat([y, y], -1)[..., ::2]), "y is not contiguous"),
    (lambda h, g, i, y: dict(y=y[:, :3]), "y shape"),
    (lambda h, g, i, y: dict(gate=g.t().contiguous().t()), "gate columns not unit-stride"),
    (lambda h, g, i, y: dict(gate=g[:, :48]), "gate has 48 columns"),
    (lambda h, g, i, y: dict(index=i.int()), "index dtype"),
    (lambda h, g, i, y: dict(index=i[:2]), "index has 2 rows"),
    (lambda h, g, i, y: dict(h=h[0]), "h has 2 dims"),
])
def test_guards(change, reason):
    h, gate, index, y = make(1, 4, 96)
    args = dict(h=h, gate=gate, index=index, y=y)
    args.update(change(h, gate, index, y))
    got = gated_residual_check(**args)
    assert got is not None and reason in got, got
    with pytest.raises(ValueError, match="."):
        gated_residual(**args)


def test_custom_op_traces():
    from torch.fx.experimental.proxy_tensor import make_fx

    h, gate, index, y = make(1, 3, 96, seed=3)
    gm = make_fx(gated_residual)(h, gate, index, y)
    assert torch.ops.h3plan.gated_residual.default in [n.target for n in gm.graph.nodes]
    f = torch.compile(lambda h, y: gated_residual(h, gate, index, y) + 1, backend="eager", fullgraph=True)
    assert torch.equal(f(h, y).view(torch.int16), (gated_residual_ref(h, gate, index, y) + 1).view(torch.int16))


def test_benchmark_driver_smoke(tmp_path):
    bench = load_script("benchmarks/fused_kernels.py")
    bench.main(["--smoke", "--only", "gated_residual", "--out", str(tmp_path)])
    records = json.loads((tmp_path / "kernels-smoke.json").read_text())
    assert [r["kernel"] for r in records] == ["gated_residual"]
    keys = {"kernel", "shape", "dtype", "eager_ms", "fused_ms", "bytes", "eager_bytes", "achieved_TBps",
            "copy_TBps", "fraction_of_copy", "bit_exact"}
    assert keys <= set(records[0]) and records[0]["bit_exact"] is True
    assert "| gated_residual |" in (tmp_path / "kernels-smoke.md").read_text()

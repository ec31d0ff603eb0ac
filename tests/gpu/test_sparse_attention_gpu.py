"""H200 suite for block-sparse attention (levers.sparse_attention): the router's kernels against their torch reference,
FA4's block-sparse forward against the torch reference of the same mask, keep-all against dense FA4, and the installed
processor on a sparse forward (FA4's path counted).

    python3 -m pytest tests/gpu/test_sparse_attention_gpu.py -m gpu -s

Tolerances: FA4 against the fp32 reference, relative 1e-2 (bf16 output, FA4's own accumulation order: dense FA4 is
~3e-3 from SDPA at H3 shapes); the router exact (the kernels' scores are IEEE fp32 dots; the seeded data has no near
ties at the cut). Keep-all against dense FA4: bitwise where FA4 walks the listed blocks in its dense order (the test
prints the largest difference either way and asserts it under 1e-2 relative).
"""

import pytest
import torch

from h3plan.runtime.attention.block_sparse import block_sparse_ref, fa4_block_sparse, fa4_block_sparse_reason
from h3plan.runtime.kernels.block_router import block_router, block_router_ref, blocks_to_mask, mask_to_blocks

pytestmark = pytest.mark.gpu
D = 128


def _qkv(S, H, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(1, S, H, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3)]


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="module")
def case():
    q, k, v = _qkv(4100, 8)  # 4,100 = 32 x 128 + 4: a partial key tail block
    start = torch.tensor([1000], device="cuda")
    if fa4_block_sparse_reason(q, 128, 128) is not None:
        pytest.skip(fa4_block_sparse_reason(q, 128, 128))
    return q, k, v, start


def test_router_kernels_equal_the_reference(case):
    q, k, _, start = case
    got, want = block_router(q, k, start, 0.25), block_router_ref(q, k, start, 0.25)
    print(f"router: {float((blocks_to_mask(*got).cpu() == blocks_to_mask(*want).cpu()).float().mean()):.6f} of blocks "
          f"agree")
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))


def test_fa4_block_sparse_is_the_mask(case):
    q, k, v, start = case
    cnt, idx = block_router(q, k, start, 0.25)
    mask = blocks_to_mask(cnt, idx)
    assert bool(mask[..., -1].any()), "the case keeps the partial tail block somewhere"
    o, ref = fa4_block_sparse(q, k, v, cnt, idx, 128, 128), block_sparse_ref(q, k, v, cnt, idx, 128, 128)
    dense = fa4_block_sparse(q, k, v, torch.full_like(cnt, idx.shape[-1]),
                             torch.arange(idx.shape[-1], dtype=torch.int32, device="cuda").expand_as(idx).contiguous(),
                             128, 128)
    print(f"FA4 block-sparse vs reference rel {rel(o, ref):.3e}; vs dense {rel(o, dense):.3e}")
    assert rel(o, ref) < 1e-2 and rel(o, dense) > 5e-2


def _query_block_rel(a, b, bq):
    """(H, M): each head's relative error in each query block of bq rows."""
    S, H = a.shape[1], a.shape[2]
    out, norm = torch.empty(H, -(-S // bq)), torch.linalg.vector_norm
    for m in range(out.shape[1]):
        x, y = a[:, m * bq:(m + 1) * bq].float(), b[:, m * bq:(m + 1) * bq].float()
        out[:, m] = (norm(x - y, dim=(0, 1, 3)) / norm(y, dim=(0, 1, 3))).cpu()
    return out


def test_fa4_block_sparse_attends_each_listed_block_and_no_other(case):
    """Every head's every query block is the reference's within 1e-2, and that check sees one block: the reference
    with one kept block dropped (the one with the most softmax mass in its query block) or one dropped block kept (the
    heaviest dropped one) is beyond 1e-2 in that query block. A kernel that dropped a kept block or kept a dropped one
    fails here, where the whole-tensor error could hide it."""
    q, k, v, start = case
    cnt, idx = block_router(q, k, start, 0.25)
    o = fa4_block_sparse(q, k, v, cnt, idx, 128, 128)
    per = _query_block_rel(o, block_sparse_ref(q, k, v, cnt, idx, 128, 128), 128)
    print(f"FA4 block-sparse vs reference, worst query block: rel {float(per.max()):.3e}")
    assert float(per.max()) < 1e-2
    mask = blocks_to_mask(cnt, idx)
    m = int(torch.nonzero(~mask[0, 0].all(-1))[0])  # head 0's first sparse query block
    qm = q[0, m * 128:(m + 1) * 128, 0].float()
    p = torch.softmax(qm @ k[0, :, 0].float().T / D ** 0.5, dim=-1).sum(0)  # each key's softmax mass over the block
    mass = torch.nn.functional.pad(p, (0, mask.shape[-1] * 128 - p.numel())).view(-1, 128).sum(-1)
    for flip, pool in (("dropped", mask[0, 0, m]), ("kept", ~mask[0, 0, m])):
        j = int(torch.where(pool, mass, -1.0).argmax())
        flipped = mask.clone()
        flipped[0, 0, m, j] = not bool(mask[0, 0, m, j])
        ref = block_sparse_ref(q, k, v, *mask_to_blocks(flipped), 128, 128)
        err = float(_query_block_rel(o, ref, 128)[0, m])
        print(f"against the reference with key block {j} of query block {m} {flip}: rel {err:.3e}")
        assert err > 1e-2, f"one {flip} block moves query block {m} by {err:.2e} only: the check cannot see it"


def test_keep_all_against_dense_fa4(case):
    from flash_attn.cute import flash_attn_func

    q, k, v, _ = case
    M = N = -(-q.shape[1] // 128)
    cnt = torch.full((1, q.shape[2], M), N, dtype=torch.int32, device="cuda")
    idx = torch.arange(N, dtype=torch.int32, device="cuda").expand(1, q.shape[2], M, N).contiguous()
    o = fa4_block_sparse(q, k, v, cnt, idx, 128, 128)
    d = flash_attn_func(q, k, v, softmax_scale=None, causal=False)[0]
    print(f"keep-all vs dense FA4: bitwise {torch.equal(o, d)}, max abs "
          f"{float((o.float() - d.float()).abs().max()):.3e}")
    assert rel(o, d) < 1e-2

"""The block router (runtime/kernels/block_router.py) against its per-row reference, and the block-sparse attention
reference (runtime/attention/block_sparse.py) against a block-by-block computation.

Contract: the kernels' kept blocks equal the torch reference's exactly (the scores agree to fp32 rounding; the data is
seeded so no two candidate scores sit within that rounding of the cut), in FA4's layout (ascending, zero tail); the
forced blocks (non-video keys, the diagonal) are always kept and the dense query blocks keep every block.
block_sparse_ref attends exactly the listed key blocks: compared with a loop over (head, query block) that gathers the
listed blocks (fp32 both ways, one bf16 rounding of the output; atol 1 bf16 ulp at |o| < 4: 2^-6).
"""

import math

import pytest
import torch

from h3plan.runtime.attention.block_sparse import block_sparse_ref, sparse_attention
from h3plan.runtime.kernels import block_router as router_module
from h3plan.runtime.kernels.block_router import (block_mask_ref, block_router, block_router_check, block_router_ref,
                                                 block_router_torch, block_scores_ref, blocks_to_mask, keep_blocks,
                                                 mask_to_blocks)

B, H, D = 1, 3, 32
CASES = [  # (S, Rq, block_q, block_k, video_start, keep, video_only)
    (300, 300, 32, 32, 70, 0.3, True),
    (300, 304, 32, 32, 70, 0.5, True),  # Ulysses-padded query rows: they move no mean
    (257, 257, 64, 32, 0, 0.25, False),  # query block of two key blocks, every query block routed
    (200, 200, 32, 32, 200, 0.3, True),  # no video row: nothing routed
]


def _qk(S, Rq, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Rq, H, D, generator=g).bfloat16()
    k = torch.randn(B, S, H, D, generator=g).bfloat16()
    return q, k


@pytest.mark.parametrize("form", ["op", "triton"])
@pytest.mark.parametrize("S,Rq,bq,bk,vs,keep,video_only", CASES)
def test_kernel_blocks_equal_the_reference(S, Rq, bq, bk, vs, keep, video_only, form):
    """op: the custom op (CPU tensors take the torch form); triton: the Triton kernels (interpreted here)."""
    q, k = _qk(S, Rq)
    v = torch.tensor([vs])
    if form == "op":
        cnt, idx = block_router(q, k, v, keep, block_q=bq, block_k=bk, video_only=video_only)
    else:
        cnt, idx = router_module._launch_triton(q, k, v, keep, bq, bk, video_only)
    rc, ri = block_router_ref(q, k, v, keep, block_q=bq, block_k=bk, video_only=video_only)
    assert torch.equal(cnt, rc) and torch.equal(idx, ri)
    M, N = -(-Rq // bq), -(-S // bk)
    assert cnt.shape == (B, H, M) and idx.shape == (B, H, M, N) and cnt.dtype == idx.dtype == torch.int32
    listed = torch.arange(N) < cnt[..., None]
    assert bool((idx[..., 1:] > idx[..., :-1])[listed[..., 1:]].all()), "kept blocks are listed ascending"
    assert bool((idx[~listed] == 0).all()), "the tail past cnt is zeros"


FORMS = [  # (S, Rq, H, D, block_q, block_k, video_start, keep, video_only): the Triton kernels against the torch form
    (1000, 1000, 2, 64, 128, 128, 230, 0.25, True),  # H3's blocks, a partial tail block
    (1000, 1000, 2, 48, 128, 128, 0, 0.6, False),  # head dim 48: the dots in 16-wide slices
    (300, 350, 3, 32, 32, 32, 70, 0.3, True),  # padded query rows fill a whole query block: its scores are all -inf
    (520, 520, 1, 32, 64, 128, 100, 0.1, True),  # query blocks of two sub-blocks, key blocks of four
]


@pytest.mark.parametrize("S,Rq,h,d,bq,bk,vs,keep,video_only", FORMS)
def test_triton_kernels_choose_what_the_torch_form_and_the_reference_choose(S, Rq, h, d, bq, bk, vs, keep, video_only):
    g = torch.Generator().manual_seed(S + Rq)
    q, k = torch.randn(1, Rq, h, d, generator=g).bfloat16(), torch.randn(1, S, h, d, generator=g).bfloat16()
    v = torch.tensor([vs])
    got = router_module._launch_triton(q, k, v, keep, bq, bk, video_only)
    assert all(torch.equal(a, b) for a, b in zip(got, block_router_torch(q, k, v, keep, block_q=bq, block_k=bk,
                                                                          video_only=video_only)))
    assert all(torch.equal(a, b) for a, b in zip(got, block_router_ref(q, k, v, keep, block_q=bq, block_k=bk,
                                                                        video_only=video_only)))
    assert not bool(blocks_to_mask(*got).all()), "the case drops blocks"


def test_triton_scores_equal_the_reference_scores():
    q, k = _qk(300, 304)
    M, N = 10, 10
    scores = torch.empty(B, H, M, N)
    qm, _, _ = router_module._pooled(q, 300, 32, 32)
    km, _, _ = router_module._pooled(k, 300, 32, 32)
    router_module._scores_kernel[(B * H, 1, 1)](qm, km, scores, H, M, N, 10, 10, *qm.stride()[:3], *km.stride()[:3],
                                                 math.sqrt(D), D=D, CHUNK=32, NQS=1, NKS=1, TQ=64, TK=64)
    torch.testing.assert_close(scores, block_scores_ref(q, k, 32, 32), rtol=1e-6, atol=1e-6)


def test_routing_rules():
    S, bq, bk, vs, keep = 300, 32, 32, 70, 0.3
    q, k = _qk(S, S, seed=1)
    cnt, idx = block_router(q, k, torch.tensor([vs]), keep, block_q=bq, block_k=bk)
    mask = blocks_to_mask(cnt, idx)
    M = N = 10
    kb = keep_blocks(keep, N)
    for i in range(M):
        row = mask[0, :, i]
        if i * bq < vs:  # holds a non-video row: dense in the same call
            assert bool(row.all())
            continue
        assert bool(row[:, :3].all()), "key blocks holding text / audio rows (j * 32 < 70) are always kept"
        assert bool(row[:, i].all()), "the diagonal block is always kept"
        assert int(row[0].sum()) == max(kb, 4)
        scores = block_scores_ref(q, k, bq, bk)[0, :, i]
        for h in range(H):  # the chosen candidates outscore the dropped ones
            cand = [j for j in range(3, N) if j != i]
            chosen = [j for j in cand if row[h, j]]
            dropped = [j for j in cand if not row[h, j]]
            if chosen and dropped:
                assert min(scores[h, chosen]) >= max(scores[h, dropped])


def test_ties_go_to_the_lower_block_index():
    S, bq, bk = 256, 32, 32
    q = torch.ones(B, S, H, D).bfloat16()
    k = torch.ones(B, S, H, D).bfloat16()  # every block scores alike
    cnt, idx = block_router(q, k, torch.tensor([0]), 0.5, block_q=bq, block_k=bk)
    rc, ri = block_router_ref(q, k, torch.tensor([0]), 0.5, block_q=bq, block_k=bk)
    assert torch.equal(cnt, rc) and torch.equal(idx, ri)
    # query block 5 keeps its diagonal (5) and then the lowest indices: 0, 1, 2 (4 of 8)
    assert idx[0, 0, 5, :4].tolist() == [0, 1, 2, 5] and int(cnt[0, 0, 5]) == keep_blocks(0.5, 8) == 4


def test_keep_all_lists_every_block():
    q, k = _qk(300, 300)
    cnt, idx = block_router(q, k, torch.tensor([70]), 1.0, block_q=32, block_k=32)
    assert bool((cnt == 10).all()) and torch.equal(idx, torch.arange(10, dtype=torch.int32).expand_as(idx))


def test_mask_round_trip():
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 3, 5, 7, generator=g) < 0.4
    assert torch.equal(blocks_to_mask(*mask_to_blocks(mask)), mask)


def test_check_refuses_in_one_line():
    q, k = _qk(64, 64)
    assert "one-element tensor" in block_router_check(q, k, 3, 0.5)
    assert "keep" in block_router_check(q, k, torch.tensor([3]), 0.0)
    assert "multiple of" in block_router_check(q[..., :24], k[..., :24], torch.tensor([3]), 0.5)
    with pytest.raises(ValueError, match="keep"):
        block_router(q, k, torch.tensor([3]), 1.5)


def _loop_attention(q, k, v, mask, bq, bk):
    """Row block by row block: softmax over exactly the listed key blocks' rows (fp32)."""
    B_, Rq, H_, D_ = q.shape
    S = k.shape[1]
    out = torch.empty(B_, Rq, H_, D_)
    for h in range(H_):
        for i in range(mask.shape[2]):
            rows = slice(i * bq, min(Rq, (i + 1) * bq))
            keys = torch.cat([torch.arange(j * bk, min(S, (j + 1) * bk))
                              for j in range(mask.shape[3]) if mask[0, h, i, j]])
            s = q[0, rows, h].float() @ k[0, keys, h].float().T / math.sqrt(D_)
            out[0, rows, h] = torch.softmax(s, -1) @ v[0, keys, h].float()
    return out


def test_reference_attends_exactly_the_listed_blocks():
    S, bq, bk = 200, 32, 32
    q, k = _qk(S, S, seed=4)
    v = torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(5)).bfloat16()
    mask = block_mask_ref(q, k, 40, 0.3, block_q=bq, block_k=bk)
    assert not bool(mask.all()), "the case drops blocks"
    out = block_sparse_ref(q, k, v, *mask_to_blocks(mask), bq, bk)
    torch.testing.assert_close(out.float(), _loop_attention(q, k, v, mask, bq, bk), rtol=0, atol=2**-6)
    for flip in ("drop", "keep"):  # the same comparison is sensitive to one block either way
        m = mask.clone()
        i, j = (5, 6) if flip == "keep" else (5, 0)
        assert bool(m[0, 0, i, j]) == (flip == "drop")
        m[0, 0, i, j] = not m[0, 0, i, j]
        assert (block_sparse_ref(q, k, v, *mask_to_blocks(m), bq, bk).float() - out.float()).abs().max() > 2**-6


def test_sparse_op_is_neither_zeros_nor_its_input_and_dense_rows_are_dense():
    S, bq, bk, vs = 200, 32, 32, 70
    q, k = _qk(S, S, seed=6)
    v = torch.randn(B, S, H, D, generator=torch.Generator().manual_seed(7)).bfloat16()
    out = torch.ops.h3plan.sparse_attention(q, k, v, torch.tensor([vs]), 0.3, bq, bk, True, False)
    mask = block_mask_ref(q, k, vs, 0.3, block_q=bq, block_k=bk)
    torch.testing.assert_close(out, block_sparse_ref(q, k, v, *mask_to_blocks(mask), bq, bk), rtol=0, atol=0)
    full = block_sparse_ref(q, k, v, *mask_to_blocks(torch.ones_like(mask)), bq, bk)
    dense_rows = 64  # query blocks 0 and 1 hold rows before 70; block 2 (64..95) too
    torch.testing.assert_close(out[:, :96], full[:, :96], rtol=0, atol=0)
    assert (out[:, 96:] - full[:, 96:]).abs().max() > 1e-2, "the routed rows attend fewer keys"
    for other in (torch.zeros_like(out), q, v):
        assert (out - other).abs().max() > 1e-2
    assert dense_rows < 96 and sparse_attention is not None

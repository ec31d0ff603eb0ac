"""merge_head_chunks (Triton interpreter) against its reference and an explicit index map.
Pure data movement: rtol=0, atol=0 (bits)."""

import pytest
import torch

from h3plan.runtime.kernels.ulysses_merge import merge_head_chunks, merge_head_chunks_check, merge_head_chunks_ref


def recv_tensor(U, B, S, Hl, D, dtype=torch.bfloat16, seed=0):
    return torch.randn(U, B, S, Hl, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


def expected(recv, valid_rows):
    U, B, S, Hl, D = recv.shape
    out = torch.zeros(B, S, U * Hl * D, dtype=recv.dtype)
    for u in range(U):
        for h in range(Hl):
            c = (u * Hl + h) * D
            out[:, :valid_rows, c:c + D] = recv[u, :, :valid_rows, h]
    return out


@pytest.mark.parametrize("U,B,S,Hl,D,valid", [(2, 1, 5, 3, 32, 5), (4, 2, 7, 2, 32, 4), (8, 1, 3, 1, 128, 0),
                                              (3, 2, 9, 5, 24, 8)])
def test_merge_matches_index_map(U, B, S, Hl, D, valid):
    recv = recv_tensor(U, B, S, Hl, D, seed=U)
    out = merge_head_chunks(recv, valid)
    assert out.shape == (B, S, U * Hl * D) and out.is_contiguous()
    exp = expected(recv, valid)
    assert torch.equal(out.view(torch.int16), exp.view(torch.int16))
    assert torch.equal(merge_head_chunks_ref(recv, valid).view(torch.int16), exp.view(torch.int16))


def test_tail_is_zeroed_not_copied():
    recv = recv_tensor(2, 1, 6, 2, 16)
    recv[:, :, 3:] = float("nan")  # padding rows hold garbage: never read
    out = merge_head_chunks(recv, 3)
    assert torch.equal(out[:, 3:], torch.zeros_like(out[:, 3:]))
    assert not torch.isnan(out).any()


def test_preallocated_strided_out_and_strided_recv():
    U, B, S, Hl, D = 4, 2, 5, 2, 16
    base = recv_tensor(U, B, S, 2 * Hl, D)
    recv = base[:, :, :, 1::2]  # head stride 2*D: strided, last dim contiguous
    assert not recv.is_contiguous()
    buf = torch.full((B, S + 3, U * Hl * D + 10), 7.0, dtype=torch.bfloat16)
    out = buf[:, 2:2 + S, 6:6 + U * Hl * D]
    assert merge_head_chunks_check(recv, 3, out=out) is None
    res = merge_head_chunks(recv, 3, out=out)
    assert res is out
    assert torch.equal(out.view(torch.int16), expected(recv, 3).view(torch.int16))
    keep = torch.ones_like(buf, dtype=torch.bool)
    keep[:, 2:2 + S, 6:6 + U * Hl * D] = False
    assert (buf[keep] == 7.0).all()  # nothing outside the view was written


def test_out_permuted_rows_and_fp32():
    U, B, S, Hl, D = 2, 3, 4, 1, 8
    recv = recv_tensor(U, B, S, Hl, D, dtype=torch.float32)
    out = torch.empty(S, B, U * Hl * D).transpose(0, 1)  # rows disjoint, batch stride < row stride
    merge_head_chunks(recv, 2, out=out)
    assert torch.equal(out, expected(recv, 2))


def test_merge_guards():
    recv = recv_tensor(2, 1, 4, 2, 8)
    assert merge_head_chunks_check(recv, 4) is None
    cases = [
        ((recv[0], 2), "(U, B, S_loc"),
        ((recv, 5), "valid_rows"),
        ((recv, -1), "valid_rows"),
        ((recv, 2.0), "valid_rows"),
        ((recv[..., ::2], 2), "contiguous"),
        ((recv.to(torch.complex64), 2), "dtype"),
        ((recv, 2, torch.empty(1, 4, 31, dtype=torch.bfloat16)), "out shape"),
        ((recv, 2, torch.empty(1, 4, 32)), "out dtype"),
        ((recv, 2, torch.empty(1, 4, 64, dtype=torch.bfloat16)[..., ::2]), "contiguous"),
        ((recv, 2, torch.empty(1, 32, dtype=torch.bfloat16).expand(1, 4, 32)), "overlap"),
        ((recv, 2, torch.empty(1, 64, dtype=torch.bfloat16).as_strided((1, 4, 32), (160, 8, 1))), "overlap"),
    ]
    for args, msg in cases:
        reason = merge_head_chunks_check(*args)
        assert reason is not None and msg in reason, (msg, reason)
        with pytest.raises(ValueError):
            merge_head_chunks(*args)


def test_opcheck_merge_ops():
    recv = recv_tensor(2, 1, 3, 2, 8)
    torch.library.opcheck(torch.ops.h3plan.merge_head_chunks.default, (recv, 2))
    torch.library.opcheck(torch.ops.h3plan.merge_head_chunks_out.default,
                          (recv, 1, torch.empty(1, 3, 32, dtype=torch.bfloat16)))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.float32])
def test_merge_any_element_size(dtype):
    """FP8 attention outputs travel as e4m3 codes / uint8: moved as raw bits."""
    raw = torch.randint(0, 255, (2, 1, 5, 2, 16), generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    recv = raw.view(dtype) if dtype != torch.float32 else torch.randn(2, 1, 5, 2, 16)
    out = merge_head_chunks(recv, 3)
    assert out.dtype == dtype
    exp = expected(recv.view(torch.uint8), 3) if dtype != torch.float32 else expected(recv, 3)
    assert torch.equal(out.view(torch.uint8) if dtype != torch.float32 else out, exp)

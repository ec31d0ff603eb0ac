"""Derived numbers a plan carries, each with its basis (plan.derived["basis"][key]).

`shape` needs only the config (the levers read it); `estimates` also needs the decisions. Estimates
are first-order: attention = 4*S^2*H_local*D / TFLOP/s, GEMM = 2*rows*params / TFLOP/s, all-to-all =
bytes leaving a rank / one-direction NVLink bandwidth, with TFLOP/s measured where the hardware has a
measurement, else an assumed fraction of the vendor dense peak, else unavailable (None).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from h3plan.facts.attention import BACKENDS
from h3plan.facts.ring_plan import ring_degree
from h3plan.levers import REGISTRY, TERM_OWNERS, terms
from h3plan.levers.base import nearest_point, nearest_ulysses_point
from h3plan.sources import cite

INT32_LIMIT = 2**31
ORDER = (
    "seq_len", "batch", "ulysses_degree", "ring_degree", "world", "heads_per_rank", "padded_len", "padding_rows",
    "local_rows",
    "a2a_bytes_per_block_per_rank", "a2a_bytes_leaving_rank_per_block", "a2a_ms_per_block_est",
    "max_elements_per_rank_tensor", "int64_indexing_required", "int64_boundary_tokens_per_rank",
    "attention_tflops_used", "attention_ms_per_block_est", "block_linear_params", "gemm_tflops_used",
    "gemm_ms_per_block_est",
)


def block_linear_params(dc: Mapping[str, Any]) -> int:
    hid, inner, ffn = dc["hidden_size"], dc["num_attention_heads"] * dc["attention_head_dim"], dc["ffn_dim"]
    return 3 * hid * inner + inner * hid + hid * 2 * ffn + ffn * hid


def shape(sections: Mapping[str, Any]) -> dict[str, Any]:
    dc, p = sections["model"]["diffusers_config"], sections["parallel"]
    heads, d, ffn = dc["num_attention_heads"], dc["attention_head_dim"], dc["ffn_dim"]
    u, s, b = p["ulysses"], p["seq_len"], p["batch"]
    r = ring_degree(p)
    world = r * u  # the sequence is sharded over every rank (ring_plan.py)
    padded = -(-s // world) * world
    local = padded // world
    tensors = {"q/k/v per rank (B, S/U, H, D)": b * local * heads * d,
               "ffn gate+up per rank (B, S/U, 2F)": b * local * 2 * ffn}
    biggest = max(tensors, key=tensors.get)
    boundary = -(-INT32_LIMIT // (heads * d))
    return {
        "batch": b,
        "seq_len": s,
        "ulysses_degree": u,
        "ring_degree": r,
        "world": world,
        "heads_per_rank": heads // u,
        "padded_len": padded,
        "padding_rows": padded - s,
        "local_rows": local,
        "max_elements_per_rank_tensor": tensors[biggest],
        "int64_indexing_required": tensors[biggest] >= INT32_LIMIT,
        "int64_boundary_tokens_per_rank": boundary,
        "basis": {
            "heads_per_rank": f"{heads} heads / Ulysses degree {u}",
            "padded_len": f"seq_len rounded up to a multiple of the world ring {r} x ulysses {u}",
            "local_rows": "padded_len / world: rows each rank holds outside attention",
            "max_elements_per_rank_tensor": f"largest per-rank tensor a kernel indexes: {biggest}",
            "int64_indexing_required": f"max_elements_per_rank_tensor >= 2**31 (int32 offsets wrap; "
                                       f"{cite('fastvideo-seed')}: {heads} x {d} heads wrap from {boundary:,} tokens "
                                       f"per rank, which it rounds to 299,593); h3plan kernels index in int64 anyway",
        },
    }


def bracket(points, x: float, key):
    """The measured points nearest below and above `x` (by `key`), or None where `x` is outside their range or one of
    them sits at it (then the nearest point is the measurement)."""
    if any(key(p) == x for p in points):
        return None
    below, above = [p for p in points if key(p) < x], [p for p in points if key(p) > x]
    return (max(below, key=key), min(above, key=key)) if below and above else None


def provenance(p: Mapping[str, Any], of: str | None = None) -> str:
    """Which measurement a packaged point came from (its `provenance`: file and row), else its `source`."""
    prov = [x for x in p.get("provenance") or () if not x.get("of") or x.get("of") == of]
    if not prov:
        return str(p.get("source") or "")
    return "; ".join(f"{x['file']}" + (f" at commit {x['commit']}" if x.get("commit") else "")
                     + f" ({', '.join(f'{k} {v}' for k, v in sorted((x.get('row') or {}).items()))}"
                     + (f": {x['value']}" if x.get("value") else "") + ")" for x in prov)


def attention_rate(hw: Mapping[str, Any], seq_len: int, heads: int, backend: str) -> tuple[float, str] | None:
    """(TFLOP/s, basis) of `backend` at (seq_len, heads) per rank from the points of that head count, those measured
    inside the installed forward (context: forward) before those of the kernel alone: a point at that length, else the
    time per block interpolated in S^2 (attention's FLOPs; a fixed cost stays fixed) between the measured lengths
    nearest below and above; else the nearest length's rate (any head count where that head count has none). None:
    the backend was never measured here."""
    pts = [p for p in hw["measured"]["attention"] if p.get(backend) is not None]
    same = [p for p in pts if p["heads"] == heads]
    tiers = ([p for p in same if p.get("context") == "forward"], [p for p in same if p.get("context") != "forward"])
    for tier in tiers:
        exact = next((p for p in tier if p["seq_len"] == seq_len), None)
        if exact is not None:
            return float(exact[backend]), (f"{backend} measured {exact[backend]:g} TFLOP/s on {hw['name']} at "
                                           f"{seq_len:,} x {heads} heads{_where(exact)} ({provenance(exact, backend)})")
        pair = bracket(tier, seq_len, lambda p: p["seq_len"])
        if pair is not None:
            (a, b), s2 = pair, seq_len**2
            ta, tb = a["seq_len"] ** 2 / a[backend], b["seq_len"] ** 2 / b[backend]  # time / (4 H D), up to units
            t = ta + (tb - ta) * (s2 - a["seq_len"] ** 2) / (b["seq_len"] ** 2 - a["seq_len"] ** 2)
            return s2 / t, (f"{backend} {s2 / t:.1f} TFLOP/s: the time interpolated in S^2 between {a[backend]:g} "
                            f"TFLOP/s measured at {a['seq_len']:,} and {b[backend]:g} at {b['seq_len']:,} x "
                            f"{heads} heads{_where(a)} on {hw['name']} ({provenance(a, backend)}; "
                            f"{provenance(b, backend)})")
    tier = tiers[0] or tiers[1]
    p = min(tier, key=lambda p: (abs(math.log(p["seq_len"] / seq_len)), p["seq_len"])) if tier else \
        nearest_point(hw, seq_len, heads, backend)
    if p is None:
        return None
    return float(p[backend]), (f"{backend} measured {p[backend]:g} TFLOP/s on {hw['name']} at {p['seq_len']:,} x "
                               f"{p['heads']} heads{_where(p)} (nearest measured shape; "
                               f"{provenance(p, backend) or hw['measured']['source']})")


def _where(p: Mapping[str, Any]) -> str:
    return " inside the installed forward" if p.get("context") == "forward" else ""


def gemm_rate(hw: Mapping[str, Any], dtype: str, rows: int, params: int) -> tuple[float, str] | None:
    """(TFLOP/s, basis) of the block linears in `dtype` at `rows` rows: the rate measured at those rows; else,
    between the measured rows nearest below and above, interpolated in log rows (a GEMM's efficiency grows with its
    size); else the nearest measured rows' rate. None: never measured in that dtype."""
    block = [p for p in hw["measured"].get("gemm_block") or () if p["dtype"] == dtype]
    if not block:
        return None

    def rate(p):
        return 2 * p["rows"] * params * p["layers"] / (p["ms"] * 1e9)

    pair = bracket(block, rows, lambda p: p["rows"])
    if pair is not None:
        a, b = pair
        v = rate(a) + (rate(b) - rate(a)) * math.log(rows / a["rows"]) / math.log(b["rows"] / a["rows"])
        return v, (f"{dtype} block linears {v:.1f} TFLOP/s on {hw['name']}: interpolated in log rows between "
                   f"{rate(a):.1f} at {a['rows']:,} and {rate(b):.1f} at {b['rows']:,} rows ({provenance(a)}; "
                   f"{provenance(b)})")
    p = min(block, key=lambda p: (abs(math.log(p["rows"] / rows)), p["rows"]))
    v = rate(p)
    return v, (f"{dtype} block linears measured {v:.1f} TFLOP/s on {hw['name']} at {p['rows']:,} rows ({p['ms']:g} ms "
               f"over {p['layers']} block(s); nearest measured; {provenance(p)})")


def _throughput(hw: Mapping[str, Any], kind: str, dtype: str, point_key: tuple[int, int] | None = None,
                backend: str | None = None,
                rows: int | None = None, params: int | None = None):
    """(TFLOP/s, basis) from measurement, else peak x assumed efficiency, else (None, why). GEMMs: the block linears'
    rate measured at the plan's rows (`measured.gemm_block`: gemm_rate) before the plain GEMM rate; attention:
    attention_rate."""
    m = hw["measured"]
    if kind == "gemm" and rows and params:
        got = gemm_rate(hw, dtype, rows, params)
        if got is not None:
            return got
    if kind == "attention" and backend:
        got = attention_rate(hw, point_key[0], point_key[1], backend)
        if got is not None:
            return got
    if kind == "gemm" and m["gemm_tflops"].get(dtype) is not None:
        v = m["gemm_tflops"][dtype]
        return float(v), f"{dtype} GEMM measured {v:g} TFLOP/s on {hw['name']} ({m['source']})"
    key = efficiency_key(kind, dtype)
    peak, eff = hw["peak_dense_tflops"].get(dtype), hw["efficiency"].get(key)
    if peak is not None and eff is not None:
        return peak * eff, (f"assumed {eff:g} x vendor dense {dtype} peak {peak:g} TFLOP/s (efficiency.{key}, the "
                            f"{dtype} {kind} ratio: {hw['efficiency']['source']}; "
                            f"{hw['peak_dense_tflops']['source']}); never measured on {hw['name']}")
    return None, (f"no {dtype} {kind} throughput for {hw['name']} (efficiency.{key}: none): "
                  f"{hw['peak_dense_tflops']['source']}; {hw['efficiency']['source']}")


def efficiency_key(kind: str, dtype: str) -> str:
    """The hardware.efficiency ratio of `kind` (attention, gemm) at `dtype`: bf16 is the plain key, every other
    precision its own (attention_fp8, gemm_nvfp4): a ratio measured at one precision never stands for another."""
    return kind if dtype == "bf16" else f"{kind}_{dtype}"


def estimates(sections: Mapping[str, Any], shp: Mapping[str, Any], decisions: Mapping[str, Any]) -> dict[str, Any]:
    hw, dc = sections["hardware"], sections["model"]["diffusers_config"]
    d, heads = dc["attention_head_dim"], dc["num_attention_heads"]
    b, u, local, hl = shp["batch"], shp["ulysses_degree"], shp["local_rows"], shp["heads_per_rank"]
    t = terms(decisions)  # what the decided settings change here (each lever's SPEC.terms)
    backend = t.attention_backend
    att_len = shp["padded_len"] if t.attention_padded else shp["seq_len"]
    att_dtype = BACKENDS[backend].precision
    att_tf, att_basis = _throughput(hw, "attention", att_dtype, (att_len, hl), backend)
    att_flops = 4 * b * att_len**2 * hl * d
    gemm_dtype = t.gemm_dtype or "bf16"
    params = block_linear_params(dc)
    gemm_tf, gemm_basis = _throughput(hw, "gemm", gemm_dtype, rows=b * local, params=params)
    gemm_flops = 2 * b * local * params
    codes = t.a2a_fp8
    per_tensor = b * local * heads * d
    a2a_bytes = 0 if u == 1 else per_tensor * (3 * (1 if codes else 2) + 2)
    leaving = a2a_bytes * (u - 1) // u if u > 1 else 0
    nv = hw["device"]["nvlink_gbps"]
    a2a_ms = None if (u == 1 or nv is None) else round(leaving / (nv / 2 * 1e9) * 1e3, 3)
    a2a_basis = ("degree 1: no all-to-all" if u == 1 else
                 f"bytes leaving a rank / one-direction NVLink {nv}/2 GB/s ({hw['device']['source']}); no latency "
                 f"term; all-to-all never measured at degree {u} on {hw['name']}")
    m = nearest_ulysses_point(hw, "a2a", u, shp["seq_len"]) if u > 1 else None
    if m is not None:
        gbps = m["gbps_leaving_rank"]
        a2a_ms = round(leaving / (gbps * 1e9) * 1e3, 3)
        a2a_basis = (f"bytes leaving a rank / {gbps:g} GB/s, all_to_all_single measured on {hw['name']} at degree {u}, "
                     f"{m['seq_len']:,} tokens (nearest measured length; {hw['measured']['ulysses']['source']})")

    if u > 1 and t.a2a_note:
        a2a_basis += "; " + t.a2a_note

    def ms(flops, tf):
        return None if tf is None else round(flops / (tf * 1e12) * 1e3, 3)

    sparse = _sparse(decisions, ms(att_flops, att_tf), b, hl, d, hw) if t.sparse_blocks else {}
    sparse_basis = sparse.pop("basis_sparse", {})
    return {**sparse,
        "attention_tflops_used": None if att_tf is None else round(att_tf, 1),
        "attention_ms_per_block_est": ms(att_flops, att_tf),
        "block_linear_params": params,
        "gemm_tflops_used": None if gemm_tf is None else round(gemm_tf, 1),
        "gemm_ms_per_block_est": ms(gemm_flops, gemm_tf),
        "a2a_bytes_per_block_per_rank": a2a_bytes,
        "a2a_bytes_leaving_rank_per_block": leaving,
        "a2a_ms_per_block_est": a2a_ms,
        "basis": {
            **sparse_basis,
            "attention_ms_per_block_est": f"4*S^2*H_local*D*B / TFLOP/s with S={att_len:,}, H_local={hl}, D={d}, "
                                          f"B={b}; {att_basis}",
            "block_linear_params": "to_q/k/v 3*hidden*inner + to_out inner*hidden + ff hidden*2*ffn + ffn*hidden "
                                   "(AdaLN projections excluded: per timestep, not per token)",
            "gemm_ms_per_block_est": f"2*rows*params / TFLOP/s with rows=B*local_rows={b * local:,}, {gemm_dtype} "
                                     f"GEMMs; {gemm_basis}",
            "a2a_bytes_per_block_per_rank": "bytes one rank passes to all_to_all per block: Q, K, V (B x S/U x H x D "
                                            f"each, {'e4m3, 1 byte' if codes else 'bf16, 2 bytes'}) before attention "
                                            f"and O (bf16) after; 0 at degree 1",
            "a2a_bytes_leaving_rank_per_block": "(U-1)/U of a2a_bytes_per_block_per_rank: the share sent to other "
                                                "ranks",
            "a2a_ms_per_block_est": a2a_basis,
        },
    }


def _sparse(decisions: Mapping[str, Any], att_ms: float | None, b: int, hl: int, d: int,
            hw: Mapping[str, Any]) -> dict[str, Any]:
    """A sparse forward's attention per block: the dense estimate x the block work the router keeps (its decision's
    `work_fraction`), plus the router's time from its measured points (hardware.fa4.block_sparse_router,
    interpolated in its pooled scores' GFLOP; none measured: not counted, and the basis says so)."""
    dec = decisions[TERM_OWNERS["sparse_blocks"]]
    wf = dec.param("work_fraction", None)
    if wf is None or att_ms is None:
        return {}
    m, n, bq, bk = dec.param("query_blocks"), dec.param("key_blocks"), dec.param("block_q"), dec.param("block_k")
    gflop = 2 * b * hl * m * (bq // 32) * n * (bk // 32) * d / 1e9
    router_ms, router_basis = _router_ms(hw, gflop)
    return {"attention_ms_per_block_sparse_est": round(att_ms * wf + (router_ms or 0.0), 3),
            "basis_sparse": {"attention_ms_per_block_sparse_est": (
                f"attention_ms_per_block_est x {wf:g}, the block work a sparse call keeps ({dec.lever}: "
                f"{dec.param('routed_query_blocks')} of {m} query blocks keep {dec.param('kept_key_blocks')} of {n} "
                f"key blocks, the rest dense), + its router ({gflop:.1f} GFLOP of pooled scores per block): "
                f"{router_basis}")}}


def _router_ms(hw: Mapping[str, Any], gflop: float) -> tuple[float | None, str]:
    pts = REGISTRY[TERM_OWNERS["sparse_blocks"]].router_points(hw)  # sparse_attention: its router's points
    if not pts:
        return None, f"not measured on {hw['name']}, not counted"
    lo = max([p for p in pts if p["gflop"] <= gflop] or pts[:1], key=lambda p: p["gflop"])
    hi = min([p for p in pts if p["gflop"] >= gflop] or pts[-1:], key=lambda p: p["gflop"])
    if lo is hi or hi["gflop"] == lo["gflop"]:
        v = lo["ms"] * gflop / lo["gflop"]  # one point, or past the ends: in proportion to the nearest
        where = f"in proportion to the point at {lo['gflop']:g} GFLOP ({lo['provenance']})"
    else:
        v = lo["ms"] + (hi["ms"] - lo["ms"]) * (gflop - lo["gflop"]) / (hi["gflop"] - lo["gflop"])
        where = (f"interpolated between {lo['gflop']:g} and {hi['gflop']:g} GFLOP "
                 f"({lo['provenance']}; {hi['provenance']})")
    return v, f"{v:.2f} ms, measured on {hw['name']} {where}"


def merge(shp: Mapping[str, Any], est: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in shp.items() if k != "basis"}
    out.update({k: v for k, v in est.items() if k != "basis"})
    out["basis"] = {**shp["basis"], **est["basis"]}
    return out

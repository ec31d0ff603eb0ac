"""a2a_fp8_codes' runtime (its plan: levers/a2a_fp8_codes.py): the Ulysses exchange moves e4m3 codes as bytes
(runtime/parallel/ulysses.py `fp8_codes`), its option of the exchange (runtime/attention_sites.py `exchange_options`).
The codes and their shared scales come from qk_norm_rope's `wire_codes` site (runtime/levers/qk_norm_rope.py, which
also checks that the plan casts them: `option_problems`)."""

from __future__ import annotations

from dataclasses import replace

from h3plan.runtime.attention_sites import AttentionSites, with_options


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """on: the exchange takes FP8 codes."""
    if not opts.a2a_fp8_codes:
        return sites
    return replace(sites, exchange_options=with_options(sites.exchange_options, fp8_codes=True))

"""ulysses_overlap's runtime (its plan: levers/ulysses_overlap.py): the Ulysses exchange in head chunks, each chunk's
all-to-all in flight while the one before attends (runtime/parallel/ulysses.py `chunks`), its option of the exchange
(runtime/attention_sites.py `exchange_options`)."""

from __future__ import annotations

from dataclasses import replace

from h3plan.runtime.attention_sites import AttentionSites, with_options


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """ulysses_chunks > 1: the exchange runs that many head chunks."""
    if opts.ulysses_chunks == 1:
        return sites
    return replace(sites, exchange_options=with_options(sites.exchange_options, chunks=opts.ulysses_chunks))

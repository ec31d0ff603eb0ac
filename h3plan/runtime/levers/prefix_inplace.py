"""prefix_inplace's runtime (its plan: levers/prefix_inplace.py): the Ulysses exchange allocates the padded attention
output once and the backend writes the valid prefix through a view (runtime/parallel/ulysses.py `prefix_inplace`),
its option of the exchange (runtime/attention_sites.py `exchange_options`)."""

from __future__ import annotations

from dataclasses import replace

from h3plan.runtime.attention_sites import AttentionSites, with_options


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """on: the exchange writes the prefix in place."""
    if not opts.prefix_inplace:
        return sites
    return replace(sites, exchange_options=with_options(sites.exchange_options, prefix_inplace=True))

"""ulysses_padding's runtime (its plan: levers/ulysses_padding.py): the padding mode of the Ulysses exchange
(runtime/parallel/ulysses.py `PADDING_MODES`), its option of the exchange (runtime/attention_sites.py
`exchange_options`). Its other option, `ulysses_degree`, is the install's: the sequence shard and the group's size."""

from __future__ import annotations

from dataclasses import replace

from h3plan.runtime.attention_sites import AttentionSites, with_options


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """Degree > 1: the exchange pads by the plan's mode, `none` included (the exchange's own default is `padded`); at
    degree 1 the sequence is not split."""
    if opts.ulysses_degree == 1:
        return sites
    return replace(sites, exchange_options=with_options(sites.exchange_options, padding=opts.ulysses_padding))

"""The levers the benches and benchmarks/ force, filter or report, each named by the role its Terms give it
(h3plan.levers.TERM_OWNERS: the one lever whose settings set that field), so a script reaches a lever through the
registry instead of spelling its name. Torch-free."""

from h3plan.levers import BACKEND_LEVER, SPECS, TERM_OWNERS, ULYSSES_LEVERS, owner

BACKEND = BACKEND_LEVER
"""the attention backend the blocks run."""
DECODE_PRECISION = TERM_OWNERS["vae_cast"]
"""the dtype the plan casts the VAE to for the decode."""
DECODE_TILES = TERM_OWNERS["vae_tile"]
"""the decode's tile geometry."""
VAE_OPS = TERM_OWNERS["vae_fused"]
"""the VAE decoder's fused ops."""
VAE_GRAPHS = TERM_OWNERS["vae_graph_pool"]
"""the decoder calls' CUDA graphs."""
ADALN_TABLES = TERM_OWNERS["adaln_tables"]
"""the AdaLN projections tabled per timestep."""
STEP_CACHE = TERM_OWNERS["fewer_forwards"]
"""the step schedule that computes some forwards and reuses the rest."""
EXCHANGE = TERM_OWNERS["a2a_note"]
"""how Q, K and V cross the Ulysses all-to-all."""
OVERLAP = owner("ulysses_chunks")
"""the all-to-all overlapped with compute, in chunks."""
ULYSSES = ULYSSES_LEVERS
"""every lever a Ulysses plan decides."""
FA4_TILE = next(s.name for s in SPECS.values() for read in s.backend_reads.values() if read.kwarg == "tile")
"""the forward tile the attention backend is built with."""


def counter(lever: str, route: str | None = None) -> str:
    """The counter `lever`'s call sites count under (its Spec's counter, or one of its declared routes)."""
    return SPECS[lever].count(route)

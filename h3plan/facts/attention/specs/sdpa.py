"""sdpa: torch SDPA as diffusers' `native` backend calls it; runs wherever torch does (the fallback of every plan)."""

from ..spec import BackendSpec

SPEC = BackendSpec(
    name="sdpa",
    impl="h3plan.runtime.attention.sdpa:SDPABackend",
    label="SDPA",
    lossless=True,
    precision="bf16",
    dtypes=("bf16", "fp16", "fp32"),
    lse="sdpa_flash",  # torch's flash kernel returns its logsumexp
    lse_impl="h3plan.runtime.attention.sdpa:sdpa_flash_lse",
)

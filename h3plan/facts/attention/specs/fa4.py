"""fa4: FlashAttention-4's forward (h3plan/runtime/attention/fa4.py); the options it reads (its constructor's `two_cta`
and `tile`) are declared by the levers that own them (Spec.backend_reads)."""

from ..spec import BackendSpec, Fact

SPEC = BackendSpec(
    name="fa4",
    impl="h3plan.runtime.attention.fa4:FA4Backend",
    label="FA4",
    lossless=True,
    precision="bf16",
    dtypes=("bf16", "fp16"),
    needs=(Fact("fa4.bf16", "{hw} has no FA4 BF16 forward ({source})"),),
    lse="fa4",  # flash_attn_func(..., return_lse=True)
    lse_impl="h3plan.runtime.attention.fa4:fa4_lse",
)

"""fa4: FlashAttention-4's forward (h3plan/runtime/attention/fa4.py), with the fa4_2cta and fa4_tile levers' options."""

from ..spec import BackendOption, BackendSpec, Fact, Untested

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
    options=(
        BackendOption("fa4_2cta", kwarg="two_cta", reason="two_cta_reason",
                      describe=lambda v: None if v is None else f"2cta={v}"),
        BackendOption("fa4_tile", kwarg="tile", reason="tile_reason",
                      describe=lambda t: f"tile={t['tile_m']}x{t['tile_n']}" if t else None),
    ),
    untested=(Untested("the per-call 2-CTA switch (hardware.fa4.two_cta)", lambda f: bool(f["fa4"]["two_cta"]),
                       "fa4_2cta", "on", option="fa4_2cta"),),
)

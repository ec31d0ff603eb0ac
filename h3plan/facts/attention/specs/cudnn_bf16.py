"""cudnn_bf16: cuDNN's fused flash attention through cudnn-frontend (h3plan/runtime/attention/cudnn.py)."""

from ..spec import BackendSpec, Fact

SPEC = BackendSpec(
    name="cudnn_bf16",
    impl="h3plan.runtime.attention.cudnn:CudnnBF16Backend",
    label="cuDNN BF16 SDPA",
    lossless=True,
    precision="bf16",
    dtypes=("bf16", "fp16"),
    needs=(Fact("cudnn.bf16", "{hw} has no cuDNN BF16 attention ({source})"),),
    lse="sdpa_cudnn",  # the same cuDNN kernel family through torch (compute_log_sumexp)
    lse_impl="h3plan.runtime.attention.sdpa:sdpa_cudnn_lse",
)

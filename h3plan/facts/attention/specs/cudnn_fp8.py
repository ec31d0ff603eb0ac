"""cudnn_fp8: cuDNN's per-tensor FP8 flash attention (h3plan/runtime/attention/cudnn.py); lossy, no log-sum-exp here.

The version gate and the output dtype are hardware facts (hardware.cudnn: fp8_min_version, fp8_excluded_versions,
fp8_output_dtypes, bf16_output_min_version), read through h3plan.facts.hardware.
"""

from ...hardware import cudnn_fp8_bf16_output, cudnn_fp8_version_problem
from ..spec import BackendSpec, Fact, Untested


def problems(hardware) -> list[str]:
    version = hardware["cudnn"]["version"]
    why = cudnn_fp8_version_problem(hardware, version) if version is not None else None
    return [why] if why else []


def params(hardware) -> dict:
    """o_dtype: bf16 where the hardware and cuDNN allow it (Blackwell, >= 9.13), else fp8 (Hopper)."""
    return {"o_dtype": "bf16" if cudnn_fp8_bf16_output(hardware, None) else "fp8",
            "requires": list(hardware["cudnn"]["fp8_requires"])}


SPEC = BackendSpec(
    name="cudnn_fp8",
    impl="h3plan.runtime.attention.cudnn:CudnnFP8Backend",
    label="cuDNN FP8 SDPA",
    lossless=False,
    precision="fp8",
    dtypes=("bf16", "fp16", "e4m3"),
    needs=(Fact("cudnn.fp8", "{hw} has no cuDNN FP8 attention (hardware.{path}=false; {source})"),),
    problems=problems,
    params=params,
    untested=(Untested("BF16 output (hardware.cudnn.fp8_output_dtypes, bf16_output_min_version)",
                       lambda f: cudnn_fp8_bf16_output(f, None), "attention", "cudnn_fp8"),),
)

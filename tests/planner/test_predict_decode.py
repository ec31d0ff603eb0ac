"""One decode figure per plan: at Ulysses degree > 1 with vae_parallel=tiles, the speed line's decode is the figure the
vae_parallel reason states, and both start from the decode measured on one GPU at the plan's precision and tiles."""

import re

import pytest

from h3plan.planner import resolve_config


@pytest.mark.parametrize("over", [{"parallel": "u4"}, {"recipe": "fp8", "parallel": "u8"},
                                  {"parallel": "u4", "levers.vae_parallel": "tiles"}])
def test_the_speed_line_decodes_at_the_vae_parallel_reasons_figure(over):
    plan = resolve_config(hardware="sm90", **over)
    one = resolve_config(hardware="sm90", **{**over, "parallel": "u1", "levers.vae_parallel": "auto"})
    d = plan.decision("vae_parallel")
    assert d.setting == "tiles"
    m = re.search(r"estimated ([\d.]+) s on one GPU -> ([\d.]+) s at degree (\d)", " ".join(d.reasons))
    assert m, d.reasons
    one_gpu, spread = float(m.group(1)), float(m.group(2))
    assert one_gpu == pytest.approx(one.derived_value("decode_s_est"), abs=0.01)  # the same one-GPU decode
    assert plan.derived_value("decode_s_est") == pytest.approx(spread, abs=0.01) and spread < one_gpu / 3
    speed = " ".join(str(plan).split())
    assert f"decode {spread:.1f} s over {m.group(3)} GPUs (vae_parallel)" in speed or \
        f"decode {spread:.2f} s over {m.group(3)} GPUs (vae_parallel)" in speed
    assert plan.derived_value("call_s_est") == pytest.approx(plan.derived_value("denoise_s_est") + spread, abs=0.02)


def test_an_fp32_decode_gathers_fp32_tiles():
    """The installed gather moves the decoder's output dtype (proj_out's weights: float32 at vae_precision=fp32), twice
    the bytes of an fp16 decode's tiles."""
    def gib(vae):
        reasons = resolve_config(hardware="sm90", parallel="u4", **{"recipe.vae": vae}).decision("vae_parallel").reasons
        return float(re.search(r"gather buffer ([\d.]+) GiB", " ".join(reasons)).group(1))

    assert gib("fp32") == pytest.approx(2 * gib("fp16"), rel=0.01)

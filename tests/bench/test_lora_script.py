"""benchmarks/lora.py's CPU smoke form (tiny pipeline, host clock): every row runs, the bf16 plan with a LoRA loaded
after install is bitwise its same-backend reference, the fp8 plan's refusal is h3plan's one line, and the run is
written with its checks and its pairs of latents (what the H200 run will commit)."""

import json

import pytest
from scripts import load_script

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
pytest.importorskip("peft", reason="diffusers' LoRA loading needs peft (the test extra)")


EAGER = ["levers.qk_norm_rope=eager", "levers.modulation=eager", "levers.gated_residual=off", "levers.swiglu=off"]


@pytest.mark.slow  # seven denoise calls of the tiny pipeline (~60 s; the block kernels off: the interpreter is slow)
def test_the_cpu_smoke_form_runs_every_row_and_records_its_checks(tmp_path):
    lora = load_script("benchmarks/lora.py")
    argv = ["model=h3_tiny", "vae=h3_tiny_pipe", "hardware=sm90", *EAGER, "--video", "32x32x124", "--layers", "1",
            "--steps", "1", "--text-tokens", "4", "--out", str(tmp_path)]
    assert lora.main(argv) == 0
    run, = json.loads((tmp_path / "lora-cpu.json").read_text())["runs"]
    rows = {r["row"]: r for r in run["rows"]}
    assert list(rows) == ["bf16", "bf16 + lora a", "reference + lora a", "eager + lora a", "fp8", "fp8 + lora a fused",
                          "eager + lora a fused"]
    assert set(run["checks"].values()) == {"PASS"}, run["checks"]
    assert run["latents"]["bf16 + lora a vs reference + lora a"]["bitwise"]
    assert not run["latents"]["bf16 + lora a vs bf16"]["bitwise"]  # the LoRA ran
    assert rows["fp8"]["refusal"].startswith("load_lora_adapter: the installed plan bypasses")
    assert {"load_after_install_s", "set_adapters_s"} <= set(rows["bf16 + lora a"])
    assert "way_s" in rows["fp8 + lora a fused"]
    assert "| bf16 + lora a vs reference + lora a | True |" in (tmp_path / "lora-cpu.md").read_text()

"""The same CLI entry (h3plan.cli.run) in-process: more bad inputs (one stderr line, exit 2) and the
action dispatch, without paying an interpreter start each."""

import sys
import types

import pytest

from h3plan import cli
from h3plan.actions import gpu_only

BAD = [
    (["hardware=sm200"], "hardware=sm200: no such option; available: sm100, sm103, sm107, sm90"),
    (["levers.attention=fa5"], "levers.attention=fa5: not allowed; allowed: auto, sdpa, cudnn_bf16, cudnn_fp8, fa4"),
    (["levers.atention=fa4"], "levers.atention: unknown key (did you mean levers.attention?); allowed: gemm_quant, "
                              "adaln_table, attention,"),
    (["parallel.seq_len=-5"], "parallel.seq_len=-5: must be a positive integer"),
    (["parallel.seq_len=abc"], "parallel.seq_len: Value 'abc'"),
    (["model=h3_tiny", "parallel=u8"], "must divide the 4 attention heads of model h3_tiny; allowed: 1, 2, 4"),
    (["levers.fa4_2cta=on"], "levers.fa4_2cta=on cannot apply: sm90 has no FA4 2-CTA kernel"),
    (["hardware.device.sm_count=???"], "hardware.device.sm_count: missing value"),
    (["parallel.seq_len=["], "cannot parse the override"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["format=xml"], "format=xml: not allowed; allowed: table, yaml, json"),
    # `+key=` adds a key past Hydra's struct check: the schema walk refuses it (with the near miss)
    (["+levers.attentoin=cudnn_fp8"], "levers.attentoin: unknown key (did you mean levers.attention?); allowed: "
                                      "gemm_quant,"),
    (["+video.fpss=30"], "video.fpss: unknown key (did you mean video.fps?); allowed: name, height"),
    (["+hardware.foo=1"], "hardware.foo: unknown key; allowed: name, arch,"),
    (["+foo=1"], "foo: unknown key; allowed: action, format,"),
    (["++verify.sead=1"], "verify.sead: unknown key (did you mean verify.seed?)"),
    # values in range: a step count diffusers' scheduler refuses, a GPU of no memory ...
    (["pipeline.num_inference_steps=1"], "pipeline.num_inference_steps=1: must be >= 2: diffusers' MiniMaxH3Scheduler"),
    (["pipeline.num_inference_steps=0"], "pipeline.num_inference_steps=0: must be >= 2"),
    (["pipeline.num_inference_steps=-5"], "pipeline.num_inference_steps=-5: must be >= 2"),
    (["hardware.device.memory_gb=0"], "hardware.device.memory_gb=0.0: must be a positive number of GB"),
    # every rate, bandwidth and size is positive: a zero one divided by zero, a negative one planned a negative time
    (["memory.host_link_gbps=0", "memory.text_encoder=offload_after"], "memory.host_link_gbps=0.0: must be a positive "
                                                                       "number of GB/s"),
    (["memory.host_link_gbps=-5", "memory.text_encoder=host"], "memory.host_link_gbps=-5.0: must be a positive number"),
    (["hardware.device.nvlink_gbps=0", "parallel=u2"], "hardware.device.nvlink_gbps=0.0: must be a positive number"),
    (["hardware.device.nic_gbps=0"], "hardware.device.nic_gbps=0.0: must be a positive number of GB/s (null: not "
                                     "known"),
    (["hardware.device.hbm_tbps=-1"], "hardware.device.hbm_tbps=-1.0: must be a positive number of TB/s"),
    (["hardware.measured.gemm_tflops.bf16=0"], "hardware.measured.gemm_tflops.bf16=0.0: must be a positive number of "
                                               "TFLOP/s"),
    (["parallel.seq_len=1"], "parallel.seq_len=1: fewer rows than the 110 text rows of the request"),
    (["memory.max_ulysses=0"], "memory.max_ulysses=0: must be >= 1"),
    (["verify.blocks=0"], "verify.blocks=0: must be >= 1"),
    # the step cache's budget is in range as the kernel levers' is; the device's memory is given once
    (["recipe.cache={psnr_db_min:-5,ssim_min:1.5}"], "recipe.cache.psnr_db_min=-5.0: must be in (0, 100] dB"),
    (["recipe.cache={psnr_db_min:28,ssim_min:1.5}"], "recipe.cache.ssim_min=1.5: must be in (0, 1]"),
    (["recipe.cache={psnr_db_min:0,ssim_min:0.9}"], "recipe.cache.psnr_db_min=0.0: must be in (0, 100] dB"),
    (["hardware.device.memory_gb=80", "hardware.device.memory_gib=70"], "hardware.device.memory_gb=80 "
     "hardware.device.memory_gib=70: the device's memory given twice, in GB and in GiB (memory_gib would win)"),
    (["recipe=fp8", "recipe.budget.psnr_db_min=200"], "recipe.budget.psnr_db_min=200.0: must be in (0, 100] dB"),
    (["action=calibrate", "calibrate.target=nope"], "calibrate.target=nope: allowed: fp8_scales, sparse_attention, "
                                                    "step_cache"),
    (["memory.vae_dtype=fp16"], "memory.vae_dtype=fp16 sizes a VAE loaded in fp16, which decodes in fp16, but the plan "
                                "decodes in fp32 (vae_precision=fp32): set recipe.vae=fp16"),
]


# a list or a repeated group where one option is expected: Hydra would merge the list, or take the last
SEVERAL = "one plan per call: pick one option"
BAD += [
    (["recipe=[nvfp4,fp8]"], f"recipe=[nvfp4,fp8]: {SEVERAL} (bf16, fp8, nvfp4); to plan several, call once per option "
                             "or sweep: python -m h3plan -m recipe=nvfp4,fp8"),
    (["hardware=[sm90,sm100]"], f"hardware=[sm90,sm100]: {SEVERAL}"),
    (["hardware=sm90", "hardware=sm100"], f"hardware=sm90 hardware=sm100: {SEVERAL} (sm100, sm103, sm107, sm90)"),
    (["-m", "hardware=sm90", "hardware=sm100"], f"hardware=sm90 hardware=sm100: {SEVERAL}"),
    (["-m", "recipe=[bf16,fp8]"], f"recipe=[bf16,fp8]: {SEVERAL}"),
    (["--cfg", "job", "recipe=fp8", "recipe=bf16"], f"recipe=fp8 recipe=bf16: {SEVERAL}"),
]


@pytest.mark.parametrize("argv,fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input(capsys, argv, fragment):
    assert cli.run(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], err
    assert out == ""


def test_action_dispatch(capsys, monkeypatch):
    seen = {}

    def fake_run(cfg, plan):
        seen["attention"] = plan.decision("attention").setting
        seen["blocks"] = cfg.bench.blocks
        return 3

    monkeypatch.setitem(sys.modules, "h3plan.actions.bench", types.SimpleNamespace(run=fake_run))
    monkeypatch.setattr(gpu_only, "no_gpu_here", lambda: False)  # a GPU may be here: the action decides
    assert cli.run(["action=bench", "bench.blocks=[2]"]) == 3
    assert seen == {"attention": "fa4", "blocks": [2]}
    assert capsys.readouterr().out == ""


def test_unknown_action_module():
    from h3plan.actions import run_action
    from h3plan.errors import UsageError

    cfg = types.SimpleNamespace(action=types.SimpleNamespace(name="nonexistent"))
    with pytest.raises(UsageError, match="unknown action 'nonexistent'"):
        run_action(cfg, None)


def test_missing_torch_is_an_install_hint_not_an_internal_error(capsys, monkeypatch):
    def needs_torch(cfg, plan):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setitem(sys.modules, "h3plan.actions.verify", types.SimpleNamespace(run=needs_torch))
    monkeypatch.setattr(gpu_only, "no_gpu_here", lambda: False)
    assert cli.run(["action=verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("h3plan: error: action=verify needs 'torch', which is not installed: pip install -e "
                          "'.[runtime]'")
    assert "internal error" not in err and len(err.splitlines()) == 1


def test_table_marks_unverified_and_keeps_order(capsys):
    assert cli.run(["hardware=sm90"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[1].splitlines()[1:]  # header line, blank, lever table, blank, derived
    rows = [line.split()[0] for line in table if not line.startswith(" ")]
    from h3plan.levers import REGISTRY, SPECS

    assert rows == [n for n in REGISTRY if not SPECS[n].table_skips_off]  # a t2va request: the encode levers are off
    qk = next(line for line in out.splitlines() if line.startswith("qk_norm_rope"))
    assert " * " not in qk  # the fused kernels passed the H200 suite (conf/hardware/sm90.yaml verified)
    assert cli.run(["hardware=sm107"]) == 0
    out = capsys.readouterr().out
    att = next(line for line in out.splitlines() if line.startswith("attention "))
    assert " * " in att  # nothing ever ran on sm107


def test_off_grid_request_gives_the_command_that_works(capsys):
    """video.height=720 is refused in one line that ends with a command; that command plans (exit 0)."""
    assert cli.run(["video.height=720", "video.seconds=10"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nearest: 704 or 736" in err
    head, sep, command = err.partition("; this works: python -m h3plan ")
    assert sep and command == "video.height=704 video.seconds=10"
    assert cli.run(command.split()) == 0
    assert ("request  video=t2v_768x1344_5s with video.height=704 video.seconds=10: 704x1344 px, 243 frames"
            in capsys.readouterr().out)


def test_help_lists_every_action_and_request_key(capsys):
    assert cli.run(["--help"]) == 0
    out = capsys.readouterr().out
    for key in ("action=plan|verify|bench|calibrate", "memory.offload", "memory.check", "video.height=",
                "video.seconds=",
                "video.frames=", "parallel.seq_len=N", "bench.target=block|pipeline"):
        assert key in out, key
    from h3plan.planning.config import compose

    def keys(prefix, node):
        for k, v in node.items():
            yield from keys(f"{prefix}{k}.", v) if hasattr(v, "items") else [f"{prefix}{k}"]

    cfg = compose([])
    for section in ("verify", "bench", "calibrate", "tune"):  # every action key, listed (not a source file to read)
        for key in keys(f"{section}.", cfg[section]):
            assert f" {key}=" in " ".join(out.split()), key
    assert "action_configs.py" not in out
    examples = [x.split()[3:] for x in out.splitlines() if x.startswith("  python -m h3plan ")]
    assert len(examples) >= 4
    for argv in examples:
        if not any(a.startswith("action=") for a in argv):  # the actions' own tests run those
            assert cli.run(argv) == 0, argv
    capsys.readouterr()


def test_a_sweep_value_without_m_keeps_hydras_hint(capsys):
    assert cli.run(["hardware=sm90,sm100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("To sweep over it, add --multirun to your command line"), err
    assert "key='value1,value2'" in err


def test_a_missing_search_path_is_one_warning_line(capsys, tmp_path):
    assert cli.run([f"hydra.searchpath=[file://{tmp_path}/none]"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"h3plan: warning: provider=hydra.searchpath in command-line, path={tmp_path}/none is "
                                f"not available."]
    assert out.startswith("h3plan  hardware=sm90")


@pytest.mark.slow  # an in-process sweep (~2-3 s a case)
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_sweep_honours_format(capsys, monkeypatch, tmp_path, fmt):
    import json

    import yaml

    monkeypatch.chdir(tmp_path)
    assert cli.run(["-m", "hardware=sm90,sm100", "recipe=bf16", f"format={fmt}"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert [(r["choices"]["hardware"], r["status"]) for r in rows] == [("sm90", "ok"), ("sm100", "ok")]
    assert "plans and summary (summary.json, summary.csv) in multirun/" in err


def test_out_writes_json_for_any_case_of_the_extension(capsys, tmp_path):
    import json

    from h3plan import Plan

    path = tmp_path / "p.JSON"
    assert cli.run([f"out={path}"]) == 0
    capsys.readouterr()
    assert json.loads(path.read_text())["schema_version"] == 1
    assert Plan.load(str(path)).get("hardware")["name"] == "sm90"


def test_values_at_their_edges_plan(capsys):
    """The smallest step count diffusers takes (2 sigma points: 1 forward) plans; a seq_len at the text rows too."""
    assert cli.run(["pipeline.num_inference_steps=2"]) == 0
    assert "1 transformer forwards (num_inference_steps 2)" in " ".join(capsys.readouterr().out.split())
    assert cli.run(["parallel.seq_len=110"]) == 0
    assert cli.run(["memory.vae_dtype=fp16", "recipe.vae=fp16"]) == 0


def test_a_peak_that_does_not_fit_says_so_with_check_off(capsys):
    """memory.check=false reports a peak over the GPU's memory instead of refusing it: the memory line says it."""
    assert cli.run(["hardware.device.memory_gb=40"]) == 2
    assert "does not fit one sm90 GPU" in capsys.readouterr().err
    assert cli.run(["hardware.device.memory_gb=40", "memory.check=false"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(40 GB = " in out and "DOES NOT FIT (memory.check=false: reported, not refused)" in out
    assert cli.run(["memory.check=false"]) == 0
    assert "DOES NOT FIT" not in capsys.readouterr().out


def test_a_vae_and_model_that_make_no_pipeline_say_so(capsys):
    """vae=h3_tiny beside the full model: the request line says where its 48 rows come from and that the two make no
    pipeline (the plan sizes each alone), instead of a silent 'set explicitly'."""
    assert cli.run(["vae=h3_tiny"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("parallel.seq_len=48 set explicitly (the video request does not apply: vae.diffusers_config.token_drop)"
            in out)
    assert "vae h3_tiny (latent_channels 4) and model h3 (in_channels 24) make no pipeline" in out
    assert cli.run(["model=h3_tiny", "vae=h3_tiny"]) == 0
    assert "make no pipeline" not in capsys.readouterr().out


NO_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "triton", "diffusers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from h3plan import cli
sys.exit(cli.run(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv,refusal", [
    (["action=verify"], gpu_only.verify_too_wide()),
    (["action=bench"], gpu_only.bench_too_wide(5376)),
    (["action=bench", "bench.target=pipeline"], gpu_only.pipeline_too_wide(5376, 2048)),
    (["action=calibrate", "recipe=fp8"], gpu_only.calibrate_too_wide()),
    (["action=calibrate", "calibrate.target=step_cache", "recipe.cache={psnr_db_min:28,ssim_min:0.9}"],
     gpu_only.calibrate_too_wide("step_cache")),
    (["action=tune"], gpu_only.TUNE_REFUSAL),
    (["-m", "action=verify", "recipe=bf16,fp8", "hydra.sweep.dir=SWEEP"], None),
], ids=["verify", "bench", "pipeline", "calibrate", "step_cache", "tune", "sweep"])
def test_gpu_only_actions_refuse_from_the_config_without_importing_torch(tmp_path, argv, refusal):
    """No GPU here (CUDA_VISIBLE_DEVICES hides every device): each real-width action is refused with its own line, and
    torch (blocked in this process: importing it would be a missing-torch error instead) is never imported."""
    import os
    import subprocess
    from pathlib import Path

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env.pop("HYDRA_FULL_ERROR", None)
    argv = [a.replace("SWEEP", str(tmp_path / "sweep")) for a in argv]
    p = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    if refusal is None:  # a sweep's jobs: each refused, the sweep says so in its table
        assert p.returncode == 0 and "2 invalid or failed" in p.stdout, p.stdout + p.stderr
        assert p.stdout.count("invalid: verify on the CPU needs a small model") == 2, p.stdout
        return
    assert (p.returncode, p.stderr) == (2, f"h3plan: error: {refusal}\n")


def test_no_gpu_here_is_known_without_torch(monkeypatch):
    monkeypatch.setattr(gpu_only.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpu_only.glob, "glob", lambda pattern: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_only.no_gpu_here()
    monkeypatch.setattr(gpu_only.glob, "glob", lambda pattern: [pattern] if pattern == "/proc/driver/nvidia" else [])
    assert not gpu_only.no_gpu_here()  # a driver: a GPU may be here, torch decides
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_only.no_gpu_here()  # every device hidden
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(gpu_only.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(gpu_only.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert not gpu_only.no_gpu_here()

"""benchmarks/pipeline_h200.sh's phases, dry (H3_DRY=1: each phase prints the command it would run): every phase the
script lists runs a command, and a comma list runs its phases in order, stopping at one the script does not know."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "pipeline_h200.sh"


def _dry(phase, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "H3_DRY": "1", "H3_PHASE": phase}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=60)


def _listed():
    usage = SCRIPT.read_text().split('*) echo "H3_PHASE: ', 1)[1].split(">&2", 1)[0]
    return [p for p in re.findall(r"[a-z0-9][a-z0-9-]*", usage.replace(" or ", ", ")) if p != "echo"]


def test_every_listed_phase_runs_a_command(tmp_path):
    phases = _listed()
    assert {"whole-lossless", "whole-fp8", "whole-tier", "whole-tier-fixed", "whole-cache-bf16",
            "turbo-fp16"} <= set(phases)
    for phase in phases:
        r = _dry(phase, tmp_path)
        assert r.returncode == 0 and r.stdout.startswith(f"phase {phase}: python benchmarks/"), (phase, r.stderr)


def test_a_phase_list_runs_in_order_and_stops_at_an_unknown_phase(tmp_path):
    r = _dry("whole-lossless,whole-fp8,whole-adaptive", tmp_path)
    assert r.returncode == 0
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == [
        "phase whole-lossless", "phase whole-fp8", "phase whole-adaptive"]
    assert all("--frames-dir /tmp/h3plan-frames" in line for line in r.stdout.splitlines())
    r = _dry("whole-lossless,no-such-phase,whole-fp8", tmp_path)
    assert r.returncode == 2 and "H3_PHASE:" in r.stderr
    assert r.stdout.splitlines() == [r.stdout.splitlines()[0]] and "whole-lossless" in r.stdout


def test_a_detached_run_goes_on_after_its_call_and_collect_brings_its_files(tmp_path):
    """H3_DETACH=1 returns at once with the phases running in a session of their own; H3_PHASE=collect waits for them
    and copies what they wrote into $OUT."""
    detached, out = tmp_path / "detached", tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "first"), "H3_DRY": "1", "H3_DETACHED": str(detached)}
    phases = "whole-best-10s,whole-tier-10s"
    r = subprocess.run(["bash", str(SCRIPT)], env={**env, "H3_DETACH": "1", "H3_PHASE": phases},
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("detached: phases whole-best-10s,whole-tier-10s"), r.stderr
    r = subprocess.run(["bash", str(SCRIPT)], env={**env, "OUT": str(out), "H3_PHASE": "collect", "H3_T_PHASE": "50"},
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "collect: the detached run ended" in r.stdout, (r.stdout, r.stderr)
    log = (out / "detached.log").read_text().splitlines()
    assert [line.split(":")[0] for line in log] == ["phase whole-best-10s", "phase whole-tier-10s"]
    assert all("video=t2v_768x1344_10s" in line and "--video 768x1344x243" in line for line in log)
    assert not (out / "done").exists()


def test_collect_without_a_detached_run_says_so(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "H3_PHASE": "collect",
           "H3_DETACHED": str(tmp_path / "none")}
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == f"collect: nothing detached in {tmp_path / 'none'}"

"""On a machine with no GPU an action's Triton kernels run in Triton's interpreter, which has to be chosen before triton
is first imported: triton.language's own jit helpers (tl.zeros, ...) are made when it loads, and a compiled helper
called from an interpreted kernel raises "Cannot call @triton.jit'd outside of the scope of a kernel". Each case runs in
a fresh interpreter without TRITON_INTERPRET (this suite's conftest sets it for its own process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    env["CUDA_VISIBLE_DEVICES"] = ""  # gpu_only.no_gpu_here() on any machine
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_an_action_chooses_the_interpreter_before_its_imports_load_triton():
    """run_action on a machine with no GPU: the action's own imports (diffusers -> torch._dynamo -> triton) find the
    interpreter chosen, so triton.language's helpers are interpreted too."""
    r = _python(
        "import os, sys\n"
        "from types import SimpleNamespace\n"
        "import h3plan.actions as actions\n"
        "assert actions.gpu_only.no_gpu_here() and 'triton' not in sys.modules\n"
        "def action(cfg, plan):\n"
        "    import diffusers.hooks, triton.language as tl\n"
        "    from triton.runtime.interpreter import InterpretedFunction\n"
        "    print(os.environ.get('TRITON_INTERPRET'), isinstance(tl.zeros, InterpretedFunction))\n"
        "    return 0\n"
        "actions.get_action = lambda name: action\n"
        "actions.gpu_only.refusal = lambda action, cfg, plan: None\n"
        "sys.exit(actions.run_action(SimpleNamespace(action=SimpleNamespace(name='verify')), None))\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "True"]


def test_a_user_who_chose_stays_chosen():
    code = ("import os\nos.environ['TRITON_INTERPRET'] = '0'\nfrom h3plan.actions import interpret_triton\n"
            "interpret_triton()\nprint(os.environ['TRITON_INTERPRET'])\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0"]


@pytest.mark.parametrize("key", ["verify.device", "calibrate.device"])
def test_cpu_after_triton_loaded_compiled_is_one_line(key):
    """The Python API after the caller imported diffusers (so triton, compiled): refused in one line naming the fix,
    not a Triton interpreter error from inside the model's forward."""
    r = _python(
        "import triton\n"
        "from h3plan.errors import UsageError\n"
        "from h3plan.actions.verify import _prepare_device\n"
        "try:\n"
        f"    _prepare_device('cpu', {key!r})\n"
        "except UsageError as e:\n"
        "    print('refused:', e)\n")
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip()
    assert line.startswith(f"refused: {key}=cpu") and "TRITON_INTERPRET=1" in line and "\n" not in line


@pytest.mark.slow  # two tiny calibrations, seconds each
@pytest.mark.parametrize("target", ["step_cache", "sparse_attention"])
def test_the_cpu_form_a_refusal_gives_runs_and_writes_its_plan(tmp_path, target):
    """The command calibrate_too_wide hands a CPU user (the tiny pipeline, diffusers' own ops) runs to its plan."""
    import shlex

    from h3plan.actions.gpu_only import OWN_BUDGET_SMOKE, calibrate_too_wide

    assert calibrate_too_wide(target).endswith(OWN_BUDGET_SMOKE[target])
    argv = shlex.split(OWN_BUDGET_SMOKE[target])
    assert argv[:3] == ["python", "-m", "h3plan"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-m", "h3plan", *argv[3:], f"calibrate.plan_out={tmp_path / 'plan.yaml'}",
                        f"calibrate.evidence_out={tmp_path / 'points.yaml'}"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "plan.yaml").is_file() and (tmp_path / "points.yaml").is_file()

"""H200: `action=tune tune.quick=true` end to end (under 10 minutes): it writes a tuned hardware file that loads
through the search path, records this machine's provenance, is not stale here, and the plan on it says where it was
measured. Prints the tune's last lines.

    python -m pytest tests/gpu/test_tune_gpu.py -m gpu -q -rA -s
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from h3plan.planner import resolve
from h3plan.facts import tuned
from h3plan.planning.config import compose

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def test_quick_tune_writes_a_loadable_fresh_file(tmp_path):
    out = tmp_path / "hardware" / "sm90_tuned.yaml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-m", "h3plan", "action=tune", "tune.quick=true", f"tune.out={out}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    print(p.stdout[-2000:], p.stderr[-2000:])
    assert p.returncode == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["tuned"]["device"].startswith("NVIDIA") and doc["measured"]["attention"][0]["fa4"] > 0
    assert not list(out.parent.glob("*.part"))
    plan = resolve(compose([f"hydra.searchpath=[file://{tmp_path}]", "hardware=sm90_tuned", "strict=true"]))
    assert tuned.stale(plan.get("hardware")["tuned"])[0] == []
    assert plan.derived_value("forward_s_est") > 0 and plan.derived_value("call_s_est") > 0

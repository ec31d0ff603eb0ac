"""Run the CLI as a user would: a subprocess in an empty directory (so a stray outputs/ shows)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(tmp_path):
    def _run(*args, timeout=120):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        env.pop("HYDRA_FULL_ERROR", None)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "h3plan", *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=timeout)
        p.wall = time.perf_counter() - t0
        return p

    _run.cwd = tmp_path
    return _run

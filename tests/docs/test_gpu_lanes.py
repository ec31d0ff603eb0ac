"""The one-GPU suite's lanes (tests/gpu/lanes.txt, run by benchmarks/gpu_suite_h200.sh with H3_GPU_LANE=N, one
device call each): every one-GPU file of tests/gpu sits in exactly one lane and the NCCL files in none, each lane
named in tests/gpu/README.md, and the script refuses a lane that does not exist."""

import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "gpu"


def lanes() -> list[tuple[str, str]]:
    rows = [line.split() for line in (GPU / "lanes.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert all(len(r) == 2 for r in rows), rows
    return [(lane, name) for lane, name in rows]


def test_every_one_gpu_file_is_in_exactly_one_lane():
    one_gpu = {p.name for p in GPU.glob("test_*.py") if "nccl" not in p.name and "ring" not in p.name}
    listed = Counter(name for _, name in lanes())
    assert sorted(n for n, c in listed.items() if c > 1) == []
    assert sorted(one_gpu - set(listed)) == [], "a one-GPU test file in no lane: add it to tests/gpu/lanes.txt"
    assert sorted(set(listed) - one_gpu) == [], "a lane lists a file that is not a one-GPU test file"


def test_lanes_are_documented():
    readme = (GPU / "README.md").read_text()
    for lane in sorted({lane for lane, _ in lanes()}):
        assert f"H3_GPU_LANE={lane}" in readme
        for _, name in (x for x in lanes() if x[0] == lane):
            assert name in readme, f"tests/gpu/README.md does not name {name} (lane {lane})"


def test_script_refuses_an_unknown_lane(tmp_path):
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_suite_h200.sh")],
                       env={"H3_GPU_LANE": "9", "OUT": str(tmp_path),
                       "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == "H3_GPU_LANE=9: no such lane in tests/gpu/lanes.txt (lanes: 1 2 3 4)"

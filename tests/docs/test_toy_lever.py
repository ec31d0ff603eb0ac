"""A new lever touches h3plan/levers/ (its module, its name in NAMES) and tests, nothing else: planning, the CLI,
--help, the config's refusals, the plan's table and install reach it through the registry. The proof: a copy of the
package gains a toy lever that way only, and every entry point takes it (run in fresh interpreters on the copy)."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TOY = '''
"""A toy lever: off or on, lossless; its install leaves the model as it is and says so."""
from __future__ import annotations

from .base import Context, Spec, resolve

SPEC = Spec(name="toy", settings={"off": True, "on": True}, summary="a toy lever of the house's proof test")


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=lambda ctx, s: [], auto=lambda ctx: ("off", ["the toy: off unless forced"], {}),
                   params=lambda ctx, s: {"asked": s})


def install(builder, decision) -> None:
    builder.skip(SPEC.name, f"the toy is {decision.setting} ({decision.param('asked')}): nothing to swap")
'''


@pytest.fixture(scope="module")
def house(tmp_path_factory):
    """A copy of h3plan/ (its conf/ link made a folder) with the toy lever added under levers/ only."""
    root = tmp_path_factory.mktemp("house")
    shutil.copytree(ROOT / "h3plan", root / "h3plan", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    levers = root / "h3plan" / "levers"
    (levers / "toy.py").write_text(TOY)
    init = (levers / "__init__.py").read_text()
    last = '"vae_encode_tiles")'
    assert init.count(last) == 1, "levers/__init__.py's NAMES no longer ends with vae_encode_tiles: update the test"
    (levers / "__init__.py").write_text(init.replace(last, '"vae_encode_tiles", "toy")'))
    changed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                     if not (ROOT / p.relative_to(root)).is_file()
                     or (ROOT / p.relative_to(root)).read_bytes() != p.read_bytes())
    assert changed == ["h3plan/levers/__init__.py", "h3plan/levers/toy.py"]
    return root


def _run(house, *args, code=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(house), CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "h3plan", *args]
    return subprocess.run(argv, cwd=house, env=env, capture_output=True, text=True, timeout=600)


def test_the_copy_is_the_one_that_runs(house):
    res = _run(house, code="import h3plan; print(h3plan.__file__)")
    assert res.stdout.strip() == str(house / "h3plan" / "__init__.py"), res.stderr


def test_auto_plans_it_off_with_its_reason(house):
    res = _run(house, "detail=full")
    assert res.returncode == 0, res.stderr[-2000:]
    (row,) = [x for x in res.stdout.splitlines() if x.startswith("toy ")]
    assert row.split()[1] == "off" and "the toy: off unless forced" in res.stdout


def test_a_forced_setting_plans_and_install_reaches_it(house):
    res = _run(house, "levers.toy=on")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "forced   levers.toy=on" in res.stdout
    assert "the toy is on (on): nothing to swap" in res.stdout  # its install, called through the registry


def test_help_lists_it_and_the_config_refuses_a_setting_it_lacks(house):
    res = _run(house, "--help")
    assert res.returncode == 0 and "toy" in res.stdout and "a toy lever of the house's proof test" in res.stdout
    bad = _run(house, "levers.toy=bogus")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "levers.toy=bogus: not allowed; allowed: auto, off, on" in bad.stderr


def test_install_on_the_tiny_model_calls_its_install(house):
    code = textwrap.dedent("""
        import h3plan, torch
        from h3plan.actions.inputs import build_model
        from h3plan.planning.config import compose
        cfg = compose(["model=h3_tiny", "levers.toy=on", "levers.compile=off"])
        model = build_model(cfg.model.diffusers_config, dtype=torch.bfloat16, seed=0)
        assert sum(p.numel() for p in model.parameters()) < 10**7, "not the tiny model"
        print(h3plan.install(model, h3plan.resolve(cfg)).summary())
        h3plan.uninstall(model)
        print("uninstalled")
    """)
    res = _run(house, code=code)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "the toy is on (on): nothing to swap" in res.stdout and "uninstalled" in res.stdout

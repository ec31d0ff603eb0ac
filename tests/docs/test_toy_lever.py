"""A new lever touches h3plan/levers/ (its module, its name in NAMES), its kernel under h3plan/runtime/kernels/ and
tests, nothing else: planning, the CLI, --help, the config's refusals, the plan's table and install reach it through
the registry; a kernel module declares its ops itself (OPS), and a lever with a call site of its own installs it
through its `Spec.model_step` (install/site.py). The proof: a copy of the package gains two toy levers that way only,
one without a kernel and one with a Triton kernel at a call site no installer step has, and every entry point takes
them (run in fresh interpreters on the copy)."""

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


TOY_KERNEL = '''
"""A toy lever with a kernel of its own at a call site of its own: the transformer's proj_out output goes through
toy_copy (a Triton copy, exact). Its install is its SPEC's model_step: a wrapping forward on proj_out, handed by the
site; it imports no torch."""
from __future__ import annotations

from .base import Context, Spec, resolve


def _step(model, decision, site):
    fn, check = site.kernel("toy_copy")

    def forward(previous, *args, **kwargs):
        y = previous(*args, **kwargs)
        return site.guarded(lambda: check(y), lambda: fn(y), lambda: y, (y,))

    site.attach(model.proj_out, "proj_out", forward, replaces=False)
    site.swap("proj_out.forward", "Linear", "Linear + toy_copy")


SPEC = Spec(name="toy_kernel", settings={"off": True, "on": True}, summary="a toy lever with a kernel of its own",
            counter="toy_kernel", kernels=("toy_copy",), model_step=_step)


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=lambda ctx: ("off", ["the toy kernel: off unless forced"], {}))


def install(builder, decision) -> None:
    if not decision.enabled:
        builder.skip(SPEC.name, decision.reasons[0])
'''

TOY_COPY = '''
"""A copy in one Triton kernel (the toy lever's): out = x, bit for bit."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import guard, tensor_checks
from h3plan.runtime.kernels._registry import custom_op


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


def toy_copy_check(x) -> str | None:
    return guard(tensor_checks("x", x, (torch.bfloat16, torch.float32)))


@custom_op("toy_copy", fake=lambda x: torch.empty_like(x))
def _toy_copy_op(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    if x.numel():
        _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


def toy_copy(x):
    reason = toy_copy_check(x)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.toy_copy(x)


OPS = {"toy_copy": ("toy_copy", "toy_copy_check")}
'''


@pytest.fixture(scope="module")
def house(tmp_path_factory):
    """A copy of h3plan/ (its conf/ link made a folder) with the toy lever added under levers/ only."""
    root = tmp_path_factory.mktemp("house")
    shutil.copytree(ROOT / "h3plan", root / "h3plan", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    levers = root / "h3plan" / "levers"
    (levers / "toy.py").write_text(TOY)
    (levers / "toy_kernel.py").write_text(TOY_KERNEL)
    (root / "h3plan" / "runtime" / "kernels" / "toy_copy.py").write_text(TOY_COPY)
    init = (levers / "__init__.py").read_text()
    last = '"vae_encode_tiles")'
    assert init.count(last) == 1, "levers/__init__.py's NAMES no longer ends with vae_encode_tiles: update the test"
    (levers / "__init__.py").write_text(init.replace(last, '"vae_encode_tiles", "toy", "toy_kernel")'))
    changed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                     if not (ROOT / p.relative_to(root)).is_file()
                     or (ROOT / p.relative_to(root)).read_bytes() != p.read_bytes())
    assert changed == ["h3plan/levers/__init__.py", "h3plan/levers/toy.py", "h3plan/levers/toy_kernel.py",
                       "h3plan/runtime/kernels/toy_copy.py"]
    return root


def _run(house, *args, code=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(house), CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
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


def test_the_kernel_lever_plans_and_its_op_is_the_runtime_table_s(house):
    res = _run(house, "levers.toy_kernel=on", "detail=full")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "forced   levers.toy_kernel=on" in res.stdout
    assert "nothing is installed" not in res.stdout  # its model_step installs it: no "no kernel" line
    code = textwrap.dedent("""
        from h3plan.levers import KERNEL_OPS
        from h3plan.runtime.kernels.table import kernel, ops
        fn, check = kernel("toy_copy")
        print(KERNEL_OPS["toy_copy"], fn.__module__, sorted(ops()) == sorted(KERNEL_OPS))
    """)
    res = _run(house, code=code)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["toy_kernel", "h3plan.runtime.kernels.toy_copy", "True"]


def test_the_kernel_lever_installs_its_call_site_runs_its_kernel_and_uninstalls(house):
    code = textwrap.dedent("""
        import h3plan, torch
        from h3plan.actions.inputs import build_model
        from h3plan.install.hooks import installed
        from h3plan.planning.config import compose
        from h3plan.runtime.counters import counters, reset_counters
        cfg = compose(["model=h3_tiny", "levers.toy_kernel=on", "levers.compile=off"])
        model = build_model(cfg.model.diffusers_config, dtype=torch.bfloat16, seed=0)
        from h3plan.actions.inputs import packed_inputs
        inputs = packed_inputs(cfg.model.diffusers_config, 64, seed=0)
        with torch.no_grad():
            before = model(**inputs).sample
            report = h3plan.install(model, h3plan.resolve(cfg))
            reset_counters()
            after = model(**inputs).sample
            fused = counters().get("toy_kernel.fused", 0)
            hooks = [f"{fqn}:{h}" for fqn, h in installed(model) if "toy" in h]
            h3plan.uninstall(model)
            again = model(**inputs).sample
        print("swap", any(s.lever == "toy_kernel" for s in report.swaps))
        print("hooks", hooks)
        print("fused", fused)
        print("bitwise", torch.equal(before, after), torch.equal(before, again))
        print("left", installed(model))
    """)
    res = _run(house, code=code)
    assert res.returncode == 0, res.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in res.stdout.strip().splitlines())
    assert out["swap"] == "True" and out["hooks"] == "['proj_out:h3plan.toy_kernel']", res.stdout
    assert int(out["fused"]) >= 1  # its kernel ran at its call site
    assert out["bitwise"] == "True True" and out["left"] == "[]"

"""The settings of the pipeline bench, each switched in place on the ONE pipeline they share (one pipeline in
memory for the whole run, holding the one transformer partition its workflow runs: pipeline.py). `enter()` before a
setting's turn, `exit()` after it, leaving the modules as diffusers built them (except Best at U > 1, which diffusers
cannot undo and the bench runs last):
- Eager(vae): diffusers as it ships, the VAE in `vae` (fp32: as built; fp16 / bf16: cast the way
  `from_pretrained(torch_dtype=...)` casts it, `_keep_in_fp32_modules` kept, and cast back on exit).
- PlanSetting(plan): install_pipeline / uninstall_pipeline (the plan casts the VAE itself: vae_precision).
- Reference(plan): the plan's attention levers only, in the transformer, and the VAE in the plan's decode
  precision: diffusers eager with the plan's attention backend and VAE dtype, which a plan whose other levers
  are lossless must match bit for bit.
- Best(vae): diffusers' best setting (the regional compile: diffusers_best.py, shared with the block bench),
  the VAE as Eager(vae). U = 1: regional compile once, its compiled callables switched on
  (`block._compiled_call_impl`) for Best's turns and off otherwise, so no turn recompiles. U > 1:
  set_attention_backend(cp_backend) + enable_parallelism(ContextParallelConfig(ulysses_degree=U,
  ulysses_anything=S % U != 0)) + the regional compile.
"""

from __future__ import annotations

from h3plan import prepare
from h3plan.install import install, uninstall
from h3plan.install.pipeline import install_pipeline, uninstall_pipeline
from h3plan.facts.workflows import DEFAULT_TASK, request_conditions
from h3plan.install.vae.weights import DTYPES, PrecisionCast

from ..pipeline_build import denoiser
from .diffusers_best import compile_call, regional_compile
from .harness import plan_label, same_backend_plan
from .roles import DECODE_PRECISION


def plan_precision(plan) -> str:
    try:
        return plan.decision(DECODE_PRECISION).setting
    except (KeyError, ValueError):
        return "fp32"


def row_label(plan) -> str:
    """The plan's label with its decode precision where it is not diffusers' fp32 (recipe.vae is no forced lever)."""
    p = plan_precision(plan)
    return plan_label(plan) + ("" if p == "fp32" else f" +vae={p}")


class VaeCast:
    """The VAE in `precision` for a turn: from_pretrained(torch_dtype)'s cast (h3plan/install/vae/weights.py),
    undone on exit."""

    def __init__(self, pipe, precision: str):
        self.pipe, self.precision, self.cast = pipe, precision, None

    def enter(self):
        if self.precision != "fp32":
            self.cast = PrecisionCast.apply(self.pipe.vae, DTYPES[self.precision])

    def exit(self):
        if self.cast is not None:
            self.cast.restore()
            self.cast = None


class Setting:
    name = ""
    label = ""
    vae = "fp32"

    def enter(self) -> None:
        pass

    def exit(self) -> None:
        pass


class Eager(Setting):
    name = "eager"
    label = "diffusers eager"

    def __init__(self, pipe, vae: str = "fp32"):
        self.vae, self._cast = vae, VaeCast(pipe, vae)

    def enter(self):
        self._cast.enter()

    def exit(self):
        self._cast.exit()


class PlanSetting(Setting):
    name = "plan"
    stock = False  # the stock-bits plan (bench.pipeline.stock_bits): its frames must be diffusers eager's

    def __init__(self, pipe, plan, group, progress, num_inference_steps=None, workflow=DEFAULT_TASK):
        self.pipe, self.plan, self.group, self.progress, self.report = pipe, plan, group, progress, None
        self.label, self.vae = row_label(plan), plan_precision(plan)
        self.steps = num_inference_steps  # the bench's short calls: their timesteps join an adaln table too
        self.workflow = workflow  # and the rows of its request (keyframes, references: facts/workflows.py)

    def enter(self):
        report = install_pipeline(self.pipe, self.plan, group=self.group)
        if self.steps is not None:
            prepare(self.pipe, num_inference_steps=self.steps, **request_conditions(self.workflow))
        if self.report is None:
            self.progress.write(str(report))
        self.report = report

    def exit(self):
        uninstall_pipeline(self.pipe)


class Reference(Setting):
    """diffusers eager with the plan's attention levers and the plan's VAE dtype (a lossless plan's bitwise
    reference)."""

    name = "reference"
    of = None  # the PlanSetting this row checks

    @staticmethod
    def label_of(plan) -> str:
        return "eager with " + row_label(plan) + "'s attention"

    def __init__(self, pipe, plan):
        self.pipe, self.plan = pipe, same_backend_plan(plan)
        self.vae, self.label = plan_precision(plan), self.label_of(plan)
        self._cast = VaeCast(pipe, self.vae)

    def enter(self):
        install(denoiser(self.pipe), self.plan)
        self._cast.enter()

    def exit(self):
        self._cast.exit()
        uninstall(denoiser(self.pipe))


class Best(Setting):
    name = "best"

    def __init__(self, pipe, degree: int, seq_len: int, opts, vae: str = "fp32", shared: "Best | None" = None):
        # opts: pipeline.PipelineBenchOptions; shared: the Best of another VAE dtype whose compile this reuses
        self.pipe, self.degree, self.opts, self.vae = pipe, degree, opts, vae
        self._cast = VaeCast(pipe, vae)
        self.anything = degree > 1 and seq_len % degree != 0
        self.state = shared.state if shared is not None else {"blocks": None, "compiled": None}
        compile_ = compile_call("transformer", opts.compile_backend)
        if degree == 1:
            self.config = f"{compile_}; diffusers' default attention; the VAE as Eager's ({vae})"
        else:
            any_ = ", ulysses_anything=True" if self.anything else ""
            self.config = (f"transformer.set_attention_backend({opts.cp_backend!r}) + enable_parallelism(config="
                           f"ContextParallelConfig(ulysses_degree={degree}{any_})) + {compile_}; the VAE as Eager's "
                           f"({vae}) on every rank")
        self.label = self.label_of(opts)

    @staticmethod
    def label_of(opts) -> str:
        return "diffusers " + compile_call("transformer", opts.compile_backend).split(";")[0]

    def enter(self):
        t, st = denoiser(self.pipe), self.state
        if st["compiled"] is None:
            if self.degree > 1:
                import torch
                from diffusers import ContextParallelConfig

                if not torch.accelerator.is_available():  # it maps ranks onto accelerator devices (rank % count)
                    raise RuntimeError("diffusers' enable_parallelism needs an accelerator; this run has none")

                t.set_attention_backend(self.opts.cp_backend)
                t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=self.degree,
                                                                  ulysses_anything=self.anything))
            st["blocks"] = regional_compile(t, self.opts.compile_backend)
            st["compiled"] = [b._compiled_call_impl for b in st["blocks"]]
        else:
            for b, c in zip(st["blocks"], st["compiled"]):
                b._compiled_call_impl = c
        self._cast.enter()

    def exit(self):
        self._cast.exit()
        if self.degree == 1 and self.state["blocks"]:  # the plain blocks again for the other settings; the code is kept
            for b in self.state["blocks"]:
                b._compiled_call_impl = None

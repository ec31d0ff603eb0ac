"""The settings of the pipeline bench, each switched in place on the ONE pipeline they share (why: the memory
paragraph of pipeline_bench.py). `enter()` before a setting's turn, `exit()` after it, leaving the modules as
diffusers built them (except Best at U > 1, which diffusers cannot undo and the bench runs last):
- Eager: nothing (diffusers as it ships).
- PlanSetting: install_pipeline / uninstall_pipeline; the install report is printed once.
- Reference: the plan's attention levers only, in the transformer (diffusers eager with the plan's attention
  backend): the lossless plan's bitwise frames reference.
- Best: diffusers' best setting (the regional compile: diffusers_best.py, shared with the block bench); `config`
  is the one line the record carries. U = 1: regional compile once,
  its compiled callables switched on (`block._compiled_call_impl`) for Best's turns and off otherwise, so no
  turn recompiles. U > 1: set_attention_backend(cp_backend) + enable_parallelism(ContextParallelConfig(
  ulysses_degree=U, ulysses_anything=S % U != 0)) + the regional compile.
"""

from __future__ import annotations

from .bench.measure import same_backend_plan
from .diffusers_best import compile_call, regional_compile


class Setting:
    name = ""

    def enter(self) -> None:
        pass

    def exit(self) -> None:
        pass


class Eager(Setting):
    name = "eager"


class PlanSetting(Setting):
    name = "plan"

    def __init__(self, pipe, plan, group, progress):
        self.pipe, self.plan, self.group, self.progress, self.report = pipe, plan, group, progress, None

    def enter(self):
        from h3plan.install.pipeline import install_pipeline

        report = install_pipeline(self.pipe, self.plan, group=self.group)
        if self.report is None:
            self.progress.write(str(report))
        self.report = report

    def exit(self):
        from h3plan.install.pipeline import uninstall_pipeline

        uninstall_pipeline(self.pipe)


class Reference(Setting):
    """diffusers eager with the plan's attention levers only (the lossless plan's bitwise reference)."""

    name = "reference"

    def __init__(self, pipe, plan):
        self.pipe, self.plan = pipe, same_backend_plan(plan)

    def enter(self):
        from h3plan.install import install

        install(self.pipe.transformer, self.plan)

    def exit(self):
        from h3plan.install import uninstall

        uninstall(self.pipe.transformer)


class Best(Setting):
    name = "best"

    def __init__(self, pipe, degree: int, seq_len: int, opts):  # opts: pipeline_bench.PipelineBenchOptions
        self.pipe, self.degree, self.opts = pipe, degree, opts
        self.anything = degree > 1 and seq_len % degree != 0
        self.blocks, self.compiled = None, None
        compile_ = compile_call("transformer", opts.compile_backend)
        if degree == 1:
            self.config = f"{compile_}; diffusers' default attention; VAE: diffusers eager"
        else:
            any_ = ", ulysses_anything=True" if self.anything else ""
            self.config = (f"transformer.set_attention_backend({opts.cp_backend!r}) + enable_parallelism(config="
                           f"ContextParallelConfig(ulysses_degree={degree}{any_})) + {compile_}; VAE: diffusers eager "
                           "on every rank")

    def enter(self):
        t = self.pipe.transformer
        if self.compiled is None:
            if self.degree > 1:
                import torch
                from diffusers import ContextParallelConfig

                if not torch.accelerator.is_available():  # it maps ranks onto accelerator devices (rank % count)
                    raise RuntimeError("diffusers' enable_parallelism needs an accelerator; this run has none")

                t.set_attention_backend(self.opts.cp_backend)
                t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=self.degree,
                                                                  ulysses_anything=self.anything))
            self.blocks = regional_compile(t, self.opts.compile_backend)
            self.compiled = [b._compiled_call_impl for b in self.blocks]
        else:
            for b, c in zip(self.blocks, self.compiled):
                b._compiled_call_impl = c

    def exit(self):
        if self.degree == 1 and self.blocks:  # the plain blocks again for the other settings; the code is kept
            for b in self.blocks:
                b._compiled_call_impl = None

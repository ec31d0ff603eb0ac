"""What an attention backend declares (torch-free): one `BackendSpec` per backend, in h3plan/facts/attention/specs/.

The registry (h3plan/facts/attention/__init__.py) and everything that names a backend read these declarations: the
attention lever's settings and their losslessness, the blockers a plan prints, the schema's backend names, the
ring's log-sum-exp block function, the installer's constructor options and notes. Capability rules are facts of
conf/hardware/*.yaml (`Fact`), never written here: `supports(spec, hardware)` answers with the reasons a
backend cannot run, `[]` when it can (quack's `Support.no(reason)`, vLLM's `validate_configuration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional


@dataclass(frozen=True)
class Fact:
    """A boolean capability fact of conf/hardware/<gpu>.yaml the backend needs true.

    path: dotted, under `hardware` ("fa4.bf16"); the section's `source` is the evidence its reason cites.
    missing: the plan's reason when the fact is false; `{hw}`, `{path}` and `{source}` are filled in.
    """

    path: str
    missing: str = "{hw} has no {path} ({source})"

    def value(self, hardware: Mapping[str, Any]) -> bool:
        """The fact's value; KeyError naming `hardware.<path>` when the YAML lacks it."""
        node: Any = hardware
        for part in self.path.split("."):
            if not isinstance(node, Mapping) or part not in node or node[part] is None:
                raise KeyError(f"hardware.{self.path} is missing from the hardware facts of "
                               f"{hardware.get('name', '?')} (an attention backend needs it: conf/hardware/*.yaml)")
            node = node[part]
        return bool(node)

    def source(self, hardware: Mapping[str, Any]) -> str:
        section = hardware
        for part in self.path.split(".")[:-1]:
            section = section[part]
        return section.get("source", "conf/hardware")

    def reason(self, hardware: Mapping[str, Any], hw: str | None = None) -> str:
        return self.missing.format(hw=hw or hardware["name"], path=self.path, source=self.source(hardware))


@dataclass(frozen=True)
class BackendOption:
    """How an attention backend reads one of a lever's attention install options: declared by that lever
    (levers/base.py Spec.backend_reads), so the backend's facts name no lever.

    key: the option key (h3plan.levers.OPTIONS), also the per-call counter of `reason`.
    kwarg: the backend constructor's keyword that takes the option's value (None: not a constructor option).
    reason: the backend method `(q) -> str | None` the processor asks per call when the option is set; None
        means the planned path runs, else the counted fallback reason.
    describe: value -> the processor's description part (None: nothing to say).
    untested: the path the option turns on, where it needs its own hardware run (the installer's notes).
    """

    key: str
    kwarg: Optional[str] = None
    reason: Optional[str] = None
    describe: Optional[Callable[[Any], Optional[str]]] = None
    untested: Optional["Untested"] = None


@dataclass(frozen=True)
class Untested:
    """A path of the backend that runs on some hardware and needs its own run there (the installer's notes).

    what: the path in words ("BF16 output"); on: facts -> whether this hardware takes the path; lever, setting:
    the hardware.verified.settings entry that says it ran; option: the install option that turns it on (None:
    the backend alone).
    """

    what: str
    on: Callable[[Mapping[str, Any]], bool]
    lever: str
    setting: str
    option: Optional[str] = None


@dataclass(frozen=True)
class BackendSpec:
    """One attention backend.

    name: the setting of levers.attention and the install option `backend`.
    impl: "module:Class" of the runtime backend (h3plan/runtime/attention/base.py's interface), imported at install.
    label: the backend in words, as its runtime reasons begin ("cuDNN FP8 SDPA").
    lossless: keeps the bits a diffusers eager forward with this same backend produces.
    precision: "bf16" (ranked by hardware.attention_rank.order) or "fp8" (the recipe's FP8 attention).
    dtypes: the q/k/v dtypes it takes ("bf16", "fp16", "e4m3": FP8 codes with per-tensor descales).
    needs: the capability facts it needs true; problems: further rules over the facts (version gates), reasons.
    lse: the name of its log-sum-exp block function for the ring (h3plan/runtime/parallel/lse.py), None: it returns
        none; lse_impl: "module:fn" of that function, its per-call check beside it as "<fn>_reason".
    params: facts -> the plan decision's params for this backend.
    untested: its own paths that need their own hardware run (an option's path: its BackendOption's, declared by the
        lever that owns the option).
    """

    name: str
    impl: str
    label: str
    lossless: bool
    precision: str
    dtypes: tuple[str, ...]
    needs: tuple[Fact, ...] = ()
    problems: Optional[Callable[[Mapping[str, Any]], list[str]]] = None
    lse: Optional[str] = None
    lse_impl: Optional[str] = None
    params: Optional[Callable[[Mapping[str, Any]], dict]] = None
    untested: tuple[Untested, ...] = ()

    def __post_init__(self):
        if self.precision not in ("bf16", "fp8"):
            raise ValueError(f"attention backend {self.name}: precision must be bf16 or fp8, got {self.precision!r}")
        if bool(self.lse) != bool(self.lse_impl):
            raise ValueError(f"attention backend {self.name}: lse and lse_impl go together")

    @property
    def fp8_inputs(self) -> bool:
        """Takes e4m3 codes with per-tensor descales (FP8 scales, static tables, FP8 codes on the wire)."""
        return "e4m3" in self.dtypes


def supports(spec: BackendSpec, hardware: Mapping[str, Any], hw: str | None = None) -> list[str]:
    """Why `spec` cannot run on this hardware by its facts ([]: it can); KeyError when a needed fact is missing."""
    out = [f.reason(hardware, hw) for f in spec.needs if not f.value(hardware)]
    if not out and spec.problems is not None:
        out = spec.problems(hardware)
    return out


def missing_facts(spec: BackendSpec, hardware: Mapping[str, Any]) -> list[str]:
    """The `hardware.<path>` facts `spec` needs that these facts lack."""
    out = []
    for f in spec.needs:
        try:
            f.value(hardware)
        except KeyError:
            out.append(f"hardware.{f.path}")
    return out


__all__ = ["Fact", "BackendOption", "Untested", "BackendSpec", "supports", "missing_facts"]

"""What every lever shares: its declaration (Spec, Option), the decision context, forced-vs-auto
resolution, the lossless policy and the hardware-verified flag.

A lever module declares `SPEC = Spec(...)` once: its settings and which are lossless, the install
options it records (scope, key, allowed values, default, how a swap is logged), the attention backends a
setting needs, its per-call counter, its kernels. Everything else (the config schema, the builder's
validation, the swap log, verify's keys, --help) is derived from the registry of SPECs
(h3plan/levers/__init__.py). The module also supplies `blockers(ctx, setting) -> [reason, ...]` (why a
setting cannot apply; empty when it can) and `auto(ctx) -> (setting, reasons, params)`; `resolve`
turns them into a Decision. A forced setting with blockers raises LeverError listing them; `auto`
must never pick a blocked or (under a lossless policy) lossy setting, which `resolve` asserts.
Pure: no torch, no GPU imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any, Callable, Mapping

from h3plan.facts.attention import BACKENDS
from h3plan.facts.decision import Decision, make_decision
from h3plan.facts.support import Support
from ..facts import tuned
from . import rules

SCOPES = ("linears", "block", "attention", "vae", "transformer", "pipeline")
MODELS = ("transformer", "vae")

# How action=verify checks a lever (Spec.verify); h3plan/actions/verify.py reads these, never a lever's name.
VERIFY_REFERENCE = "reference"
"""part of verify's reference R (the attention backend): judged by R against diffusers' eager forward."""
VERIFY_ALONE = "alone"
"""R plus this lever in one forward: a lossless setting bitwise equal to R, a lossy one within the recipe's budget."""
VERIFY_GENERATION = "generation"
"""a generation of forwards with it against one without: one forward says nothing about a skipped forward; its own
budget (recipe_section) is judged on a checkpoint by action=calibrate."""
VERIFY_ATTENTION_ERROR = "attention_error"
"""the attention output's error against dense per keep fraction: verify's one forward runs dense (off its
schedule), so its sparse path is not verifiable there; its own budget is judged by action=calibrate."""
VERIFY_DECODE = "decode"
"""a VAE lever: the plan's VAE levers installed together, one seeded latent decoded against diffusers' decode."""
VERIFY_PLACEMENT = "placement"
"""a component's placement: its outputs placed as planned bitwise against unplaced."""
VERIFY = (VERIFY_REFERENCE, VERIFY_ALONE, VERIFY_GENERATION, VERIFY_ATTENTION_ERROR, VERIFY_DECODE, VERIFY_PLACEMENT)
OWN_BUDGET = (VERIFY_GENERATION, VERIFY_ATTENTION_ERROR)
"""the strategies of a lossy lever judged by its own budget: verify's whole-plan forward is off their schedule."""


@dataclass(frozen=True)
class Option:
    """One install option a lever records on the builder (h3plan.install.builder): the installer's input.

    scope: "linears" (the block linears' GEMMs), "block" (the patched block forward), "attention" (the
        attention processor), "vae", "transformer" (a hook on the transformer's own forward: step_cache) or
        "pipeline" (a pipeline component without levers of its own: the text encoder's placement).
    check / allowed: the values it takes (a predicate and its one-line description).
    default: the value when no lever sets it (the installed model then runs diffusers' own op there).
    swap: value -> (fqn suffix, old, new) logged once per transformer block for a non-default value, or None.
    describe: value -> its part of the installed attention processor's description (its repr in the swap log), or
        None where it has nothing to say; the parts of a Ulysses lever's options (Spec.ulysses) join, in registry
        order, the description's `ulysses=` part, which shows at a Ulysses degree above 1 only.
    """

    scope: str
    key: str
    check: Callable[[Any], bool]
    allowed: str
    default: Any = None
    swap: Callable[[Any], tuple[str, str, str] | None] | None = None
    describe: Callable[[Any], str | None] | None = None


STATE_KINDS = ("owns", "parks", "replaces")


@dataclass(frozen=True)
class StateKeys:
    """State-dict keys one setting's install changes, as patterns relative to its model's `state_dict()` (Spec.model:
    the transformer's or the VAE's; fnmatch: `*` matches any run of characters, dots too).

    kind: owns: keys install adds beside the model's own (the quantised linears' scales), gone after uninstall;
          parks: keys whose tensors stay on the host while the plan is installed (install(..., device=) streams them,
          never moves them there; on a device-loaded model they move to the host), back at uninstall;
          replaces: keys whose tensor install swaps for one of another dtype or shape (FP8 codes for BF16 weights, a
          cast), restored bit for bit at uninstall.
    tests/install/test_state_keys.py installs every setting on the tiny models and holds the keys that changed to
    exactly these."""

    kind: str
    keys: tuple[str, ...]

    def __post_init__(self):
        if self.kind not in STATE_KINDS:
            raise ValueError(f"StateKeys kind {self.kind!r}; allowed: {STATE_KINDS}")

    def covers(self, key: str) -> bool:
        return any(fnmatchcase(key, k) for k in self.keys)


@dataclass(frozen=True)
class Terms:
    """What one setting changes in the planning side's numbers: planning/derive.py (the estimates),
    planning/memory.py (the peak per GPU) and planning/predict.py (the time line) read these, never a lever's name.
    A field at its default: the setting leaves that number as diffusers' eager forward has it. A field is set by one
    lever only (levers/__init__.py checks); a new kind of change is a field here and the code in derive.py,
    memory.py or predict.py that reads it."""

    attention_backend: str | None = None
    """the attention backend the blocks run (derive: its precision and measured rate)."""
    attention_out_bytes: int = 2
    """bytes per element of the attention output (memory: an FP8 backend writes e4m3, then casts to bf16)."""
    attention_padded: bool = False
    """attention runs over the padded length, not seq_len (derive's attention FLOPs)."""
    sparse_blocks: bool = False
    """the sparse forwards compute a fraction of the attention's block work (derive: the owning decision's params
    `work_fraction` and `sparse_forwards`)."""
    gemm_dtype: str | None = None
    """the block linears' GEMM format, "fp8" or "nvfp4" (derive's GEMM rate, memory's weight bytes, predict's cheapest
    cut of the denoise); None: bf16."""
    a2a_fp8: bool = False
    """Q, K, V cross the Ulysses all-to-all as e4m3 codes, 1 byte (derive's all-to-all bytes)."""
    a2a_note: str | None = None
    """appended to the all-to-all estimate's basis at Ulysses degree > 1."""
    adaln_tables: bool = False
    """the AdaLN projections are tabled per timestep, their weights parked on the host (memory)."""
    qk_fused: bool = False
    """QK-norm + RoPE run in one kernel: no eager temporary (memory)."""
    qkv_fp8: bool = False
    """q/k/v leave the QK-norm + RoPE kernel as e4m3 codes (memory)."""
    swiglu_fused: bool = False
    """SwiGLU in one kernel: no silu(gate) temporary (memory)."""
    vae_cast: str | None = None
    """the dtype a float32 VAE is cast to at install ("fp16", "bf16"; memory's decode dtype, predict's measured decode
    point); None: as loaded."""
    vae_encode_cast: str | None = None
    """the dtype the float32 encoder and quant_conv are cast to at install ("fp16", "bf16"; memory's VAE weights,
    predict's measured encode point); None: float32."""
    vae_tile: str | None = None
    """the vae config's tile key the decode uses ("fp8_tile", "custom_tile"); None: default_tile. Its owner's setting
    names the geometry of the measured decode and encode points (predict)."""
    vae_encode_shares_tile: bool = False
    """the encode runs at the decode's tile geometry (vae_tile), not the VAE's own (predict's encode time)."""
    vae_fp8_gemms: bool = False
    """e4m3 copies of the decoder blocks' linears beside their weights (memory)."""
    vae_fused: bool = False
    """the VAE decoder's fused ops (memory's decode activations)."""
    vae_graph_pool: bool = False
    """a CUDA-graph pool of one decoder call held between decodes (memory)."""
    vae_spread: bool = False
    """one decode spread over the Ulysses ranks (the planner's decode time per rank: the decision's params)."""
    fewer_forwards: bool = False
    """a step schedule that computes some forwards and reuses the rest (the planner's call time: the decision's
    `computed`, or `fewest_computed` for an adaptive cache)."""


@dataclass(frozen=True)
class Spec:
    """A lever's declaration: the one place its settings, losslessness and install options are written.

    settings: every setting -> lossless (keeps eager's bits given the attention backend); config order.
    summary: one line for --help.
    model: the model class it installs into ("transformer" or "vae").
    ulysses: a Ulysses lever (hardware-verified only up to hardware.verified.max_ulysses_degree; at degree 1 it has
             nothing to act on, and the summary's runs line leaves it out).
    verify: how action=verify checks it, one of VERIFY (above): `reference` for the attention backend's levers, which
        verify's reference R keeps; `decode` for every VAE lever.
    counter: the per-call counter (h3plan.runtime.counters) whose `.fused` proves the path ran, or None. Call sites
        take it from here (`Spec.count()`), never spelling it again.
    routes: the further counters its call sites count, each `<counter>.<route>` (`<name>.<route>` without a counter):
        a fused op of its own (vae_ops' three), a replay, a scaled schedule; `Spec.count(route)` names them.
    backends: setting -> the attention backends that setting needs (checked when planning, installing and
        when verify swaps an unavailable backend for sdpa).
    options: the install options this lever owns (no other lever may set them).
    kernels: the names of the kernel ops the installed forward calls for this lever (each kernel module's OPS maps
        each to its function and check: levers sit below the runtime and import none of it).
    column: its column's header in a sweep's table (h3plan/sweep.py); None: not a column there.
    terms: setting -> what it changes in the plan's estimates and memory (Terms); a setting not named changes nothing.
    state: setting -> the model's state-dict keys its install owns, parks or replaces (StateKeys); a setting not named
        touches none (a hook, a processor option, a fused kernel in the block forward).
    fit: the lossless setting memory.fit offers first when a plan with another setting of this lever does not fit.
    recipe_section: the recipe section that holds its own budget (`recipe.cache`): a lossy lever judged by that budget
        and its evidence, apart from the kernel levers' recipe budget, that action=calibrate measures; checked by
        `config_problem`.
    recipe_defaults: the values its recipe section's knobs take where nothing sets them (sparse_attention's keep);
        the one place they are written: planning/schema.py's dataclass of that section reads them (RECIPE_DEFAULTS).
    budget_line: a lossy decision of a lever with its own budget -> its summary line (label, text): what it does and
        the evidence that it meets that budget (planning/render.py prints them in label order).
    config_problem: section -> (key, why) for a value the schema's types let through, else None (planning/schema.py's
        validate asks every lever that declares one).
    table_skips_off: the plan's tables leave out its row when it is `off` (a lever that acts on some requests only:
        vae_encode_precision is off for t2va, which encodes nothing, and a t2va plan prints as it did before it).
    exports: functions of its install module (h3plan/install/<name>.py) that the package offers as `h3plan.<fn>`, each
        also in h3plan's `__all__` (adaln_table's `prepare`: step counts added to an installed table).
    model_step: the install step this lever owns on its model (`model`), for a lever whose effect no installer step
        carries (a new call site of its own): `model_step(model, decision, site)`, run for an enabled decision after
        the installer's own steps, in plan order. `site` (h3plan/install/site.py) is all it reaches the model and the
        runtime through: its named hooks (`site.attach`, `site.effect`: `h3plan.<lever>`), its kernel ops
        (`site.kernel(op)`, only ops of its `kernels`), a guarded call counted under its counter (`site.guarded`) and
        the swap log (`site.swap`). The lever module still imports no torch: it calls what it is handed.
    input_step: the install step that readies the block linears for the inputs this lever's block sites write (after
        the linears and AdaLN tables, before the attention processors and block forwards): `input_step(model,
        decision, site)`, run for an enabled decision in plan order, through the same Site as `model_step` (its own
        option's value: `site.option()`); returns the block options to set back where no linear takes what the sites
        would write (`{option key: value}`, the block forward's install reads them), else `{}`.
    backend_reads: attention backend -> how it reads one of this lever's attention options (a facts.attention
        BackendOption: the backend constructor's keyword, the per-call reason it asks, its part of the processor's
        description, the path that needs its own hardware run): the lever declares what its option means to each
        backend, so the backends' facts name no lever (h3plan.levers.backend_options gathers them).
    hardware: the hardware YAML sections it owns -> their type (a dataclass, or a List of one): a capability section
        (`vae_ops`) or its evidence under `measured` (`measured.compile`); planning/hardware_config.py types the
        hardware group with them (HardwareConfig, MeasuredFacts), so a new lever's facts need no field there.
    """

    name: str
    settings: Mapping[str, bool]
    summary: str
    model: str = "transformer"
    ulysses: bool = False
    verify: str = VERIFY_ALONE
    counter: str | None = None
    routes: tuple[str, ...] = ()
    backends: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    options: tuple[Option, ...] = ()
    kernels: tuple[str, ...] = ()
    column: str | None = None
    terms: Mapping[str, Terms] = field(default_factory=dict)
    state: Mapping[str, tuple[StateKeys, ...]] = field(default_factory=dict)
    fit: str | None = None
    table_skips_off: bool = False
    recipe_section: str | None = None
    recipe_defaults: Mapping[str, Any] = field(default_factory=dict)
    config_problem: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None
    budget_line: Callable[[Decision], tuple[str, str]] | None = None
    exports: tuple[str, ...] = ()
    hardware: Mapping[str, Any] = field(default_factory=dict)
    model_step: Callable[[Any, Decision, Any], None] | None = None
    input_step: Callable[[Any, Decision, Any], Mapping[str, Any]] | None = None
    backend_reads: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        attention_keys = {o.key for o in self.options if o.scope == "attention"}
        for backend, read in self.backend_reads.items():
            if backend not in BACKENDS or read.key not in attention_keys:
                raise ValueError(f"lever {self.name}: backend_reads[{backend!r}] must be a registered backend reading "
                                 f"one of its attention options {sorted(attention_keys)}, got {read.key!r}")
        if self.model not in MODELS:
            raise ValueError(f"lever {self.name}: model must be one of {MODELS}")
        if self.verify not in VERIFY:
            raise ValueError(f"lever {self.name}: verify must be one of {VERIFY}")
        if (self.model == "vae") != (self.verify == VERIFY_DECODE):
            raise ValueError(f"lever {self.name}: a VAE lever, and only one, is verified by {VERIFY_DECODE!r}")
        if (self.verify in OWN_BUDGET) != (self.recipe_section is not None):
            raise ValueError(f"lever {self.name}: a lever judged by its own budget (recipe_section) is verified by one "
                             f"of {OWN_BUDGET}, and only such a lever")
        if self.recipe_defaults and self.recipe_section is None:
            raise ValueError(f"lever {self.name}: recipe_defaults needs the recipe_section they belong to")
        for o in self.options:
            if o.scope not in SCOPES:
                raise ValueError(f"lever {self.name}: option {o.key} has scope {o.scope!r}; allowed: {SCOPES}")
        unknown = set(self.backends) - set(self.settings)
        if unknown:
            raise ValueError(f"lever {self.name}: backends names unknown settings {sorted(unknown)}")
        unknown = (set(self.terms) | set(self.state) | ({self.fit} if self.fit else set())) - set(self.settings)
        if unknown:
            raise ValueError(f"lever {self.name}: terms, state or fit name unknown settings {sorted(unknown)}")
        for path, kind in self.hardware.items():
            node = kind.__args__[0] if getattr(kind, "__origin__", None) is list else kind
            if path.count(".") > (path.startswith("measured.")) or not is_dataclass(node):
                raise ValueError(f"lever {self.name}: hardware section {path!r} must be a top-level section or "
                                 f"measured.<key>, typed by a dataclass or a List of one")
        bad = sorted({b for need in self.backends.values() for b in need} - set(BACKENDS))
        if bad:
            raise ValueError(f"lever {self.name}: backends names unknown attention backends {bad}; known: "
                             f"{list(BACKENDS)}")

    def lossless(self, setting: str) -> bool:
        return self.settings[setting]

    def count(self, route: str | None = None) -> str:
        """The counter name a call site counts under: the declared `counter`, or one of its declared `routes`."""
        if route is None:
            if self.counter is None:
                raise ValueError(f"lever {self.name} declares no counter")
            return self.counter
        if route not in self.routes:
            raise ValueError(f"lever {self.name} declares no route {route!r}; declared: {self.routes}")
        return f"{self.counter or self.name}.{route}"

    @property
    def installs(self) -> bool:
        """Whether install can put anything into the model: through the options it records on the builder (the
        builder takes only the option keys a SPEC declares) or its own `model_step`. A lever with neither can only
        skip: its settings are planned with no kernel behind them (the plan says so on a line of its own)."""
        return bool(self.options) or self.model_step is not None


def default_install(spec: Spec) -> Callable[[Any, Any], None]:
    """The install of a lever that owns one option whose values are its settings (a bool option: `on` is True,
    `off` False): a setting whose value is the option's default skips with the decision's first reason, any other
    sets the option. Checked when the lever module is imported: every setting maps to a value the option takes."""
    (opt,) = spec.options
    value: Callable[[str], Any] = (lambda s: s == "on") if opt.allowed == "bool" else (lambda s: s)
    bad = [s for s in spec.settings if (opt.allowed == "bool" and s not in ("on", "off")) or not opt.check(value(s))]
    if bad:
        raise ImportError(f"lever {spec.name}: settings {bad} are no value of its option {opt.key!r} ({opt.allowed})")

    def install(builder, decision) -> None:
        v = value(decision.setting)
        if v == opt.default:
            builder.skip(spec.name, decision.reasons[0])
        else:
            builder.set(spec.name, opt.key, v)

    return install


def backend_blockers(ctx: Context, spec: Spec, setting: str) -> list[str]:
    """The attention backends `setting` needs (Spec.backends) against the plan's attention decision."""
    need = spec.backends.get(setting)
    att = rules.attention(ctx, None)
    if not need or att is None:
        return []
    return [] if att in need else [f"attention is {att}: {spec.name}={setting} needs {' or '.join(need)}"]


class LeverError(ValueError):
    """A lever setting that cannot apply; str() is one line naming the lever and every reason."""

    def __init__(self, lever: str, setting: str, reasons: list[str]):
        self.lever, self.setting, self.reasons = lever, setting, list(reasons)
        super().__init__(f"levers.{lever}={setting} cannot apply: " + "; ".join(self.reasons))


@dataclass(frozen=True)
class Context:
    """Everything a lever may read: config sections (plain dicts), shape numbers, earlier decisions."""

    hardware: Mapping[str, Any]
    recipe: Mapping[str, Any]
    parallel: Mapping[str, Any]
    model: Mapping[str, Any]
    vae: Mapping[str, Any]
    levers: Mapping[str, str]
    shape: Mapping[str, Any]
    decisions: Mapping[str, Decision] = field(default_factory=lambda: MappingProxyType({}))
    request: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The video request's numbers (h3plan/planning/request.py: rows, latent frames and size); empty when
    parallel.seq_len was set explicitly."""
    pipeline: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The `pipeline` section: diffusers' pipeline facts (steps, scheduler shifts; conf/pipeline/h3.yaml)."""

    def requested(self, lever: str) -> str:
        return str(self.levers.get(lever, "auto"))

    def setting(self, lever: str) -> str:
        """The setting an earlier lever resolved to (levers decide in registry order)."""
        return self.decisions[lever].setting

    def decision(self, lever: str) -> Decision:
        return self.decisions[lever]

    @property
    def hw(self) -> str:
        return self.hardware["name"]

    @property
    def lossless_only(self) -> bool:
        return self.recipe["policy"] == "lossless"

    @property
    def degree(self) -> int:
        return self.parallel["ulysses"]

    @property
    def ring(self) -> int:
        """parallel.ring: ring blocks of the sequence (world = ring x Ulysses degree); 1 without a ring."""
        return self.parallel.get("ring", 1)

    @property
    def seq_len(self) -> int:
        return self.parallel["seq_len"]

    @property
    def rows_per_rank(self) -> int:
        return self.shape["local_rows"]

    @property
    def tuning(self) -> Mapping[str, Any]:
        return self.hardware["tuning"]

    def budget_text(self) -> str:
        b = self.recipe["budget"]
        return (f"recipe {self.recipe['name']} allows lossy levers within PSNR >= {b['psnr_db_min']} dB, "
                f"SSIM >= {b['ssim_min']}")


def policy_blockers(ctx: Context, spec: Spec, setting: str) -> list[str]:
    if ctx.lossless_only and not spec.lossless(setting):
        return [f"recipe {ctx.recipe['name']} has policy lossless and {spec.name}={setting} is lossy"]
    return []


def tuned_blockers(ctx: Context, spec: Spec, setting: str) -> list[str]:
    """A setting whose kernel check failed on the tuned device (hardware.tuned, action=tune) cannot apply there."""
    c = tuned.checks(ctx.hardware.get("tuned")).get((spec.name, setting))
    if c is None or c["passed"]:
        return []
    t = ctx.hardware["tuned"]
    return [f"its kernel check failed on {t['device']} ({t['date']}, hardware.tuned): {c['detail'] or 'no detail'}"]


def hardware_verified(ctx: Context, spec: Spec, setting: str) -> tuple[bool, str | None]:
    c = tuned.checks(ctx.hardware.get("tuned")).get((spec.name, setting))
    if c is not None and c["passed"]:
        return True, None
    v = ctx.hardware["verified"]
    if setting not in v["settings"].get(spec.name, []):
        return False, f"not hardware-verified: {setting} has never run on {ctx.hw} by h3plan (hardware.verified)"
    if spec.ulysses and ctx.degree > v["max_ulysses_degree"]:
        return False, (f"not hardware-verified: Ulysses degree {ctx.degree} has never run on {ctx.hw} "
                       f"(at most {v['max_ulysses_degree']})")
    return True, None


def no_blockers(ctx: Context, setting: str) -> list[str]:
    return []


def support(
    ctx: Context,
    spec: Spec,
    setting: str,
    blockers: Callable[[Context, str], list[str]] = no_blockers,
    policy: Callable[[Context, str], list[str]] | None = None,
) -> Support:
    """Whether `setting` of the lever can apply in this context, with every reason it cannot: the attention backends
    it needs, the lever's own `blockers`, the recipe policy (or the lever's own `policy`) and the tuned device's
    checks. The lever's boundary answer; a lever module's `blockers` may collect its reasons in a list."""
    pol = policy(ctx, setting) if policy else policy_blockers(ctx, spec, setting)
    return Support.of(backend_blockers(ctx, spec, setting) + blockers(ctx, setting) + pol
                      + tuned_blockers(ctx, spec, setting))


def resolve(
    ctx: Context,
    spec: Spec,
    *,
    auto: Callable[[Context], tuple[str, list[str], dict]],
    blockers: Callable[[Context, str], list[str]] = no_blockers,
    params: Callable[[Context, str], dict] | None = None,
    explain: Callable[[Context, str], list[str]] | None = None,
    policy: Callable[[Context, str], list[str]] | None = None,
) -> Decision:
    """Forced: validate and explain. Auto: pick, then assert the pick is allowed. `policy`: the lever's own
    reading of the recipe policy (default: a lossless recipe refuses every lossy setting)."""
    lever = spec.name
    requested = ctx.requested(lever)

    def support_of(s: str) -> Support:
        return support(ctx, spec, s, blockers, policy)

    if requested != "auto":
        if requested not in spec.settings:
            raise LeverError(lever, requested, ["allowed: auto, " + ", ".join(spec.settings)])
        sup = support_of(requested)
        if not sup:
            raise LeverError(lever, requested, list(dict.fromkeys(sup)))
        setting, forced = requested, True
        reasons = [f"forced by levers.{lever}={requested}"] + (explain(ctx, requested) if explain else [])
        extra = params(ctx, requested) if params else {}
    else:
        setting, reasons, extra = auto(ctx)
        forced = False
        failed = tuned_blockers(ctx, spec, setting)
        if failed:  # the pick failed its check on the tuned device: the first setting that can apply there
            alt = next((s for s in spec.settings if s != setting and support_of(s)), None)
            if alt is None:
                raise LeverError(lever, setting, failed)
            reasons = list(reasons) + [f"but {setting} is refused: {failed[0]}; {alt} is the first setting "
                                       "that can apply"]
            setting, extra = alt, (params(ctx, alt) if params else {})
        sup = support_of(setting)
        assert sup, f"internal: auto picked {lever}={setting} that cannot apply: {list(sup)}"
    ok, why = hardware_verified(ctx, spec, setting)
    if why:
        reasons = list(reasons) + [why]
    return make_decision(lever, setting, spec.lossless(setting), reasons, forced=forced, params=extra,
                         hardware_verified=ok)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def one_of(*values: str) -> tuple[Callable[[Any], bool], str]:
    """(check, allowed) for an option that takes one of `values`."""
    return (lambda v: v in values), " | ".join(repr(x) for x in values)


def speedup_runs(xs) -> str:
    """Measured A/B speedups as the reasons print them: "1.054x, 1.042x"."""
    return ", ".join(f"{x:.3f}x" for x in xs)


def faster_in_every_run(xs) -> bool:
    """The measured levers' rule: a setting wins only if every recorded run timed it faster (> 1.0x)."""
    return min(xs) > 1.0


def nearest_ulysses_point(hardware: Mapping[str, Any], kind: str, degree: int,
                          seq_len: int) -> Mapping[str, Any] | None:
    """hardware.measured.ulysses.<kind> ("a2a" or "overlap") at exactly this degree, nearest in log S; None
    when this degree was never measured (another degree's numbers are not borrowed)."""
    import math

    points = [p for p in hardware["measured"]["ulysses"][kind] if p["degree"] == degree]
    return min(points, key=lambda p: (abs(math.log(p["seq_len"] / seq_len)), p["seq_len"])) if points else None


def nearest_point(hardware: Mapping[str, Any], seq_len: int, heads: int, backend: str) -> Mapping[str, Any] | None:
    """The measured attention point closest in (log S, log heads) that has a value for `backend`."""
    import math

    points = [p for p in hardware["measured"]["attention"] if p.get(backend) is not None]
    if not points:
        return None
    return min(points, key=lambda p: (abs(math.log(p["seq_len"] / seq_len)) + abs(math.log(p["heads"] / heads)),
                                      p["seq_len"], p["heads"]))

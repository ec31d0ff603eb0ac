"""install(..., device=) on the CPU: a model resting on the host moved to a device at install (install/placement.py).

The CPU machine has no CUDA; torch's `lazy` device (TorchScript backend, on the CPU) is a real second device that
holds values, so the moves, the streamed tables and the round trip are checked with device="lazy" (tensors there
cannot swap data with host ones, so the module slots get new tensors, as nn.Module.to does; on CUDA the same
objects move: tests/gpu/test_adaln_table_gpu.py). Checked: the tables built from streamed weights bitwise against
the eager linear on the device; every tensor the plan computes with on the device, the parked / replaced / cast
ones on the host; the uninstall round trip bit for bit with every tensor back on the host; a bad device or a
model on an unexpected device as one line.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from install_helpers import LEVERS, lazy_device, plan, tiny_model
from test_install_adaln_table import REG, SPEC, table_plan

from h3plan.errors import InstallError
from h3plan.install import adaln_table as A
from h3plan.install import install, uninstall
from h3plan.planner import make_plan
from h3plan.facts.decision import make_decision

LAZY = torch.device("lazy")


@pytest.fixture(scope="module", autouse=True)
def lazy():
    lazy_device()


def snapshot(model):
    return {k: (v.device, v.clone()) for k, v in model.state_dict().items()}


def assert_restored(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, (device, v) in before.items():
        assert (after[k].device == device == torch.device("cpu") and after[k].dtype == v.dtype
                and torch.equal(after[k], v)), k


def adaln_names(model):
    return {f"transformer_blocks.{i}.adaln_proj.linear.{p}" for i in range(len(model.transformer_blocks))
            for p in ("weight", "bias")} | {"norm_out.linear.weight", "norm_out.linear.bias"}


def test_tables_from_streamed_weights_are_the_eager_linear_on_the_device_bitwise():
    eager = tiny_model()
    model = copy.deepcopy(eager)
    install(model, table_plan(steps=(5, 4), others={}), registry=REG, device="lazy")
    tables = A.tables_of(model)
    mods = [b.adaln_proj.linear for b in eager.transformer_blocks] + [eager.norm_out.linear]
    assert all(s.linear.weight.device.type == "cpu" for s in tables.slots)
    time_proj, time_embedder = copy.deepcopy(eager.time_proj).to(LAZY), copy.deepcopy(eager.time_embedder).to(LAZY)
    with torch.no_grad():
        for ts in A.timestep_vectors([5, 4], **SPEC):
            temb = time_embedder(time_proj(ts.to(LAZY)))  # the forward's temb, on the device
            _, kid = tables.lookup(temb)
            assert kid is not None
            for slot, lin in zip(tables.slots, mods):
                want = F.linear(F.silu(temb).to(lin.weight.dtype), lin.weight.to(LAZY), lin.bias.to(LAZY))
                got = slot.entries[kid]
                assert got.device.type == "lazy" and torch.equal(got.cpu(), want.cpu()), slot.fqn


@pytest.mark.parametrize("quant", [False, True], ids=["tables", "tables+fp8-at-install"])
def test_placement_and_round_trip(quant):
    model = tiny_model()
    before = snapshot(model)
    p = _with_quant() if quant else table_plan(steps=(3,), others={})
    report = install(model, p, registry=REG, device="lazy")
    parked = adaln_names(model)
    for name, t in model.state_dict().items():
        want = "cpu" if name in parked else "lazy"
        assert t.device.type == want, (name, t.device)
    assert report.placement["device"] == "lazy" and report.placement["tensors"] > 0 and report.placement["moved"] > 0
    host = report.placement["host"]
    assert list(host) == ((["gemm_quant: the replaced bf16 block linears"] if quant else [])
                          + ["adaln_table: the AdaLN linears"])
    note = next(n for n in report.notes if n.startswith("placement: "))
    assert "moved from the host to lazy" in note and note.endswith("uninstall moves everything back to the host")
    if not quant:  # another plan without device=: uninstalled to the host, installed on the same device again
        install(model, plan(swiglu="on"), registry=LEVERS)
        assert {t.device.type for t in model.state_dict().values()} == {"lazy"} and A.tables_of(model) is None
    if quant:
        from h3plan.runtime.quant.fp8 import FP8Linear

        q = model.transformer_blocks[0].attn.to_q
        assert type(q) is FP8Linear and q.weight.device.type == "lazy" and q.weight.dtype == torch.float8_e4m3fn
        assert any("streamed to lazy and quantised there" in n for n in report.notes)
    uninstall(model)
    assert_restored(model, before)


def _cells(fn) -> list:
    out = []
    for c in fn.__closure__ or ():
        try:
            out.append(c.cell_contents)
        except ValueError:  # a cell not assigned yet
            pass
    return out


def _device_tensors(root) -> dict[int, torch.Tensor]:
    """Every lazy-device tensor reachable from `root` through any object (modules, hooks, registries, closures, the
    install's records), by identity. A function is followed into its closure and defaults, not its module's globals
    (they reach every other test's models)."""
    import gc
    import types
    import warnings

    seen, found, todo = set(), {}, [root]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # isinstance on torch.distributed's deprecated reduce_op
        while todo:
            o = todo.pop()
            if id(o) in seen or isinstance(o, (type, types.ModuleType)):
                continue
            seen.add(id(o))
            if isinstance(o, torch.Tensor):
                if o.device.type == "lazy":
                    found[id(o)] = o
                continue
            if isinstance(o, types.FunctionType):
                todo.extend([*_cells(o), o.__defaults__, o.__kwdefaults__, o.__dict__])
                continue
            todo.extend(gc.get_referents(o))
    return found


def test_a_host_loaded_install_holds_no_device_tensor_beyond_the_model_and_its_tables():
    """What install(model, plan, device=) keeps on the device is the model's parameters and buffers and the tables'
    entries: no hook, closure or install record holds another device tensor (a copy of a tensor the install parked or
    dropped; the plan's block forwards and the table's hooks on). The GPU test that compares this footprint with the
    device-loaded install's is tests/gpu/test_adaln_table_gpu.py's host-loaded one."""
    from h3plan.install.hooks import installed
    from h3plan.install.placement import tensors

    model = tiny_model()
    install(model, table_plan(steps=(3,)), registry=REG, device="lazy")
    assert {fqn for fqn, _ in installed(model)} >= {"transformer_blocks.0", "norm_out", "time_embedder"}
    held = {id(t) for _, t in tensors(model)} | {id(e) for s in A.tables_of(model).slots for e in s.entries.values()}
    extra = [(tuple(t.shape), t.dtype) for i, t in _device_tensors(model).items() if i not in held]
    assert not extra
    uninstall(model)


def _with_quant():
    """gemm_quant=fp8 (per-channel weight scales) quantised at install, then adaln_table."""
    base = table_plan(steps=(3,), others={})
    q = make_decision("gemm_quant", "fp8", False, ["test"], params={"scaling": "channel"})
    return make_plan(dict(base.config), {}, [q, *base.decisions])


def test_vae_cast_streams_each_tensor_and_round_trips():
    from test_install_vae import tiny_vae

    vae = tiny_vae()
    before = snapshot(vae)
    p = make_plan({}, {}, [make_decision("vae_precision", "fp16", False, ["test: precision"])])
    report = install(vae, p, device="lazy")
    assert {t.device.type for t in vae.state_dict().values()} == {"lazy"}
    from h3plan.install.vae.weights import castable

    assert {t.dtype for _, t in castable(vae)} == {torch.float16}
    assert "vae_precision: the float32 originals" in report.placement["host"]
    uninstall(vae)
    assert_restored(vae, before)


@pytest.mark.parametrize("device,why", [
    ("bogus", "install device='bogus' is not a torch device"),
    ("meta", "install device='meta': meta tensors hold no values"),
    (True, "install device=True: pass a torch device"),
    pytest.param("cuda", "install device='cuda': no CUDA device here",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
])
def test_bad_device_is_one_line(device, why):
    model = tiny_model()
    with pytest.raises(InstallError) as e:
        install(model, plan(swiglu="on"), registry=LEVERS, device=device)
    msg = str(e.value)
    assert why in msg and "\n" not in msg


def test_model_on_an_unexpected_device_is_one_line():
    model = tiny_model()
    model.proj_in.to("meta")
    before = {n: t.device for n, t in model.state_dict().items()}
    with pytest.raises(InstallError, match=r"^MiniMaxH3Transformer3DModel\.proj_in\.weight is on meta, the install "
                                           r"device is lazy: load the model on the host \(or on lazy\) and install "
                                           r"again$"):
        install(model, plan(swiglu="on"), registry=LEVERS, device="lazy")
    assert {n: t.device for n, t in model.state_dict().items()} == before  # nothing moved


def test_failed_install_moves_everything_back():
    model = tiny_model()
    model.transformer_blocks[1].attn.fuse_projections()  # gemm_quant refuses fused QKV, after the move
    before = snapshot(model)
    with pytest.raises(InstallError, match="fused QKV"):
        install(model, _with_quant(), registry=REG, device="lazy")
    assert_restored(model, before)


def test_pipeline_components_move_and_come_back():
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    from omegaconf import OmegaConf

    import h3plan
    from h3plan.actions.pipeline_build import build_pipeline
    from install_helpers import ROOT

    cfg = lambda name: OmegaConf.load(ROOT / name).diffusers_config  # noqa: E731
    pipe = build_pipeline(cfg("conf/model/h3_tiny.yaml"), cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe")
    before = {n: snapshot(getattr(pipe, n)) for n in ("transformer", "vae", "audio_vae")}
    report = h3plan.install(pipe, table_plan(steps=(4,), others={}), registry=REG, device="lazy")
    assert pipe._execution_device.type == "lazy"
    parked = adaln_names(pipe.transformer)
    for n in before:
        for name, t in getattr(pipe, n).state_dict().items():
            assert t.device.type == ("cpu" if n == "transformer" and name in parked else "lazy"), (n, name)
    assert report.skipped["audio_vae"].startswith("moved to lazy (")
    assert report["transformer"].placement["device"] == report["vae"].placement["device"] == "lazy"
    assert h3plan.uninstall(pipe)
    for n, b in before.items():
        assert_restored(getattr(pipe, n), b)


def test_restore_derives_weight_norm_weights_on_the_host_again(lazy):
    """weight_norm's derived `weight` is a plain attribute its pre-forward hook rewrites: after a call on the install
    device it would stay there through uninstall (diffusers' audio VAE, ~0.25 GiB on the H200). restore() derives it
    again from g and v on the host, bit for bit the weight a host call makes."""
    from h3plan.install.placement import Placement

    torch.manual_seed(0)
    conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(3, 4, 3))
    model = torch.nn.Sequential(conv)
    want = conv.weight.detach().clone()
    p = Placement(LAZY)
    p.move(model)
    model(torch.randn(1, 3, 8, device=LAZY))  # the hook sets conv.weight on the device
    assert conv.weight.device.type == "lazy"
    p.restore()
    assert conv.weight.device.type == "cpu" and torch.equal(conv.weight, want)
    assert conv.weight_g.device.type == "cpu" and conv.weight_v.device.type == "cpu"

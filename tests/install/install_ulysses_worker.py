"""Worker of test_install_ulysses.py: one gloo rank running the installed tiny model at Ulysses degree U."""

import json
import os
import sys

import torch
import torch.distributed as dist


def _result(out, ref):
    from h3plan.install import counters

    return {"max_abs": max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref)),
            "bitwise": all(torch.equal(a, b) for a, b in zip(out, ref)), "counters": counters()}


def worker(rank, world, port, outdir, S):
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.dirname(__file__))
    from install_helpers import LEVERS, forward, tiny_inputs, tiny_model

    from h3plan.install import install, reset_counters
    from h3plan.levers import REGISTRY
    from h3plan.planner import make_plan
    from h3plan.facts.decision import make_decision

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        levers = dict(LEVERS, ulysses_padding=lambda b, d: (b.set("ulysses_padding", "ulysses_degree", world),
                                                            b.set("ulysses_padding", "ulysses_padding", d.setting)))
        inputs = tiny_inputs(S)
        ref = forward(tiny_model(), inputs)
        res = {}
        for padding, qk in (("padded", "fused"), ("fixed_valid", "eager")):
            model = tiny_model()
            ds = [make_decision("attention", "sdpa", True, ["t"]), make_decision("qk_norm_rope", qk, True, ["t"]),
                  make_decision("modulation", "exact", True, ["t"]), make_decision("gated_residual", "on", True, ["t"]),
                  make_decision("swiglu", "on", True, ["t"]), make_decision("ulysses_padding", padding, True, ["t"])]
            install(model, make_plan({}, {}, ds), registry=levers)
            rows = []  # the output heads run on this rank's rows (install/shard.py shard_heads)
            hooks = [m.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[1]))
                     for m in (model.norm_out, model.proj_out, model.audio_proj_out)]
            reset_counters()
            out = forward(model, inputs)
            res[f"{padding}-{qk}"] = _result(out, ref)
            res[f"{padding}-{qk}"]["head_rows"] = rows
            for h in hooks:
                h.remove()
            from h3plan.install import uninstall

            uninstall(model)
            res[f"{padding}-{qk}"]["restored"] = not any("forward" in m.__dict__ for m in
                                                         (model.norm_out, model.proj_out, model.audio_proj_out))
            res[f"{padding}-{qk}"]["after_uninstall_bitwise"] = _result(forward(model, inputs), ref)["bitwise"]
        # the projection exchange: per-destination projections sent while the next project, received seq-major
        for padding, exchange in (("padded", "projection"), ("fixed_valid", "projection"),
                                  ("padded", "projection_split")):
            model = tiny_model()
            ds = [make_decision("attention", "sdpa", True, ["t"]), make_decision("qk_norm_rope", "fused", True, ["t"]),
                  make_decision("ulysses_padding", padding, True, ["t"]),
                  make_decision("ulysses_exchange", exchange, True, ["t"])]
            install(model, make_plan({}, {}, ds),
                    registry=dict(levers, ulysses_exchange=REGISTRY["ulysses_exchange"].install))
            reset_counters()
            res[f"{exchange}-{padding}"] = _result(forward(model, inputs), ref)
            if exchange == "projection" and padding == "padded":
                # a linear the exchange cannot slice (here a subclass of nn.Linear): every rank takes the packed
                # exchange for that call, counted with the reason, and the output keeps its bits
                class Sub(torch.nn.Linear):
                    pass

                for blk in model.transformer_blocks:
                    blk.attn.to_q.__class__ = Sub
                reset_counters()
                res["projection-refused"] = _result(forward(model, inputs), ref)
                from h3plan.install import fallback_reasons

                res["projection-refused"]["reasons"] = fallback_reasons().get("ulysses_exchange", {})
        # FP8 linears: the degree-1 model with the same FP8 linears is the reference (per-tensor activation
        # scales over the whole sequence, padding rows excluded, make the codes independent of the degree)
        fp8 = [make_decision("gemm_quant", "fp8", False, ["t"], params={"scaling": "channel"}),
               make_decision("attention", "sdpa", True, ["t"])]
        one = tiny_model()
        install(one, make_plan({}, {}, fp8), registry=levers)
        ref8 = forward(one, inputs)
        for padding in ("padded", "fixed_valid"):
            model = tiny_model()
            install(model, make_plan({}, {}, fp8 + [make_decision("ulysses_padding", padding, True, ["t"])]),
                    registry=levers)
            reset_counters()
            res[f"fp8-{padding}"] = _result(forward(model, inputs), ref8)
        # FP8 attention (the cuDNN FP8 stand-in): BF16 on the wire and the cast after the exchange, or the
        # fused cast's e4m3 codes on the wire; dynamic scales over the whole sequence must give degree 1's bits
        import fp8_attention_standin

        fp8_attention_standin.register()
        att8 = [make_decision("attention", "cudnn_fp8", False, ["t"]),
                make_decision("fp8_scales", "dynamic", False, ["t"])]
        for qk, codes in (("fused", False), ("fused_fp8", False), ("fused_fp8", True)):
            base = att8 + [make_decision("qk_norm_rope", qk, qk == "fused", ["t"])]
            one = tiny_model()
            install(one, make_plan({}, {}, base), registry=levers)
            ref8 = forward(one, inputs)
            extra = [make_decision("ulysses_padding", "fixed_valid", True, ["t"])]
            if codes:
                extra.append(make_decision("a2a_fp8_codes", "on", True, ["t"]))
            model = tiny_model()
            install(model, make_plan({}, {}, base + extra),
                    registry=dict(levers, a2a_fp8_codes=REGISTRY["a2a_fp8_codes"].install))
            reset_counters()
            res[f"fp8att-{qk}{'-codes' if codes else ''}"] = _result(forward(model, inputs), ref8)
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()

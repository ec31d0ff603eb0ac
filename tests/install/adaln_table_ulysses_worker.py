"""Worker of test_install_adaln_table.py's Ulysses case: one gloo rank, the tiny model at degree U with
adaln_table on (every rank holds the whole table; norm_out runs on the shard through the tabled forward)."""

import json
import os
import sys

import torch
import torch.distributed as dist


def worker(rank, world, port, outdir, S):
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.dirname(__file__))
    from install_helpers import LEVERS, forward, tiny_inputs, tiny_model

    import h3plan
    from h3plan.install import counters, install, reset_counters, uninstall
    from h3plan.levers import REGISTRY
    from h3plan.planner import make_plan
    from h3plan.facts.decision import make_decision

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        levers = dict(LEVERS, adaln_table=REGISTRY["adaln_table"].install,
                      ulysses_padding=lambda b, d: (b.set("ulysses_padding", "ulysses_degree", world),
                                                    b.set("ulysses_padding", "ulysses_padding", d.setting)))
        inputs = tiny_inputs(S)
        ref = forward(tiny_model(), inputs)
        spec = dict(steps=[5], video_shift=12.0, audio_shift=3.0, keyframe_noise_aug=0.999, audio=True,
                    condition_video=False, condition_audio=False)
        model = tiny_model()
        ds = [make_decision("adaln_table", "on", True, ["t"], params=spec),
              make_decision("attention", "sdpa", True, ["t"]), make_decision("modulation", "exact", True, ["t"]),
              make_decision("ulysses_padding", "padded", True, ["t"])]
        install(model, make_plan({}, {}, ds), registry=levers)
        h3plan.prepare(model, timesteps=[inputs["timestep"]])
        reset_counters()
        out = forward(model, inputs)
        res = {"bitwise": all(torch.equal(a, b) for a, b in zip(out, ref)), "counters": dict(counters())}
        uninstall(model)
        res["after_uninstall_bitwise"] = all(torch.equal(a, b) for a, b in zip(forward(model, inputs), ref))
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()

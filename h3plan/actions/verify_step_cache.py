"""action=verify's step_cache check: one generation of the plan's N forwards, cached against uncached.

verify's inputs are one packed sequence; a generation here is N forwards of it at N distinct timestep pairs (rising
as a schedule's do; the rows held fixed: no scheduler between forwards, so the error of a skipped forward is its
velocity's distance from the one computed at that step, not a trajectory's). The installed cache places forward i at
step i of N (its schedule index is replaced by these N vectors after install). Reported: the forwards computed and
skipped (counters and calls(model)), each skipped forward's PSNR of the video and audio velocities against the
uncached forward, their worst. Checked: the computed count is the plan's, and every computed forward is bitwise the
uncached one (exact where it must be); the skipped forwards' error is reported, judged on the user's checkpoint by
action=calibrate calibrate.target=step_cache, not here (seeded weights).
"""

from __future__ import annotations

from h3plan import prepare
from h3plan.levers import REGISTRY


def pairs(n: int, like):
    """N distinct timestep vectors shaped like the inputs' (two values: video and audio rows), rising."""
    import torch

    base = like.detach().to("cpu", torch.float32)
    return [(base * (i + 1) / (n + 1)).to(like.device) for i in range(n)]


def _forwards(model, plan, inputs, vectors, registry, lever: str, cached: bool):
    """The N forwards of `plan` and, `cached`, the calls the install module of `lever` (the step cache's) counted."""
    import torch

    from h3plan.install import install, of_lever, uninstall

    own = of_lever(lever)
    install(model, plan, registry=registry)
    try:
        prepare(model, timesteps=vectors)
        if cached:
            st = model.__dict__[own.STATE]
            st.index = {v.to("cpu", torch.float32).numpy().tobytes(): (i, len(vectors)) for i, v in enumerate(vectors)}
        outs = []
        with torch.no_grad():
            for v in vectors:
                out = model(**{**inputs, "timestep": v})
                outs.append((out.sample.detach().clone(), out.audio_sample.detach().clone()))
        return outs, (own.calls(model) if cached else [])
    finally:
        uninstall(model)


def check(model, inputs, plan, d, rep, compare, registry=None) -> None:
    """Add the lines of the plan's step cache decision `d` to verify's Report `rep` (see the module docstring);
    `compare`: verify's metrics."""
    from dataclasses import replace

    n = int(d.param("forwards"))
    vectors = pairs(n, inputs["timestep"])
    plain = replace(plan, decisions=tuple(x for x in plan.decisions if x.lever != d.lever))
    ref, _ = _forwards(model, plain, inputs, vectors, registry, d.lever, cached=False)
    got, made = _forwards(model, plan, inputs, vectors, registry, d.lever, cached=True)
    computed = made[0]["computed"] if made else None
    if d.setting == "first_block":
        want, exact = None, None
    else:
        mask = REGISTRY[d.lever].computed_mask(n, int(d.param("computed")), int(d.param("warmup")),
                                               int(d.param("final")))
        want = sum(mask)
        exact = all(all(bool((a == b).all()) for a, b in zip(got[i], ref[i])) for i in range(n) if mask[i])
    skipped = [i for i in range(n) if not all(bool((a == b).all()) for a, b in zip(got[i], ref[i]))]
    worst = {}
    for i in skipped:
        for k, a, b in (("video", got[i][0], ref[i][0]), ("audio", got[i][1], ref[i][1])):
            m = compare(a, b)
            if k not in worst or (m["psnr_db"] or float("inf")) < (worst[k]["psnr_db"] or float("inf")):
                worst[k] = m
    ok = bool(made) and (want is None or computed == want) and exact is not False
    verdict = (f"{computed} of {n} forwards computed" + (f" (plan: {want})" if want is not None else "")
               + ("; computed forwards bitwise the uncached ones" if exact else "")
               + f"; {len(skipped)} differ from the uncached forward (worst below; seeded weights: the quality on a "
               "checkpoint is action=calibrate calibrate.target=step_cache's)")
    rep.line(f"step_cache={d.setting} (a generation)", verdict, worst or None, None, ok=ok)

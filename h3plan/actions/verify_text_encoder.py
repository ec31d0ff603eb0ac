"""action=verify's text_encoder check: the plan's placement of the Qwen3-VL conditioner, placed against unplaced.

A plan that places the conditioner (the text_encoder lever, memory.text_encoder) gets one seeded conditioner at the
plan's widths (model.text_encoder, else model.text_encoder_default; actions/text_encoder_build.py) built on the
verify device. One seeded prompt of token ids is encoded as diffusers' text encoder step runs it
(`text_encoder.model(..., output_hidden_states=True, use_cache=False)`), first unplaced, then placed as the plan
records it on the installer's builder (install/pipeline.py, install/text_encoder.py): every hidden state must be
bitwise the unplaced one's, since a placement moves weights and never a number. On the CPU the moves go from the CPU
to the CPU (the GPU suite moves them across the link), and a conditioner wider than verify's CPU limit is reported
as not run.
"""

from __future__ import annotations

from .text_encoder_build import build_text_encoder

ROWS = 12  # prompt tokens: enough to fill every hidden state, small enough for the CPU
WIDEST_ON_CPU = 1024  # the text hidden size a CPU verify builds (verify's own transformer limit)


def check(plan, rep, compare, *, device="cpu", seed: int = 4) -> None:
    """Report the placement's line on `rep` (verify.Report); nothing when the plan places no conditioner."""
    import torch

    from h3plan.install.pipeline import pipeline_options
    from h3plan.install.text_encoder import place

    setting = pipeline_options(plan).view("pipeline").text_encoder
    if setting is None:
        return
    name = f"text_encoder={setting}"
    model = plan.get("model")
    config = model.get("text_encoder") or model.get("text_encoder_default")
    if config is None:
        rep.skip(name, "no conditioner config (model.text_encoder, model.text_encoder_default)", True)
        return
    hidden = int(config["text_config"]["hidden_size"])
    if str(device) == "cpu" and hidden > WIDEST_ON_CPU:
        rep.skip(name, f"a conditioner of hidden size {hidden} on the CPU (model=h3_tiny's is small)", True)
        print(f"SKIP  {name:<34} conditioner hidden size {hidden}: too wide for the CPU")
        return
    te = build_text_encoder(config, device=device, seed=seed)
    g = torch.Generator("cpu").manual_seed(seed)
    ids = torch.randint(0, int(config["text_config"]["vocab_size"]), (1, ROWS), generator=g).to(device)

    def encode():
        with torch.no_grad():
            out = te.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True,
                           use_cache=False)
        return [h.detach().clone() for h in out.hidden_states]

    want = encode()
    placed = place(te, setting, device)
    try:
        got = encode()
        line = placed.line
    finally:
        placed.restore()
    m = {f"hidden_states[{i}]": compare(a, b) for i, (a, b) in enumerate(zip(got, want))}
    same = len(got) == len(want) and all(x["bitwise"] for x in m.values())
    worst = {k: v for k, v in m.items() if not v["bitwise"]}
    rep.line(name, ("bitwise equal to unplaced" if same else "NOT bitwise equal to unplaced")
             + f"; {len(want)} hidden states of {ROWS} rows; {line}", None if same else dict(list(worst.items())[:3]),
             ok=same)

"""benchmarks/memory.py's conditioner for the cap rows (issue 32): the seeded Qwen3-VL at the packaged widths, its
decoder cut where --text-encoder-layers asks (a host with less memory than the whole conditioner and transformer),
and the rows' markdown saying so."""


import pytest
from scripts import load_script



@pytest.fixture(scope="module")
def memory():
    return load_script("benchmarks/memory.py")


def test_the_conditioner_keeps_its_widths_and_cuts_only_its_decoder(memory):
    from h3plan.actions.bench import configured

    c = configured([])[0]
    whole, cut = memory.conditioner(c), memory.conditioner(c, 16)
    packaged = c["model"]["text_encoder_default"]
    assert whole == dict(packaged) and cut["text_config"]["num_hidden_layers"] == 16
    assert packaged["text_config"]["num_hidden_layers"] == 64  # the packaged config is left as it was
    assert {k: v for k, v in cut["text_config"].items() if k != "num_hidden_layers"} == \
        {k: v for k, v in packaged["text_config"].items() if k != "num_hidden_layers"}
    assert cut["vision_config"] == packaged["vision_config"]
    with pytest.raises(SystemExit, match="at least 1"):
        memory.conditioner(c, 0)


def test_the_rows_say_which_conditioner_ran(memory):
    assert memory._conditioner_line({"text_encoder": "none"}) == []
    line = memory._conditioner_line({"text_encoder": "host", "workflow": "ref2va", "text_encoder_layers": 16})[0]
    assert line.startswith("Workflow ref2va: pipe(prompt=...) through the seeded Qwen3-VL at memory.text_encoder=host")
    assert "cut to 16 layers" in line
    assert "cut" not in memory._conditioner_line({"text_encoder": "host", "workflow": "t2va"})[0]

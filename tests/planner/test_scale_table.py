"""Static FP8 scale tables are validated when the plan is resolved: one line naming the file and
the fault, exit code 2 on the command line; a good table loads per layer with a default row."""

import json

import pytest

from h3plan.facts.scale_table import ScaleTableError, load, row_for


@pytest.mark.parametrize("text,fault", [
    ('{"default": ', "not JSON"),
    ("[]", "non-empty object"),
    ('{"default": {"q": 1, "k": 2}}', "must be {"),
    ('{"default": {"q": 1, "k": -2, "v": 3}}', "finite numbers > 0"),
    ('{"default": {"q": 1, "k": "2", "v": 3}}', "finite numbers > 0"),
    ('{"default": {"q": 1, "k": NaN, "v": 3}}', "finite numbers > 0"),
])
def test_malformed_tables(tmp_path, text, fault):
    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(ScaleTableError, match=fault) as e:
        load(str(p))
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_missing_file():
    with pytest.raises(ScaleTableError, match="no such file"):
        load("/no/such/table.json")


def test_rows_and_default(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"default": {"q": 1, "k": 2, "v": 3},
                             "transformer_blocks.1.attn": {"q": 4, "k": 5, "v": 6}}))
    t = load(str(p))
    assert row_for(t, "transformer_blocks.1.attn") == (4.0, 5.0, 6.0)
    assert row_for(t, "transformer_blocks.0.attn") == (1.0, 2.0, 3.0)
    p.write_text(json.dumps({"transformer_blocks.1.attn": {"q": 4, "k": 5, "v": 6}}))
    with pytest.raises(ScaleTableError, match="no entry for transformer_blocks.0.attn"):
        row_for(load(str(p)), "transformer_blocks.0.attn", str(p))

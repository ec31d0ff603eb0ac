"""A malformed static FP8 scale table on the command line: exit 2, one line."""


def test_cli_rejects_a_malformed_table_in_one_line(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"default": {"q": 1, "k": 0, "v": 3}}')
    p = cli("hardware=sm107", "recipe=nvfp4", "parallel=u8", f"recipe.fp8_static_table={bad}")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "fp8_static_table" in lines[0] and "finite numbers > 0" in lines[0]

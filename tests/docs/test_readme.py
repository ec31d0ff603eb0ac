"""README.md shows what the code does: every plan excerpt is the CLI's real output (every line of it, a line
ending in a cut-off word matched as a prefix), and CI runs exactly the README's test command."""

import re
from pathlib import Path

from h3plan import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _norm(line: str) -> str:
    return " ".join(line.split())


def test_plan_excerpts_are_real_output(capsys):
    excerpts = re.findall(r"<!-- excerpt: (.+?) \(.*?-->\n```\n(.*?)\n```", README, re.S)
    assert len(excerpts) >= 2, "the README lost a plan excerpt marker"
    for command, text in excerpts:
        assert cli.run(command.split()) == 0
        out = [_norm(x) for x in capsys.readouterr().out.splitlines()]
        missing = [line for line in text.splitlines() if line.strip()
                   and not any(o.startswith(_norm(line)) for o in out)]
        assert not missing, (command, missing)


def test_ci_runs_the_readme_test_command():
    cmd = re.search(r"Run the tests.*?```\n(.+?)\n```", README, re.S).group(1).strip()
    assert cmd in (ROOT / ".ci" / "run").read_text()


def test_the_memory_page_quotes_real_output(capsys):
    # docs/memory.md explains the memory and install lines of the README's first plan, quoting them
    text = re.search(r"```\n(memory .*?)\n```", (ROOT / "docs" / "memory.md").read_text(), re.S).group(1)
    assert cli.run(["hardware=sm90", "recipe=bf16", "parallel=u1"]) == 0
    out = [_norm(x) for x in capsys.readouterr().out.splitlines()]
    missing = [line for line in text.splitlines() if not any(o.startswith(_norm(line)) for o in out)]
    assert not missing, missing

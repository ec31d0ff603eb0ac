"""README.md shows what the code does: the plan excerpt is the CLI's real output (every line of it, a line
ending in a cut-off word matched as a prefix), and CI runs exactly the README's test command."""

import re
from pathlib import Path

from h3plan import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _norm(line: str) -> str:
    return " ".join(line.split())


def test_plan_excerpt_is_real_output(capsys):
    m = re.search(r"<!-- excerpt: (.+?) \(.*?-->\n```\n(.*?)\n```", README, re.S)
    assert m, "the README has no plan excerpt marker"
    assert cli.run(m.group(1).split()) == 0
    out = [_norm(x) for x in capsys.readouterr().out.splitlines()]
    missing = [line for line in m.group(2).splitlines() if line.strip() and not any(o.startswith(_norm(line)) for o in out)]
    assert not missing, missing


def test_ci_runs_the_readme_test_command():
    cmd = re.search(r"Run the tests.*?```\n(.+?)\n```", README, re.S).group(1).strip()
    assert cmd in (ROOT / ".ci" / "run").read_text()

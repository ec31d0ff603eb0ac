"""Every `python3 -m h3plan ...` (and `h3plan ...`) command in README.md runs here, in-process, in an empty folder:
plan commands exit 0; the documented error example exits 2 with the line the README shows; commands the README
marks `# GPU` refuse cleanly on a machine without CUDA (exit 2, one line) and are skipped on a GPU host; the
search-path example runs against a folder made here; launchers that are not installed refuse with the install
hint. The slow ones (the 36-plan sweep, the joblib launcher, verify in the Triton interpreter) are marked slow."""

import re
import shlex
from pathlib import Path

import pytest

from h3plan import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _commands() -> list[tuple[str, str, str]]:
    """(command, comment, what follows it) for every h3plan command in the README, in order."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            for part in line.split("&&"):
                m = (re.match(r"\s*(?:\$\s*)?python3 -m h3plan(\s.*)?$", part)
                     or re.match(r"\s*\$\s*h3plan(\s.*)?$", part))
                if m and "pip install" not in part:
                    cmd, _, comment = (m.group(1) or "").partition("#")
                    out.append((" ".join(cmd.split()), comment.strip(), lines[i + 1] if i + 1 < len(lines) else ""))
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        m = re.fullmatch(r"(?:python3 -m h3plan|h3plan)((?:\s+\S+=\S+)+)", span.strip())
        if m:
            out.append((" ".join(m.group(1).split()), "", ""))
    return out


COMMANDS = _commands()
SLOW = ("-m hardware=sm90,sm100,sm103,sm107", "hydra/launcher=joblib", "action=verify model=h3_tiny")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _launcher_installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"hydra_plugins.hydra_{name}_launcher") is not None


def test_the_readme_has_its_commands():
    cmds = [c for c, _, _ in COMMANDS]
    assert "hardware=sm107 recipe=nvfp4 parallel=u8" in cmds
    assert "video.height=704 video.width=1280 video.seconds=10" in cmds
    assert sum("action=" in c for c in cmds) >= 5 and sum(c.startswith("-m ") for c in cmds) >= 3
    assert sum("GPU" in note for _, note, _ in COMMANDS) >= 4


@pytest.mark.parametrize("command, comment, after", [
    pytest.param(c, n, a, marks=[pytest.mark.slow] if any(s in c for s in SLOW) else [])
    for c, n, a in COMMANDS], ids=[c or "(none)" for c, _, _ in COMMANDS])
def test_readme_command(command, comment, after, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # sweeps and benches write into the working folder
    argv = [re.sub(r"<\w+>", "gpu", a) for a in shlex.split(command)]  # placeholders (`partition=<p>`) filled in
    if "file:///path/to/conf" in command:  # the README's own-hardware example, against a folder made here
        (tmp_path / "conf" / "hardware").mkdir(parents=True)
        (tmp_path / "conf" / "hardware" / "myhw.yaml").write_text("defaults:\n  - sm90\n  - _self_\nname: myhw\n")
        argv = [a.replace("file:///path/to/conf", f"file://{tmp_path}/conf") for a in argv]
    m = re.search(r"hydra/launcher=(\w+?)(?:_slurm)?(\s|$)", command)
    if m and not _launcher_installed(m.group(1)):
        assert cli.run(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "pip install -e '.[sweep]'" in err[0], err
        return
    if m and m.group(1) == "submitit":
        pytest.skip("the submitit launcher needs a Slurm cluster")
    if "GPU" in comment:
        if _cuda():
            pytest.skip("a GPU command: the GPU suite runs it")
        assert cli.run(argv) == 2, capsys.readouterr()
        err = capsys.readouterr().err.strip().splitlines()
        placeholder = re.search(r"/path/to/[\w-]+", command)  # a folder of the user's: refused by name first
        assert len(err) == 1 and err[0].startswith("h3plan: error: "), err
        assert (placeholder.group(0) in err[0]) if placeholder else ("GPU" in err[0]), err
        return
    rc = cli.run(argv)
    out, err = capsys.readouterr()
    if after.startswith("h3plan: error:"):  # the README shows the refusal it documents
        assert rc == 2 and err.strip() == after.strip()
        return
    assert rc == 0, err
    assert "warning" not in err and "error" not in err, err

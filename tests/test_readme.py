"""Every Python snippet in README.md runs as written (in a fresh folder, one namespace per snippet), and every
``plelab`` command line in it parses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_snippets():
    assert len(python_snippets()) >= 3


@pytest.mark.parametrize("index", range(len(python_snippets())))
def test_readme_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    code = python_snippets()[index]
    exec(compile(code, f"README.md python snippet {index + 1}", "exec"), {"__name__": f"readme_{index}"})


def plelab_commands() -> list[str]:
    """Every ``plelab ...`` command line in the README's bash blocks (comments and ``\\`` continuations resolved)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("plelab ") and " ... " not in line:  # "..." marks an elided example
                lines.append(line)
    return lines


def test_every_plelab_command_in_the_readme_parses():
    import shlex

    from plelab.cli import build_parser

    commands = plelab_commands()
    assert any(c.startswith("plelab ingest") for c in commands)
    parser = build_parser()
    for command in commands:
        argv = [a for a in shlex.split(command)[1:] if a not in ("&&",)]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                raise AssertionError(f"README command does not parse: {command}") from None


def test_the_own_decoder_snippet_trains_monitors_and_diagnoses(tmp_path, monkeypatch):
    """README's "PLE in your own decoder": a nanoGPT-shaped model, param_groups' table group, a Monitor with
    logits_of and plelab.diagnose on its folder (issue 53, 1)."""
    import json

    (code,) = [c for c in python_snippets() if "class GPT(nn.Module)" in c]
    assert all(s in code for s in ("plelab.param_groups(", "plelab.Monitor(", "logits_of=", "plelab.diagnose("))
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"__name__": "readme_own_decoder"}
    exec(compile(code, "README.md own-decoder snippet", "exec"), namespace)
    saved = json.loads((tmp_path / "runs/mine/checkpoints/step-000008/diagnostics.json").read_text())
    assert saved["use"]["permute"]["windows"] == 16 and len(saved["layers"]) == 2
    assert namespace["report"]["table"]["verdict"]["use"] in ("USED", "UNUSED", "UNDECIDED")

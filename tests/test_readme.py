"""Every Python snippet in README.md and docs/*.md runs as written (in a fresh folder, one namespace per snippet),
every ``plelab`` command line in their bash blocks (and in studies/FINDINGS.md's) parses, every TOML block is a
config file plelab resolves, and no file of the repo points outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the pages whose code blocks are the documentation's promise: README first, then every guide page
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FINDINGS = ROOT / "studies" / "FINDINGS.md"


def blocks(language: str, pages: list[Path] = PAGES) -> list[tuple[str, str]]:
    """``(label, code)`` of every fenced ``language`` block of ``pages``; the label names the page and the block's
    place in it, e.g. ``docs/attach.md python 2``."""
    out = []
    for page in pages:
        found = re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)
        name = page.relative_to(ROOT).as_posix()
        out += [(f"{name} {language} {i + 1}", code) for i, code in enumerate(found)]
    return out


def python_snippets() -> list[str]:
    return [code for _, code in blocks("python")]


PYTHON = blocks("python")


def test_the_pages_have_python_snippets():
    labels = [label for label, _ in PYTHON]
    assert any(label.startswith("README.md") for label in labels) and len(labels) >= 10
    assert (ROOT / "docs" / "ple.md").exists() and len(PAGES) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("label, code", PYTHON, ids=[label.replace(" ", "-") for label, _ in PYTHON])
def test_snippet_runs(label, code, tmp_path, monkeypatch):
    if re.search(r"^import lightning|^from lightning", code, flags=re.M):
        pytest.importorskip("lightning", reason="lightning is not installed here (pip install lightning; CI has it)")
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(code, label, "exec"), {"__name__": re.sub(r"\W", "_", label)})


def bash_lines(pages: list[Path]) -> list[str]:
    """Every line of the pages' bash blocks, comments and ``\\`` continuations resolved."""
    lines = []
    for _, block in blocks("bash", pages):
        joined = re.sub(r"\\\n\s*", " ", block)
        lines += [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line]


def plelab_commands(pages: list[Path] = PAGES) -> list[str]:
    """Every ``plelab ...`` command line in the pages' bash blocks; a ``torchrun ... -m plelab VERB ...`` line
    counts from ``plelab`` on, and the ``plelab`` part after ``&&`` of a line that prepares something first."""
    commands = []
    for line in bash_lines(pages):
        for part in line.split("&&"):
            part = part.strip()
            if " -m plelab " in part:
                part = "plelab " + part.split(" -m plelab ", 1)[1]
            if part.startswith("plelab ") and " ... " not in part:  # "..." marks an elided example
                commands.append(part)
    return commands


def test_every_plelab_command_in_the_pages_parses():
    import shlex

    from plelab.cli import build_parser

    commands = plelab_commands([*PAGES, FINDINGS])
    assert any(c.startswith("plelab ingest") for c in commands)
    assert any(c.startswith("plelab train --preset seed-3b") for c in commands)  # a torchrun line, read from -m on
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:
            if exc.code:
                raise AssertionError(f"documented command does not parse: {command}") from None


def test_every_script_the_pages_run_exists():
    scripts = [m for line in bash_lines([*PAGES, FINDINGS])
               for m in re.findall(r"(?:^|&& )(?:bash|python) (scripts/\S+)", line)]
    assert scripts and all((ROOT / s).is_file() for s in scripts), [s for s in scripts if not (ROOT / s).is_file()]


@pytest.mark.parametrize("label, text", blocks("toml"), ids=[label.replace(" ", "-") for label, _ in blocks("toml")])
def test_toml_blocks_are_config_files(label, text, tmp_path):
    import plelab

    path = tmp_path / "run.toml"
    path.write_text(text)
    cfg = plelab.resolve_config(None, config=path)
    assert cfg.ple.dim > 0, label


def test_the_own_decoder_snippet_trains_monitors_and_diagnoses(tmp_path, monkeypatch):
    """docs/own-decoder.md: a nanoGPT-shaped model, param_groups' table group, a Monitor with logits_of and
    plelab.diagnose on its folder."""
    import json

    (code,) = [c for c in python_snippets() if "class GPT(nn.Module)" in c]
    assert all(s in code for s in ("plelab.param_groups(", "plelab.Monitor(", "logits_of=", "plelab.diagnose("))
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"__name__": "readme_own_decoder"}
    exec(compile(code, "docs/own-decoder.md snippet", "exec"), namespace)
    saved = json.loads((tmp_path / "runs/mine/checkpoints/step-000008/diagnostics.json").read_text())
    assert saved["use"]["permute"]["windows"] == 16 and len(saved["layers"]) == 2
    assert namespace["report"]["table"]["verdict"]["use"] in ("USED", "UNUSED", "UNDECIDED")


def test_the_readme_links_to_pages_that_exist():
    for page in [*PAGES, FINDINGS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to a missing {target}"


OUTSIDE = ("../" + "shared/", "ple_" + "reference.md")  # spelled in pieces so that this file does not contain them


def repo_files() -> list[str]:
    """The repo's files (tracked, and untracked ones git does not ignore), relative to its root."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the repo's file list is unknown")
    return [name for name in out.decode().split("\0") if name]


def test_no_file_points_outside_the_repo():
    offenders = []
    for name in repo_files():
        path = ROOT / name
        if path.is_file() and any(needle.encode() in path.read_bytes() for needle in OUTSIDE):
            offenders.append(name)
    assert not offenders, f"these files point outside the repo ({', '.join(OUTSIDE)}); cite docs/ple.md: {offenders}"

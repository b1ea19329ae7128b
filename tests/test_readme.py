"""Every Python snippet in README.md runs as written (in a fresh folder, one namespace per snippet)."""

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

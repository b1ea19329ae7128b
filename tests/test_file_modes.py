"""Every file and folder plelab writes gets the mode the umask implies (teammates on a shared machine can read a
run, its checkpoints, its report and the ingest cache), never mkstemp's 0600 / mkdtemp's 0700."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from plelab.cli import main
from plelab.io import atomic_write, temp_dir, umask


@pytest.fixture
def umask_027():
    """An unusual umask, so that neither 0644 written by default nor mkstemp's 0600 could pass for it."""
    old = os.umask(0o027)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, list[str]]:
    wrong: dict[str, list[str]] = {"files": [], "folders": []}
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        if p.is_symlink():
            continue
        if p.is_dir() and mode != 0o750:
            wrong["folders"].append(f"{p.relative_to(root)} {oct(mode)}")
        elif p.is_file() and mode != 0o640:
            wrong["files"].append(f"{p.relative_to(root)} {oct(mode)}")
    return wrong


def test_the_helpers_follow_the_umask(tmp_path, umask_027):
    assert umask() == 0o027
    f = atomic_write(tmp_path / "a.json", lambda p: p.write_text("{}"))
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    d = temp_dir(tmp_path, prefix="x.")
    assert stat.S_IMODE(d.stat().st_mode) == 0o750


@pytest.mark.slow
def test_a_run_its_checkpoints_report_and_cache_are_readable_as_the_umask_says(tmp_path, monkeypatch, umask_027):
    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", "--steps", "4", "--set", "train.checkpoint_every=2",
                 "--set", "train.eval_every=2", "--out", str(run), "--no-progress"]) == 0
    sweep = tmp_path / "sweep"
    assert main(["sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "2", "--steps", "4", "--set",
                 "train.eval_every=2", "--out", str(sweep), "--no-progress"]) == 0
    assert list(run.glob("checkpoints/step-*")) and (sweep / "report" / "report.md").exists()
    for root in (run, sweep, tmp_path / "cache"):
        assert _modes(root) == {"files": [], "folders": []}, root

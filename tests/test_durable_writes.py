"""Renames into place survive a power loss: what is renamed is fsynced before the rename, the folder holding the new
name after it (issue 54 item 12). A power cut cannot be staged in a test, so the order of the calls is what is
checked: every file under the final name was synced before the rename that named it, its folder after."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import plelab.io
from plelab.data import get_tokenizer, load_corpus
from plelab.data.corpus import Corpus
from plelab.data.streaming import prepare_tokens
from plelab.io import atomic_write, write_json
from plelab.training import checkpoint as ckpt

PACKAGE = Path(plelab.io.__file__).resolve().parent


@pytest.fixture
def calls(monkeypatch):
    """Every ``os.fsync`` (the synced file's or folder's inode) and every rename (the inode renamed), in order."""
    seen: list[tuple[str, int]] = []
    fsync, replace, rename = os.fsync, os.replace, os.rename

    def on_fsync(fd):
        seen.append(("fsync", os.fstat(fd).st_ino))
        return fsync(fd)

    def on_replace(src, dst, *a, **k):
        seen.append(("rename", os.lstat(src).st_ino))
        return replace(src, dst, *a, **k)

    def on_rename(src, dst, *a, **k):
        seen.append(("rename", os.lstat(src).st_ino))
        return rename(src, dst, *a, **k)

    monkeypatch.setattr(os, "fsync", on_fsync)
    monkeypatch.setattr(os, "replace", on_replace)
    monkeypatch.setattr(os, "rename", on_rename)
    return seen


def _synced_around(calls: list[tuple[str, int]], final: Path) -> None:
    """``final`` (a file, or a folder and everything in it) was synced before the rename that named it, and the
    folder holding it after."""
    moved = final.stat().st_ino
    at = calls.index(("rename", moved))
    before = {ino for what, ino in calls[:at] if what == "fsync"}
    inside = [final, *final.rglob("*")] if final.is_dir() else [final]
    unsynced = [str(p.relative_to(final.parent)) for p in inside if p.stat().st_ino not in before]
    assert not unsynced, f"renamed into place without an fsync first: {unsynced}"
    assert ("fsync", final.parent.stat().st_ino) in calls[at + 1:], f"{final.parent} not synced after the rename"


def test_atomic_write_syncs_the_file_before_the_rename_and_the_folder_after(tmp_path, calls):
    path = write_json(tmp_path / "sub" / "state.json", {"step": 3})
    _synced_around(calls, path)
    calls.clear()
    path = atomic_write(tmp_path / "blob.bin", lambda p: p.write_bytes(b"x" * 4096))  # over an absent name
    _synced_around(calls, path)
    assert path.read_bytes() == b"x" * 4096


def test_a_checkpoint_folder_is_synced_whole_before_it_is_named(tmp_path, calls):
    state = {"tokens_seen": 0, "val_history": [], "config": {}}
    final = ckpt.save_checkpoint(tmp_path / "run", 2, {"w": torch.ones(3)}, {"w.exp_avg": torch.zeros(3)}, state,
                                 keep=2)
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors", "optimizer.safetensors", "state.json"]
    _synced_around(calls, final)


def test_an_ingest_cache_entry_is_synced_whole_before_it_is_named(tiny_data, calls):
    tok = get_tokenizer(load_corpus(None), 512, show_progress=False)  # the session's cached BPE
    texts = [f"Entry {i}: durable writes sync the shards before the folder is renamed into place." for i in range(300)]
    data = prepare_tokens(Corpus("durable", texts), tok, 0.05)
    entry = Path(data.location)
    assert (entry / "manifest.json").exists()
    _synced_around(calls, entry)


def test_every_rename_into_place_goes_through_the_synced_one():
    """A new rename site must sync (``plelab.io.replace_synced`` / ``atomic_write``); the ones listed here rename
    something away to delete it, where a power loss costs nothing."""
    away = {("training/checkpoint.py", "old.rename(trash)"), ("data/streaming.py", "os.replace(folder, gone)")}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            for call in re.findall(r"(?:os\.replace|os\.rename|\w+\.rename|\w+\.replace)\([^)]*\)", code):
                if rel == "io.py" or call.startswith(("str.", "s.", "text.", "name.", "dataclasses.")):
                    continue
                if re.match(r"\w+\.replace\(\s*[\"']", call) or "dataclasses.replace" in line:
                    continue  # a string's replace
                found.add((rel, call))
    assert found <= away, sorted(found - away)

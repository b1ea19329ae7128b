"""The malformed-input suite, part 2 (issue 54's medium items), grouped by root cause.

As in ``tests/test_malformed_inputs.py``: each case of :data:`CASES` runs ``plelab.cli.main`` in-process and must end
with exit code 2, exactly one line on stderr naming the problem (no traceback), and every file that existed before
the command byte-identical after it. The other tests check what must be accepted, or what a refusal must leave.
Everything here is tiny data the tests write themselves.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import re
import resource
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from malformed import refused
from safetensors.torch import load_file, save_file
from safetensors_edit import relabel

from plelab.cli import main
from plelab.data.jsonl import jsonl_documents
from plelab.data.sources import resolve_source
from plelab.errors import PlelabError
from plelab.io import atomic_write
from plelab.training.sharded_checkpoint import load_sharded_weights

INGEST = ["ingest", "--no-progress"]
RESUME = ["train", "--no-progress", "--resume", "--out"]
TRAIN = ["train", "--preset", "cpu-tiny", "--steps", "2", "--no-progress"]
CKPT = "checkpoints/step-000002"
WORDS = ["alpha", "beta", "gamma", "delta", "table", "layer", "token", "gate", "row", "head"]


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=60)) for _ in range(n)]


def _jsonl(path: Path, records: list, tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("malformed2")
    records = [{"text": d} for d in _docs(80)]
    # JSONL a parser can choke on (item 5): a line nested 100,000 deep, an integer of 5,000 digits
    _jsonl(w / "jsonl/deep.jsonl", records, '{"text": "x", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    _jsonl(w / "jsonl/huge-int.jsonl", records, '{"text": "x", "id": ' + "9" * 5000 + "}\n")
    # data folders with links (item 6)
    for name in ("loop", "twice", "dangling", "dangling-dir"):
        for i, doc in enumerate(_docs(20, seed=len(name))):
            (w / "folders" / name / "real").mkdir(parents=True, exist_ok=True)
            (w / "folders" / name / "real" / f"{i}.txt").write_text(doc)
    (w / "folders/loop/real/back").symlink_to("..")
    (w / "folders/twice/again").symlink_to("real")
    (w / "folders/dangling/gone.txt").symlink_to("nowhere.txt")
    (w / "folders/dangling-dir/more").symlink_to("nowhere")
    # mixtures that would read one file twice (low items: 'a.jsonl' and './a.jsonl' passed the named-twice check)
    _jsonl(w / "mix/a.jsonl", records)
    (w / "mix/alias.jsonl").symlink_to("a.jsonl")
    _jsonl(w / "mix/docs/b.jsonl", records)
    (w / "big.txt").write_text("\n\n".join(_docs(2500, seed=7)))  # ~1.1 MB: a shard of ~100k ids
    # a tiny finished run whose copies get their state.json edited (item 8)
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--no-progress", "--out", str(w / "run")]) == 0
    return w


def _edited_run(w: Path, name: str, edit, file: str = "state.json") -> str:
    """A copy of the fixture's run whose checkpoint ``file`` (state.json, or a safetensors file) went through
    ``edit``."""
    run = w / "cases" / name
    shutil.copytree(w / "run", run)
    path = run / CKPT / file
    if file.endswith(".json"):
        state = json.loads(path.read_text())
        edit(state)
        path.write_text(json.dumps(state))
    else:
        save_file(edit(load_file(path)), str(path), metadata={"format": "plelab-checkpoint-v1"})
    return str(run)


def _damaged_cache(w: Path, name: str, damage, verb: tuple = ()) -> list[str]:
    """``plelab ingest`` (or ``verb``) of a text of its own, after its cache entry, built here, went through
    ``damage(entry folder)``."""
    data = w / "cache-cases" / f"{name}.txt"
    data.parent.mkdir(exist_ok=True)
    data.write_text("\n\n".join(_docs(200, seed=sum(map(ord, name)))))
    argv = [*INGEST, "--data", str(data)]
    assert main(argv) == 0
    entry, = [e for e in (Path(os.environ["PLELAB_CACHE"]) / "ingest").iterdir()
              if json.loads((e / "manifest.json").read_text())["source"].get("path") == str(data.resolve())]
    damage(entry)
    return [*verb, "--data", str(data)] if verb else argv


def _manifest_shard(**change):
    def edit(entry: Path) -> None:
        manifest = json.loads((entry / "manifest.json").read_text())
        manifest["splits"]["train"]["shards"][0].update(change)
        (entry / "manifest.json").write_text(json.dumps(manifest))
    return edit


def _ids_beyond_the_vocabulary(entry: Path) -> None:
    """An id of 60,000 written into the first train shard, its mtime restored (nothing but its bytes tell)."""
    shard = entry / "train-00000.bin"
    st = shard.stat()
    ids = np.fromfile(shard, dtype=np.uint16)
    ids[7] = 60_000
    ids.tofile(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def _cut(entry: Path) -> None:
    shard = entry / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _extra_tensor(tensors: dict) -> dict:
    return {**tensors, "model.extra.weight": torch.zeros(3, 3)}


def _state(key: str, value):
    return lambda d: d.update({key: value})


def _documents(out: str) -> int:
    """Train + validation documents in plelab ingest's summary line."""
    train, val = re.search(r"([\d,]+) train / ([\d,]+) validation documents", out).groups()
    return int(train.replace(",", "")) + int(val.replace(",", ""))


SHARD = "shard-0000{}-model-00001-of-00001.safetensors"


def _two_shards(w: Path, name: str, offsets=((0, 0), (4, 0)), infos=(None, None), relabel_first=False) -> str:
    """A sharded checkpoint of one tensor ``w`` [8, 4] saved in two pieces of 4 rows, as DCP's safetensors storage
    writes them (each file's ``DCP_SHARDING_INFO`` metadata holds its piece's offsets; ``infos`` replaces that
    text), with the files' manifest in its state.json and no run config (consolidate checks the pieces alone)."""
    ckpt = w / "sharded" / name / "checkpoints" / "step-000001"
    folder = ckpt / "sharded" / "model"
    folder.mkdir(parents=True)
    for rank, (offset, info) in enumerate(zip(offsets, infos)):
        text = info if info is not None else json.dumps({"w": {"saved_offsets": list(offset)}})
        save_file({"w": torch.arange(16.0).view(4, 4) + 16 * rank}, str(folder / SHARD.format(rank + 1)),
                  metadata={"DCP_SHARDING_INFO": text})
    if relabel_first:
        relabel(folder / SHARD.format(1), "w")
    files = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    (ckpt / "state.json").write_text(json.dumps({"format": "plelab-checkpoint-v1", "step": 1, "storage": "sharded",
                                                 "files": files}))
    return str(ckpt)


# damaged pieces of a sharded tensor: (keyword arguments of _two_shards, what the one line must say)
PIECES = {
    "piece-relabelled-int32": ({"relabel_first": True}, "w is stored as float32 in shard-00002-model-00001-of-00001"
                                                        ".safetensors and as int32 in shard-00001"),
    "pieces-hold-rows-twice": ({"offsets": ((0, 0), (0, 0))}, "the saved pieces of w do not hold it exactly once (rows "
                                                              "0–3 are held twice)"),
    "pieces-leave-rows-unwritten": ({"offsets": ((4, 0), (4, 0))}, "(rows 0–3 are held by no shard); its shard "
                                                                   "offsets are damaged"),
    "piece-metadata-not-json": ({"infos": ("{garbage", None)}, "the headers of its model shards are damaged "
                                                               "(JSONDecodeError"),
    "piece-metadata-lacks-its-tensor": ({"infos": (json.dumps({"v": {"saved_offsets": [0, 0]}}), None)},
                                        "the headers of its model shards are damaged (KeyError: 'w')"),
}


# id -> (argv builder taking the work folder, the substring the one-line error must contain)
CASES = {
    # item 5: every way a JSONL line fails to parse is one line naming the file and the line
    "ingest-jsonl-nested-100000-deep": (lambda w: [*INGEST, "--data", f"{w}/jsonl/deep.jsonl"],
                                        "deep.jsonl line 81 is nested deeper than the JSON parser follows"),
    "ingest-jsonl-integer-of-5000-digits": (lambda w: [*INGEST, "--data", f"{w}/jsonl/huge-int.jsonl"],
                                            "huge-int.jsonl line 81 holds an integer of more than 4,300 digits"),
    # item 6: linked folders are followed once; a loop, a folder linked twice, a link to nothing are named
    "ingest-folder-with-a-link-loop": (lambda w: [*INGEST, "--data", f"{w}/folders/loop"],
                                       "real/back and the data folder itself are one folder (a link loop"),
    "ingest-folder-linked-twice": (lambda w: [*INGEST, "--data", f"{w}/folders/twice"],
                                   "real and again are one folder (a link loop, or two links to one folder"),
    "ingest-folder-with-a-dangling-txt-link": (lambda w: [*INGEST, "--data", f"{w}/folders/dangling"],
                                               "gone.txt is a link to nowhere.txt, which does not exist"),
    "ingest-folder-with-a-dangling-folder-link": (lambda w: [*INGEST, "--data", f"{w}/folders/dangling-dir"],
                                                  "more is a link to nowhere, which does not exist"),
    # item 8: state.json validated by one schema before anything of the run is read or rewritten
    "resume-state-step-negative": (lambda w: [*RESUME, _edited_run(w, "neg", _state("step", -3))],
                                   "state.json: step is -3, not an integer >= 0; the checkpoint is damaged or was "
                                   "edited — delete step-000002"),
    "resume-state-step-a-string": (lambda w: [*RESUME, _edited_run(w, "str", _state("step", "2")), "--steps", "4"],
                                   "step is '2', not an integer >= 0"),
    "resume-state-step-10-to-the-30": (lambda w: [*RESUME, _edited_run(w, "huge", _state("step", 10**30))],
                                       "step 1000000000000000000000000000000 is beyond train.steps=2 of the run"),
    "resume-state-step-not-its-folder": (lambda w: [*RESUME, _edited_run(w, "other", _state("step", 1))],
                                         "step 1 disagrees with its folder step-000002"),
    "resume-state-tokens-a-float": (lambda w: [*RESUME, _edited_run(w, "tok", _state("tokens_seen", 1.5))],
                                    "tokens_seen is 1.5, not an integer >= 0"),
    "resume-state-wall-seconds-nan": (lambda w: [*RESUME, _edited_run(w, "nan", _state("wall_seconds", math.nan))],
                                      "wall_seconds is nan, not a number >= 0"),
    "resume-state-val-history-cut": (lambda w: [*RESUME, _edited_run(w, "val", _state("val_history", [[2]]))],
                                     "val_history is [[2]], not a list of [step, loss] pairs"),
    "resume-state-train-section-a-string": (
        lambda w: [*RESUME, _edited_run(w, "train", lambda d: d["config"].update(train="x"))],
        "config.train is 'x', not an object"),
    "resume-state-rng-a-float": (
        lambda w: [*RESUME, _edited_run(w, "rng", lambda t: {**t, "rng.torch_cpu": t["rng.torch_cpu"].float()},
                                        "optimizer.safetensors")],
        "rng.torch_cpu is stored as float32, the model expects uint8"),
    "eval-state-world-size-a-string": (lambda w: ["eval", _edited_run(w, "world", _state("world_size", "1"))],
                                       "world_size is '1', not an integer >= 1"),
    # item 9: an ingest cache entry is checked when it is opened: names, sizes, ids
    "ingest-cache-ids-beyond-the-vocabulary": (lambda w: _damaged_cache(w, "oov", _ids_beyond_the_vocabulary),
                                               "its shard train-00000.bin holds id 60,000, beyond the tokenizer's"),
    "train-cache-ids-beyond-the-vocabulary": (
        lambda w: _damaged_cache(w, "oov-train", _ids_beyond_the_vocabulary, (*TRAIN, "--out", f"{w}/o/oov")),
        "holds id 60,000, beyond the tokenizer's"),
    "ingest-cache-shard-cut": (lambda w: _damaged_cache(w, "cut", _cut),
                               "run plelab ingest --verify with the same --data and flags to rebuild it"),
    "ingest-cache-shard-named-up-and-out": (
        lambda w: _damaged_cache(w, "up", _manifest_shard(file="../../../../etc/passwd")),
        "it names a shard '../../../../etc/passwd', not a train-NNNNN.bin file of the cache folder"),
    "ingest-cache-shard-named-absolute": (lambda w: _damaged_cache(w, "abs", _manifest_shard(file="/etc/passwd")),
                                          "it names a shard '/etc/passwd'"),
    "ingest-cache-shard-tokens-a-string": (lambda w: _damaged_cache(w, "str", _manifest_shard(tokens="12")),
                                           "has a token count '12', not an integer >= 0"),
    # low items: a mixture that reads one file twice, however its paths are spelled
    "ingest-mixture-naming-a-file-as-a-jsonl-and-./a-jsonl": (
        lambda w: [*INGEST, "--data", f"{w}/mix/a.jsonl:1", "--data", f"{w}/mix/./a.jsonl:1"],
        "a mixture names a source twice"),
    "ingest-mixture-of-a-file-and-a-link-to-it": (
        lambda w: [*INGEST, "--data", f"{w}/mix/a.jsonl:1", "--data", f"{w}/mix/alias.jsonl:1"],
        "mix/alias.jsonl are one file or folder (through a link): its documents would be read twice"),
    "ingest-mixture-of-a-folder-and-a-file-in-it": (
        lambda w: [*INGEST, "--data", f"{w}/mix/docs:1", "--data", f"{w}/mix/./docs/b.jsonl:1"],
        "mix/docs/b.jsonl both hold"),
    # low items: generate's and visual-ids' --device and --seed checked before use (torch's traceback before)
    "generate-unknown-device": (lambda w: ["generate", f"{w}/run", "--prompt", "hi", "--device", "banana"],
                                "invalid device 'banana': allowed auto | cpu | cuda | cuda:N | mps"),
    "generate-seed-of-31-digits": (lambda w: ["generate", f"{w}/run", "--prompt", "hi", "--seed", "1" * 31],
                                   f"--seed {'1' * 31} is not an integer from 0 to 9,223,372,036,854,775,807"),
    "visual-ids-seed-of-31-digits": (lambda w: ["visual-ids", "--k", "4", "--scenes", "10", "--seed", "1" * 31],
                                     f"--seed {'1' * 31} is not an integer from 0 to"),
    # silent items: a tensor model.safetensors holds beyond the model's is refused by every reader, as by resume
    **{f"{verb}-weights-with-an-extra-tensor": (
        lambda w, verb=verb, extra=extra: [verb, _edited_run(w, f"extra-{verb}", _extra_tensor, "model.safetensors"),
                                           *extra(w)],
        "does not fit this model (unexpected model.extra.weight)")
       for verb, extra in (("eval", lambda w: []), ("export", lambda w: [f"{w}/o/extra-export"]),
                           ("diagnose", lambda w: ["--no-progress"]), ("generate", lambda w: ["--prompt", "hi"]))},
    # low items (consolidate reported success): a sharded tensor's pieces in one dtype, each element held once
    **{f"consolidate-{name}": (lambda w, name=name, kw=kw: ["consolidate", _two_shards(w, name, **kw)], needle)
       for name, (kw, needle) in PIECES.items()},
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_input(case, work, capsys):
    build, needle = CASES[case]
    refused(build(work), needle, work, capsys)


# ---- item 5: a lone surrogate is read as U+FFFD, never a traceback in hashing or the tokenizer ------------------

def test_a_lone_surrogate_is_read_as_the_replacement_character(tmp_path, capsys):
    docs = _docs(60)
    path = _jsonl(tmp_path / "web.jsonl", [{"text": d + (" \ud800 cut" if i == 3 else "")} for i, d in enumerate(docs)]
                  + [{"text": "a pair \ud83d\ude00 stays"}])
    read = list(jsonl_documents(path, "text"))
    assert read[3] == docs[3] + " \ufffd cut" and read[-1] == "a pair \U0001F600 stays"
    assert main([*INGEST, "--data", str(path)]) == 0  # the tokenizer sample (hash_sample), the fingerprint, the shards
    assert _documents(capsys.readouterr().out) == 61


# ---- item 6: a linked sub-folder is read ------------------------------------------------------------------------

def test_a_linked_sub_folder_is_read(tmp_path, capsys):
    (tmp_path / "data/own").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for i, doc in enumerate(_docs(30)):
        (tmp_path / ("data/own" if i < 15 else "elsewhere") / f"{i}.txt").write_text(doc)
    (tmp_path / "data/linked").symlink_to(tmp_path / "elsewhere")
    src = resolve_source(tmp_path / "data")
    assert len(src.files) == 30 and sum(f.parent.name == "linked" for f in src.files) == 15
    assert main([*INGEST, "--data", str(tmp_path / "data"), "--set", "data.val_fraction=0.3"]) == 0
    assert _documents(capsys.readouterr().out) == 30


# ---- item 9: --verify rebuilds a damaged cache entry ------------------------------------------------------------

def test_verify_rebuilds_a_damaged_cache_entry(work, capsys):
    argv = _damaged_cache(work, "rebuilt", _ids_beyond_the_vocabulary)
    capsys.readouterr()
    assert main([*argv, "--verify"]) == 0
    assert "holds id 60,000, beyond the tokenizer's" in capsys.readouterr().out
    assert main(argv) == 0


# ---- item 10: export onto a full disk ---------------------------------------------------------------------------

@pytest.mark.parametrize("limit", [64 << 10, 0], ids=["model-file-too-large", "config-file-too-large"])
def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(work, capsys, limit):
    """The file-size limit makes the real writers fail as a full disk does (safetensors' Rust writer with a
    SafetensorError, Python's with an OSError): one line, and no folder left, complete-looking or not."""
    out = work / "o" / f"export-{limit}"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        refused(["export", str(work / "run"), str(out)], f"cannot write export folder {out}: ", work, capsys)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, ignored)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
    assert main(["export", str(work / "run"), str(out)]) == 0  # space freed: the same command writes it


# ---- low items: a sharded tensor's pieces are checked before consolidate or a resume reads them -----------------

class _One(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(8, 4))


@pytest.mark.parametrize("name", list(PIECES))
def test_a_resume_refuses_the_damaged_pieces_consolidate_refuses(work, name):
    kwargs, needle = PIECES[name]
    ckpt = Path(_two_shards(work, f"resume-{name}", **kwargs))
    with pytest.raises(PlelabError, match=re.escape(needle)) as exc:
        load_sharded_weights(_One(), ckpt, "delete that checkpoint folder")
    assert "\n" not in str(exc.value) and str(exc.value).endswith("delete that checkpoint folder")


def test_pieces_that_tile_their_tensor_consolidate_and_load_whole(work):
    ckpt = Path(_two_shards(work, "whole"))
    model = _One()
    load_sharded_weights(model, ckpt, "fix")
    assert torch.equal(model.w.detach(), torch.arange(32.0).view(8, 4))
    assert main(["consolidate", str(ckpt)]) == 0
    assert torch.equal(load_file(ckpt / "model.safetensors")["w"], torch.arange(32.0).view(8, 4))


# ---- 'cannot access:' without the file's name (the known open case): a failed write names its file -------------

def test_a_failed_write_names_its_file(tmp_path):
    def full(path):
        path.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")  # what write() raises on a full disk: no file name

    def rust(path):
        raise Exception("File too large (os error 27)")  # tokenizers' save on a full disk

    def bug(path):
        raise ValueError("a bug, raised as it is")

    for writer, kind in ((full, OSError), (rust, OSError), (bug, ValueError)):
        with pytest.raises(kind) as exc:
            atomic_write(tmp_path / "out.json", writer)
        if kind is OSError:
            assert exc.value.filename == str(tmp_path / "out.json") and exc.value.errno in (errno.ENOSPC, 27)
    assert not list(tmp_path.iterdir())  # nothing half-written left


@pytest.mark.parametrize("limit, needle", [(1 << 10, "cannot access {cache}/tokenizers/"),
                                           (128 << 10, "cannot write ingest cache entry {cache}/ingest/")],
                         ids=["tokenizer-too-large", "shard-too-large"])
def test_ingest_onto_a_full_disk_names_the_file(work, capsys, monkeypatch, tmp_path, limit, needle):
    """The file-size limit fails the real writers as a full disk does: the tokenizer's (tokenizers' Rust writer) and
    an ingest shard's (write() raising an OSError without a file name: 'cannot access: File too large' before)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("PLELAB_CACHE", str(cache))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        err = refused([*INGEST, "--data", str(work / "big.txt")], needle.format(cache=cache), work, capsys)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, ignored)
    assert "File too large" in err and "cannot access:" not in err

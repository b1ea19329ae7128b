"""The malformed-input suite: every CLI verb fed broken, foreign or hostile inputs.

Each case runs ``plelab.cli.main`` in-process and must end with exit code 2, exactly one line on
stderr that names the problem (no traceback), and every file that existed before the command
byte-identical after it. Pickle payloads in the fixtures would create ``PWNED`` if ever unpickled.
``tests/conftest.py`` prints the count of these cases at the end of the session.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from malformed import refused
from malformed import snapshot as _snapshot
from safetensors.torch import save_file
from safetensors_edit import relabel

from plelab.cli import main

TINY_SWEEP = ["--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "2", "--steps", "4", "--no-progress", "--no-report",
              *[x for o in ("train.eval_every=2", "train.early_checkpoint=2", "train.diag_every=2",
                            "train.checkpoint_every=0", "train.diag_windows=8", "train.eval_batches=1")
                for x in ("--set", o)]]
CKPT = "checkpoints/step-000002"
EMBED = "model.embed_tokens.weight"


class _Payload:
    """Unpickling this runs a shell command that creates ``marker`` (it must never happen)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _png(path: Path, colour) -> None:
    from PIL import Image

    Image.fromarray(np.full((16, 16, 3), colour, np.uint8)).save(path)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Inputs shared by the cases: broken files, a tiny finished run, a tiny finished sweep, image data."""
    w = tmp_path_factory.mktemp("malformed")
    (w / "empty.txt").write_text("")
    (w / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (w / "latin1.txt").write_bytes("café naïve déjà vu. ".encode("latin-1") * 200)
    (w / "one-line.txt").write_text("spam " * 200_000)  # 1 MB on one line, one sentence repeated
    (w / "a-file").write_text("not a folder")
    words = random.Random(0).choices(["alpha", "beta", "gamma", "delta", "table", "layer", "token", "gate"], k=60_000)
    (w / "other.txt").write_text("\n\n".join(" ".join(words[i:i + 100]) for i in range(0, len(words), 100)))
    (w / "empty-dir").mkdir()
    with open(w / "payload.pt", "wb") as f:
        pickle.dump(_Payload(w / "PWNED"), f)
    (w / "truncated.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": {\"dtype\"")
    save_file({"vision.weight": torch.zeros(4, 4)}, str(w / "foreign.safetensors"))
    save_file({"model.embed_tokens_per_layer.weight": torch.randn(16, 8)}, str(w / "hf-table.safetensors"))
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--no-progress", "--out", str(w / "run")]) == 0
    from plelab.sweeps.runner import run_sweep
    from plelab.sweeps.spec import SweepSpec, dp_arms

    sets = [TINY_SWEEP[i + 1] for i, x in enumerate(TINY_SWEEP) if x == "--set"]
    run_sweep(w / "sweep", SweepSpec(preset="cpu-tiny", overrides=sets, arms=dp_arms([0, 8]), seeds=[0, 1], steps=4),
              progress=False, log=lambda *a: None)
    vis = w / "vis"
    vis.mkdir()
    for i in range(6):
        _png(vis / f"ok{i}.png", (40 * i, 10, 200 - 20 * i))
    _png(vis / "whole.png", (1, 2, 3))
    (vis / "truncated.png").write_bytes((vis / "whole.png").read_bytes()[:40])
    (vis / "not-an-image.png").write_text("hello, I am text")
    (vis / "sub").mkdir()
    ok = [json.dumps({"image": f"ok{i}.png", "caption": f"a square number {i}"}) for i in range(6)]
    for name, image in (("missing", "nope.png"), ("truncated", "truncated.png"), ("text", "not-an-image.png"),
                        ("folder", "sub")):
        (vis / f"{name}.jsonl").write_text("\n".join([*ok, json.dumps({"image": image, "caption": "x"})]) + "\n")
    cfg = w / "configs"  # --config files
    cfg.mkdir()
    (cfg / "folder.json").mkdir()
    (cfg / "bad.json").write_text('{"preset": "cpu-tiny",\n "model": {"hidden_size": 64,}}\n')
    (cfg / "bad.toml").write_text('preset = "cpu-tiny"\n[model\nhidden_size = 64\n')
    (cfg / "latin1.toml").write_bytes('preset = "café"\n'.encode("latin-1"))
    (cfg / "unknown-key.toml").write_text("[model]\nbogus = 1\n")
    (cfg / "wrong-type.json").write_text(json.dumps({"model": {"hidden_size": "64"}}))
    (cfg / "heads.toml").write_text("[model]\nnum_attention_heads = 3\n")
    (cfg / "small.toml").write_text('preset = "cpu-small"\n')
    (cfg / "config.yaml").write_text("preset: cpu-tiny\n")
    from hf_models import VOCAB, tiny_host  # foreign checkpoints: tiny attached HF models and their tokenizers
    from tokenizers import Tokenizer, models

    import plelab

    for name, kwargs in (("hf-a", {}), ("hf-b", {"seed": 1}), ("hf-half-rows", {"vocab_size": VOCAB // 2}),
                         ("hf-dp4", {"dim": 4})):
        plelab.attach(tiny_host(), **{"dim": 8, **kwargs}).save_pretrained(w / name)
    for name, size in (("tok-fits.json", VOCAB), ("tok-too-big.json", VOCAB + 50)):
        Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0")).save(str(w / name))
    (w / "words.txt").write_text(" ".join(f"w{i % VOCAB}" for i in range(4000)))
    tok = w / "tok"  # token shards and compressed / columnar text (issue 18)
    tok.mkdir()
    (tok / "odd.bin").write_bytes(b"\x01\x00\x02")
    (tok / "empty.bin").write_bytes(b"")
    np.save(tok / "big.npy", np.arange(1000, dtype=np.uint16))
    np.save(tok / "u32.npy", np.arange(100, dtype=np.uint32))
    (tok / "cut.npy").write_bytes((tok / "u32.npy").read_bytes()[:200])
    np.save(tok / "empty.npy", np.zeros(0, dtype=np.uint16))
    import gzip

    lines = "".join(json.dumps({"text": " ".join(random.Random(i).choices(["spam", "eggs", "ham"], k=50))}) + "\n"
                    for i in range(400))
    packed = gzip.compress(lines.encode())
    (tok / "corrupt.jsonl.gz").write_bytes(packed[:len(packed) // 2])
    mixed = w / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("some text")
    np.arange(10, dtype=np.uint16).tofile(mixed / "b.bin")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a document"] * 10}), tok / "notext.parquet")
    import zstandard  # archives cut short (issue 54): a frame cut is refused, never read as a smaller corpus

    whole = zstandard.ZstdCompressor().compress(((w / "other.txt").read_bytes()))
    (tok / "cut.txt.zst").write_bytes(whole[: len(whole) * 6 // 10])
    rows = lines.splitlines(keepends=True)
    first, second = (zstandard.ZstdCompressor().compress("".join(part).encode()) for part in (rows[:200], rows[200:]))
    (tok / "cut-second-frame.jsonl.zst").write_bytes(first + second[: len(second) // 2])
    docs = [" ".join(random.Random(i).choices(["spam", "eggs", "ham", "toast"], k=80)) for i in range(200)]
    typed = w / "typed"  # Parquet shards whose text column is not string-typed (issue 54)
    for name, column in (("mixed/a.parquet", docs), ("mixed/b.parquet", [d.encode() for d in docs]),
                         ("wrong/a.parquet", list(range(200))), ("wrong/b.parquet", [[d] for d in docs])):
        (typed / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": column, "title": ["t"] * 200}), typed / name)
    siglip = w / "siglip-pickle"
    siglip.mkdir()
    (siglip / "config.json").write_text(json.dumps({"model_type": "siglip_vision_model", "hidden_size": 32}))
    shutil.copy(w / "payload.pt", siglip / "pytorch_model.bin")
    return w


def _copy(w: Path, src: str, name: str) -> Path:
    dst = w / "cases" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(w / src, dst)
    return dst


def _edit_json(path: Path, edit) -> None:
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


def _run_copy(w, name, damage=None):
    run = _copy(w, "run", name)
    if damage:
        damage(run / CKPT)
    return run


def _relabelled_hf(w: Path, name: str, key: str) -> Path:
    """A copy of the attached HF folder hf-a whose ``key`` claims I32 in its safetensors header."""
    folder = _copy(w, "hf-a", f"relabel-{name}")
    relabel(folder / "model.safetensors", key)
    return folder


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _unwritable(w: Path) -> str:
    """A folder nobody can create: chmod 0o500 when not root, a path under a regular file for everyone."""
    if os.geteuid() == 0:
        return str(w / "a-file" / "out")
    locked = w / "cases" / "locked"
    locked.mkdir(parents=True, exist_ok=True)
    locked.chmod(0o500)
    return str(locked / "out")


def _sweep_copy(w, name, damage):
    root = _copy(w, "sweep", name)
    damage(root)
    return str(root)


def _set_arm_name(root: Path, name: str) -> None:
    _edit_json(root / "sweep.json", lambda d: d["arms"][1].update(name=name))


TRAIN = ["train", "--preset", "cpu-tiny", "--steps", "2", "--no-progress"]
INGEST = ["ingest", "--no-progress"]


def _train_config(name: str, out: str):
    """plelab train with one of the fixture's --config files."""
    return lambda w: [*TRAIN, "--config", f"{w}/configs/{name}", "--out", f"{w}/o/{out}"]


RESUME = ["train", "--no-progress", "--resume", "--out"]
VIDS = ["visual-ids", "--k", "4", "--image-size", "16", "--patch", "8", "--data"]

# id -> (argv builder taking the work folder, the substring the one-line error must contain)
CASES = {
    # corpus files: --data / --set data.path=
    "train-empty-corpus": (lambda w: [*TRAIN, "--data", f"{w}/empty.txt", "--out", f"{w}/o/1"], "holds no text"),
    "train-binary-corpus": (lambda w: [*TRAIN, "--data", f"{w}/binary.txt", "--out", f"{w}/o/2"], "looks binary"),
    "train-non-utf8-corpus": (lambda w: [*TRAIN, "--set", f"data.path={w}/latin1.txt", "--out", f"{w}/o/3"],
                              "is not UTF-8 (invalid byte at offset 3); convert it to UTF-8"),
    "train-one-huge-line-repeated": (lambda w: [*TRAIN, "--data", f"{w}/one-line.txt", "--out", f"{w}/o/4"],
                                     "distinct documents into train and validation"),
    "train-missing-corpus": (lambda w: [*TRAIN, "--data", f"{w}/nowhere.txt", "--out", f"{w}/o/5"], "does not exist"),
    "train-corpus-folder-without-text": (lambda w: [*TRAIN, "--data", f"{w}/empty-dir", "--out", f"{w}/o/6"],
                                         "has no .txt/.md/.text/.jsonl/.parquet files"),
    # token shards, compressed and columnar text, mixtures (plelab ingest; train reads the same way)
    "ingest-truncated-bin": (lambda w: [*INGEST, "--data", f"{w}/tok/odd.bin", "--set", "data.token_dtype=uint16"],
                             "odd.bin has 3 bytes, not a whole number of uint16 ids"),
    "ingest-truncated-npy": (lambda w: [*INGEST, "--data", f"{w}/tok/cut.npy"], "cut.npy: mmap length is greater"),
    "ingest-empty-shard": (lambda w: [*INGEST, "--data", f"{w}/tok/empty.npy"], "empty.npy is empty"),
    "ingest-empty-bin": (lambda w: [*INGEST, "--data", f"{w}/tok/empty.bin", "--set", "data.token_dtype=uint16"],
                         "empty.bin is empty"),
    "ingest-bin-without-dtype": (lambda w: [*INGEST, "--data", f"{w}/tok/odd.bin"], "--set data.token_dtype=uint16"),
    "ingest-ids-beyond-the-vocabulary": (lambda w: [*INGEST, "--data", f"{w}/tok/big.npy", "--vocab-size", "512"],
                                         "big.npy holds id 999, beyond model.vocab_size=512"),
    "train-ids-beyond-the-vocabulary": (lambda w: [*TRAIN, "--data", f"{w}/tok/big.npy", "--out", f"{w}/o/tok"],
                                        "raise --vocab-size to at least 1,000"),
    "ingest-dtype-does-not-match": (lambda w: [*INGEST, "--data", f"{w}/tok/u32.npy", "--set",
                                               "data.token_dtype=uint16"],
                                    "holds uint32 ids but data.token_dtype=uint16"),
    "ingest-corrupt-gz": (lambda w: [*INGEST, "--data", f"{w}/tok/corrupt.jsonl.gz"],
                          "corrupt.jsonl.gz: the archive is damaged or truncated"),
    "ingest-folder-mixing-formats": (lambda w: [*INGEST, "--data", f"{w}/mixed"],
                                     "mixes text files (a.txt) with token"),
    "ingest-parquet-without-text-column": (lambda w: [*INGEST, "--data", f"{w}/tok/notext.parquet"],
                                           "has no column 'text' (columns: body)"),
    "ingest-zst-cut-at-60-percent": (lambda w: [*INGEST, "--data", f"{w}/tok/cut.txt.zst"],
                                     "cut.txt.zst: the zstd archive is truncated (frame 1, from byte 0, is cut"),
    "ingest-zst-second-frame-cut": (lambda w: [*INGEST, "--data", f"{w}/tok/cut-second-frame.jsonl.zst"],
                                    "cut-second-frame.jsonl.zst: the zstd archive is truncated (frame 2, from byte"),
    "ingest-parquet-folder-with-a-binary-shard": (lambda w: [*INGEST, "--data", f"{w}/typed/mixed"],
                                                  "b.parquet: column 'text' is binary, not string; plelab reads "
                                                  "text from a string column (its string columns: title"),
    "ingest-parquet-shards-all-wrong-typed": (lambda w: [*INGEST, "--data", f"{w}/typed/wrong"],
                                              "a.parquet: column 'text' is int64, not string"),
    "ingest-parquet-list-typed-text": (lambda w: [*INGEST, "--data", f"{w}/typed/wrong/b.parquet"],
                                       "b.parquet: column 'text' is list<element: string>, not string"),
    "ingest-weights-do-not-parse": (lambda w: [*INGEST, "--data", f"{w}/other.txt:lots", "--data",
                                               f"{w}/latin1.txt:1"], "give PATH:WEIGHT with a weight > 0"),
    "ingest-unknown-val-shard": (lambda w: [*INGEST, "--data", f"{w}/tok/u32.npy", "--set", "data.val_shard=x.npy"],
                                 "data.val_shard='x.npy' is not one of the shards"),
    "ingest-token-dtype-on-text": (lambda w: [*INGEST, "--data", f"{w}/other.txt", "--set", "data.token_dtype=uint16"],
                                   "data.token_dtype applies to pre-tokenized shards"),
    "train-tokenizer-is-a-folder": (lambda w: [*TRAIN, "--tokenizer", f"{w}/empty-dir", "--out", f"{w}/o/7"],
                                    "pass a HF tokenizer.json"),
    "train-tokenizer-is-a-pickle": (lambda w: [*TRAIN, "--tokenizer", f"{w}/payload.pt", "--out", f"{w}/o/8"],
                                    "pass a HF tokenizer.json"),
    # output folders
    "train-out-is-a-file": (lambda w: [*TRAIN, "--out", f"{w}/a-file"], "is a file, not a folder"),
    "train-out-unwritable": (lambda w: [*TRAIN, "--out", _unwritable(w)], "choose another --out"),
    # config values
    "train-invalid-value": (lambda w: [*TRAIN, "--set", "train.lr=fast", "--out", f"{w}/o/9"],
                            "invalid config value train.lr='fast': allowed float"),
    "train-unknown-key": (lambda w: [*TRAIN, "--set", "train.speed=1", "--out", f"{w}/o/10"],
                          "unknown config key 'train.speed'"),
    "train-non-finite-value": (lambda w: [*TRAIN, "--set", "train.lr=inf", "--out", f"{w}/o/11"],
                               "allowed a finite number"),
    "train-empty-text-field": (lambda w: [*TRAIN, "--text-field", "", "--out", f"{w}/o/12"],
                               "invalid config value data.text_field='': allowed a non-empty field name"),
    "params-invalid-value": (lambda w: ["params", "--set", "model.hidden_size=0"], "model.hidden_size=0"),
    "config-unknown-section": (lambda w: ["config", "--set", "optim.lr=1"], "unknown config key 'optim.lr'"),
    "presets-unexpected-argument": (lambda w: ["presets", "--all"], "unrecognized arguments: --all"),
    # --config files (train, sweep, visual-study; the same loader for params and config)
    "train-config-missing": (_train_config("nowhere.toml", "c1"),
                             "nowhere.toml does not exist; give a .json or .toml file"),
    "train-config-is-a-folder": (_train_config("folder.json", "c2"), "folder.json is a folder"),
    "train-config-not-json-or-toml": (_train_config("config.yaml", "c3"), "config.yaml is neither .json nor .toml"),
    "train-config-bad-json": (_train_config("bad.json", "c4"), "bad.json is not valid JSON: Expecting property name "
                                                               "enclosed in double quotes (at line 2, column 30)"),
    "train-config-bad-toml": (_train_config("bad.toml", "c5"), "bad.toml is not valid TOML: Expected ']' at the end "
                                                               "of a table declaration (at line 2, column 7)"),
    "train-config-not-utf8": (_train_config("latin1.toml", "c6"), "latin1.toml is not UTF-8"),
    "train-config-unknown-key": (_train_config("unknown-key.toml", "c7"),
                                 "unknown-key.toml: unknown config key 'model.bogus'"),
    "train-config-wrong-type": (_train_config("wrong-type.json", "c8"),
                                "wrong-type.json: invalid config value model.hidden_size='64': allowed int"),
    "train-config-invalid-value": (_train_config("heads.toml", "c9"), "model.num_attention_heads=3: allowed a divisor"),
    "train-config-other-preset": (_train_config("small.toml", "c10"), "--preset cpu-tiny disagrees with config file"),
    "resume-config-other-preset": (lambda w: [*RESUME, str(_run_copy(w, "cpreset")), "--config",
                                              f"{w}/configs/small.toml"],
                                   "names preset 'cpu-small', but the run was made from 'cpu-tiny'"),
    "config-config-bad-toml": (lambda w: ["config", "--config", f"{w}/configs/bad.toml"], "is not valid TOML"),
    "sweep-config-unknown-key": (lambda w: ["sweep", "--config", f"{w}/configs/unknown-key.toml", "--out",
                                            f"{w}/o/sc"], "unknown config key 'model.bogus'"),
    "visual-study-config-bad-toml": (lambda w: ["visual-study", "--quick", "--config", f"{w}/configs/bad.toml",
                                                "--out", f"{w}/o/vsc"], "bad.toml is not valid TOML"),
    # --dp and the other number lists: one parser, one spelling
    "params-dp-not-numbers": (lambda w: ["params", "--dp", "0,big"], "invalid --dp '0,big': give integers"),
    "config-dp-list": (lambda w: ["config", "--dp", "0,64"], "invalid --dp '0,64': give one integer"),
    "train-dp-list": (lambda w: [*TRAIN, "--dp", "8,16", "--out", f"{w}/o/d1"], "invalid --dp '8,16': give one"),
    "train-remap-without-a-smaller-table": (
        lambda w: [*TRAIN, "--set", "ple.dim=8", "--set", "ple.vocab_remap=frequency", "--out", f"{w}/o/d9"],
        "set ple.vocab_size below model.vocab_size"),
    "train-dp-negative": (lambda w: [*TRAIN, "--dp", "-8", "--out", f"{w}/o/d2"], "ple.dim=-8: allowed an integer"),
    "diagnose-dp-not-a-number": (lambda w: ["diagnose", f"{w}/foreign.safetensors", "--dp", "x"],
                                 "invalid --dp 'x': give one integer"),
    "advise-dp-list": (lambda w: ["advise", f"{w}/sweep", "--dp", "8,16"], "invalid --dp '8,16': give one integer"),
    "visual-study-dp-list": (lambda w: ["visual-study", "--quick", "--dp", "8,16", "--out", f"{w}/o/vd"],
                             "invalid --dp '8,16': give one integer"),
    "sweep-control-dp-list": (lambda w: ["sweep", *TINY_SWEEP, "--control-dp", "8,16", "--out", f"{w}/o/s2"],
                              "invalid --control-dp '8,16': give one integer"),
    "sweep-seed-list-not-numbers": (lambda w: ["sweep", *TINY_SWEEP, "--seed-list", "0,one", "--out", f"{w}/o/s3"],
                                    "invalid --seed-list '0,one': give integers"),
    "visual-study-lambdas-not-numbers": (lambda w: ["visual-study", "--quick", "--lambdas", "0.5,big", "--out",
                                                    f"{w}/o/vl"], "invalid --lambdas '0.5,big': give numbers"),
    "visual-study-gate-without-oracle": (lambda w: ["visual-study", "--quick", "--gate", "--set", "visual.k=16",
                                                    "--out", f"{w}/o/vg"], "--gate needs the oracle"),
    "params-old-spelling-dims": (lambda w: ["params", "--dims", "0,64"], "--dims is spelled --dp"),
    "sweep-old-spelling-dim": (lambda w: ["sweep", "--dim=0,8", "--out", f"{w}/o/s4"], "--dim is spelled --dp"),
    # checkpoints and weights
    "resume-other-model-size": (lambda w: [*RESUME, str(_run_copy(w, "size")), "--set", "model.hidden_size=128"],
                                "trained with a different model"),
    "resume-truncated-checkpoint": (
        lambda w: [*RESUME, str(_run_copy(w, "trunc", lambda c: _truncate(c / "model.safetensors")))],
        "is damaged or truncated"),
    "resume-foreign-safetensors": (
        lambda w: [*RESUME, str(_run_copy(w, "foreign", lambda c: shutil.copy(w / "foreign.safetensors",
                                                                             c / "model.safetensors")))],
        "does not fit this model (missing model.embed_tokens.weight)"),
    "resume-pickle-as-weights": (
        lambda w: [*RESUME, str(_run_copy(w, "pickle", lambda c: shutil.copy(w / "payload.pt",
                                                                            c / "model.safetensors")))],
        "is damaged or truncated"),
    "resume-config-with-expression": (
        lambda w: [*RESUME, str(_run_copy(w, "expr", lambda c: _edit_json(c.parent.parent / "config.json", lambda d: d[
            "train"].update(lr=f"__import__('os').system('touch {w}/PWNED')"))))],
        "config.json: invalid config value train.lr="),
    "resume-config-unknown-key": (
        lambda w: [*RESUME, str(_run_copy(w, "key", lambda c: _edit_json(
            c.parent.parent / "config.json", lambda d: d["model"].update(bogus=1))))],
        "config.json: unknown config key 'model.bogus'"),
    "resume-moment-relabelled-int32": (
        lambda w: [*RESUME, str(_run_copy(w, "mrelabel", lambda c: relabel(c / "optimizer.safetensors",
                                                                          f"{EMBED}.exp_avg_sq")))],
        f"{EMBED}.exp_avg_sq is stored as int32, the model expects float32"),
    "resume-checkpoints-is-a-file": (
        lambda w: [*RESUME, str(_run_copy(w, "ckfile", lambda c: (shutil.rmtree(c.parent),
                                                                 c.parent.write_text("x"))))],
        "checkpoints is a file"),
    "diagnose-truncated-safetensors": (lambda w: ["diagnose", f"{w}/truncated.safetensors", "--no-progress"],
                                       "is not a readable safetensors file"),
    "diagnose-hf-table-with-null": (
        lambda w: ["diagnose", f"{w}/hf-table.safetensors", "--num-layers", "2", "--dp", "4", "--null",
                   f"{w}/hf-table.safetensors", "--no-progress"], "--null compares with a matched null run's Δ"),
    "diagnose-hf-table-init-without-reference": (
        lambda w: ["diagnose", f"{w}/hf-table.safetensors", "--num-layers", "2", "--dp", "4", "--init",
                   f"{w}/hf-table.safetensors", "--no-progress"], "add --reference OTHER"),
    "diagnose-foreign-safetensors": (lambda w: ["diagnose", f"{w}/foreign.safetensors", "--no-progress"],
                                     "no tensor named '*embed_tokens_per_layer.weight'"),
    "diagnose-checkpoint-with-foreign-weights": (
        lambda w: ["diagnose", str(_run_copy(w, "dforeign", lambda c: shutil.copy(w / "foreign.safetensors",
                                                                                 c / "model.safetensors"))),
                   "--no-progress"], "no tensor named '*embed_tokens_per_layer.weight'"),
    "diagnose-pickle-as-weights": (lambda w: ["diagnose", f"{w}/payload.pt", "--no-progress"],
                                   "is not a readable safetensors file"),
    "diagnose-missing-path": (lambda w: ["diagnose", f"{w}/nowhere", "--no-progress"], "does not exist"),
    "diagnose-run-with-other-dp": (lambda w: ["diagnose", f"{w}/run", "--dp", "999", "--no-use", "--no-progress"],
                                   "--dp disagree with the run's own config"),
    "diagnose-folder-without-weights": (lambda w: ["diagnose", f"{w}/empty-dir", "--no-progress"],
                                        "holds no .safetensors file"),
    "diagnose-out-unwritable": (lambda w: ["diagnose", f"{w}/run", "--no-use", "--no-progress", "--out",
                                           _unwritable(w)], "give a writable folder for diagnostics.json"),
    # sweeps deleted or damaged halfway, names that try to leave the sweep folder
    "report-runs-deleted": (lambda w: ["report", _sweep_copy(w, "noruns", lambda r: (shutil.rmtree(r / "runs"),
                                                                                     shutil.rmtree(r / "records")))],
                            "the baseline dp0 has no finished run yet"),
    "advise-arm-deleted": (lambda w: ["advise", _sweep_copy(w, "noarm", lambda r: (shutil.rmtree(r / "runs/dp8"),
                                                                                   shutil.rmtree(r / "records/dp8")))],
                           "has no finished dP > 0 arm yet"),
    "report-metrics-deleted": (
        lambda w: ["report", _sweep_copy(w, "nometrics", lambda r: (r / "runs/dp8/seed-1/metrics.jsonl").unlink())],
        "its metrics are missing"),
    "sweep-resume-spec-deleted": (
        lambda w: ["sweep", *TINY_SWEEP, "--out", _sweep_copy(w, "nospec", lambda r: (r / "sweep.json").unlink())],
        "has runs/ but no sweep.json"),
    "sweep-resume-run-config-truncated": (
        lambda w: ["sweep", *TINY_SWEEP, "--out", _sweep_copy(w, "trconf", lambda r: _truncate(
            r / "runs/dp8/seed-0/config.json"))], "config.json is unreadable"),
    "report-folder-is-a-file": (
        lambda w: ["report", _sweep_copy(w, "repfile", lambda r: (shutil.rmtree(r / "report", ignore_errors=True),
                                                                  (r / "report").write_text("x")))],
        "report folder"),
    "sweep-out-unwritable": (lambda w: ["sweep", *TINY_SWEEP, "--out", _unwritable(w)], "choose another --out"),
    "sweep-variant-name-escapes": (lambda w: ["sweep", *TINY_SWEEP, "--variant", "../x:ple.gate=scalar",
                                              "--out", f"{w}/o/s1"], "invalid --variant '../x:"),
    "sweep-arm-name-escapes": (
        lambda w: ["sweep", *TINY_SWEEP, "--out", _sweep_copy(w, "evilarm", lambda r: _set_arm_name(r, "../../x"))],
        "invalid arm name '../../x'"),
    "report-arm-name-absolute": (
        lambda w: ["report", _sweep_copy(w, "absarm", lambda r: _set_arm_name(r, f"{w}/escaped"))],
        "invalid arm name"),
    "advise-seed-escapes": (
        lambda w: ["advise", _sweep_copy(w, "evilseed", lambda r: _edit_json(
            r / "sweep.json", lambda d: d.update(seeds=["../../x"])))], "invalid seeds"),
    "advise-not-a-sweep": (lambda w: ["advise", f"{w}/a-file"], "is not a plelab sweep"),
    # eval (the table memory-mapped from the checkpoint)
    "eval-missing-run": (lambda w: ["eval", f"{w}/nowhere"], "does not exist"),
    "consolidate-single-file-checkpoint": (lambda w: ["consolidate", f"{w}/run"], "is not a sharded checkpoint"),
    "consolidate-not-a-folder": (lambda w: ["consolidate", f"{w}/nowhere"], "is not a folder"),
    "consolidate-folder-without-checkpoint": (lambda w: ["consolidate", f"{w}/empty-dir"],
                                              "holds no plelab checkpoint"),
    "eval-folder-without-checkpoint": (lambda w: ["eval", f"{w}/empty-dir"], "holds no plelab checkpoint"),
    "eval-truncated-weights": (
        lambda w: ["eval", str(_run_copy(w, "etrunc", lambda c: _truncate(c / "model.safetensors")))],
        "model.safetensors is not a readable safetensors file"),
    "eval-pickle-as-weights": (
        lambda w: ["eval", str(_run_copy(w, "epickle", lambda c: shutil.copy(w / "payload.pt",
                                                                            c / "model.safetensors")))],
        "is not a readable safetensors file"),
    "eval-foreign-weights": (
        lambda w: ["eval", str(_run_copy(w, "eforeign", lambda c: shutil.copy(w / "foreign.safetensors",
                                                                             c / "model.safetensors")))],
        "does not fit this model (missing model.embed_tokens.weight)"),
    "eval-weight-relabelled-int32": (
        lambda w: ["eval", str(_run_copy(w, "erelabel", lambda c: relabel(c / "model.safetensors", EMBED)))],
        f"{EMBED} is stored as int32, the model expects float32"),
    "eval-other-corpus": (
        lambda w: ["eval", str(_run_copy(w, "ecorpus", lambda c: _edit_json(
            c / "state.json", lambda d: d["config"]["data"].update(path=f"{w}/other.txt"))))],
        "was trained on another corpus"),
    "eval-bad-windows": (lambda w: ["eval", f"{w}/run", "--windows", "0"], "--windows and --batch"),
    # checkpoints plelab did not train
    "diagnose-attached-ple-weight-relabelled": (
        lambda w: ["diagnose", str(_relabelled_hf(w, "ple", "model.per_layer_model_projection.weight")), "--data",
                   f"{w}/words.txt", "--tokenizer", f"{w}/tok-fits.json", "--no-progress"],
        "model.per_layer_model_projection.weight is stored as int32, the model expects float32"),
    "diagnose-attached-host-weight-relabelled": (
        lambda w: ["diagnose", str(_relabelled_hf(w, "host", EMBED)), "--data", f"{w}/words.txt", "--tokenizer",
                   f"{w}/tok-fits.json", "--no-progress"], f"{EMBED} is stored as int32, the model expects float32"),
    "diagnose-reference-with-other-rows": (lambda w: ["diagnose", f"{w}/hf-a", "--reference", f"{w}/hf-half-rows",
                                                      "--no-progress"], "rows must be the same token ids"),
    "diagnose-init-of-another-shape": (lambda w: ["diagnose", f"{w}/hf-a", "--reference", f"{w}/hf-b", "--init",
                                                  f"{w}/hf-a", "--reference-init", f"{w}/hf-dp4", "--no-progress"],
                                       "has a table of shape"),
    "diagnose-tokenizer-does-not-fit": (lambda w: ["diagnose", f"{w}/hf-a", "--data", f"{w}/words.txt",
                                                   "--tokenizer", f"{w}/tok-too-big.json", "--no-progress"],
                                        "does not fit the model"),
    "diagnose-data-without-tokenizer": (lambda w: ["diagnose", f"{w}/hf-a", "--data", f"{w}/words.txt",
                                                   "--no-progress"], "holds no tokenizer.json"),
    "diagnose-data-on-a-plelab-run": (lambda w: ["diagnose", f"{w}/run", "--data", f"{w}/words.txt", "--tokenizer",
                                                 f"{w}/tok-fits.json", "--no-progress"], "drop --data/--tokenizer"),
    "diagnose-data-for-a-bare-table": (lambda w: ["diagnose", f"{w}/hf-table.safetensors", "--num-layers", "2", "--dp",
                                                  "4", "--data", f"{w}/words.txt", "--tokenizer",
                                                  f"{w}/tok-fits.json", "--no-progress"], "no readable config.json"),
    "plan-not-a-sweep": (lambda w: ["plan", f"{w}/empty-dir"], "not a plelab sweep"),
    "plan-negative-delta": (lambda w: ["plan", f"{w}/sweep", "--delta", "-0.1"], "--delta must be > 0"),
    "plan-zero-eval-windows": (lambda w: ["plan", f"{w}/sweep", "--eval-windows", "0"], "--eval-windows must be >= 1"),
    # export and generate
    "generate-run-without-tokenizer": (
        lambda w: ["generate", str(_run_copy(w, "gnotok", lambda c: (c.parent.parent / "tokenizer.json").unlink())),
                   "--prompt", "hello"], "has no tokenizer.json"),
    "generate-negative-top-k": (lambda w: ["generate", f"{w}/run", "--prompt", "hi", "--top-k", "-3"],
                                "top_k must be >= 1"),
    "generate-not-a-run": (lambda w: ["generate", f"{w}/empty-dir", "--prompt", "hi"], "holds no plelab checkpoint"),
    "export-onto-an-existing-folder": (lambda w: ["export", f"{w}/run", f"{w}/empty-dir"], "exists; export writes"),
    "export-weight-relabelled-int32": (
        lambda w: ["export", str(_run_copy(w, "xrelabel", lambda c: relabel(c / "model.safetensors", EMBED))),
                   f"{w}/o/xr"], f"{EMBED} is stored as int32, the model expects float32"),
    "export-run-with-foreign-weights": (
        lambda w: ["export", str(_run_copy(w, "xforeign", lambda c: shutil.copy(w / "foreign.safetensors",
                                                                                c / "model.safetensors"))),
                   f"{w}/o/x"], "does not fit this model (missing"),
    # demo
    "demo-missing-data": (lambda w: ["demo", "--quick", "--no-progress", "--data", f"{w}/nowhere",
                                     "--out", f"{w}/o/demo"], "does not exist"),
    # image-caption data
    "visual-ids-missing-image": (lambda w: [*VIDS, f"{w}/vis/missing.jsonl"], "nope.png does not exist"),
    "visual-ids-truncated-png": (lambda w: [*VIDS, f"{w}/vis/truncated.jsonl"], "is not a readable image"),
    "visual-ids-not-an-image": (lambda w: [*VIDS, f"{w}/vis/text.jsonl"], "is not a readable image"),
    "visual-ids-image-is-a-folder": (lambda w: [*VIDS, f"{w}/vis/folder.jsonl"], "is a folder, not an image file"),
    "visual-ids-pickled-siglip": (lambda w: ["visual-ids", "--k", "4", "--scenes", "10", "--siglip",
                                             f"{w}/siglip-pickle"],
                                  "holds no model.safetensors weights (found pytorch_model.bin"),
    "visual-ids-out-is-a-file": (lambda w: ["visual-ids", "--k", "4", "--scenes", "10", "--out", f"{w}/a-file"],
                                 "is a file, not a folder"),
    "train-visual-data-truncated-png": (
        lambda w: [*TRAIN, "--set", "visual.enabled=true", "--set", f"visual.data={w}/vis/truncated.jsonl",
                   "--out", f"{w}/o/v"], "truncated.png is not a readable image"),
    "visual-study-unknown-method": (lambda w: ["visual-study", "--quick", "--methods", "none,magic",
                                               "--out", f"{w}/o/vs"], "invalid --methods 'none,magic'"),
    "visual-study-out-unwritable": (lambda w: ["visual-study", "--quick", "--no-progress", "--out", _unwritable(w)],
                                    "choose another --out"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_malformed_input(case, work, capsys):
    build, needle = CASES[case]
    refused(build(work), needle, work, capsys)
    assert not (work / "PWNED").exists() and not (work / "escaped").exists() and not (work / "cases" / "x").exists()


# ---- a sweep resumed after deletions, a failed resume ---------------------------------------------------------

def test_sweep_resume_redoes_only_the_deleted_runs(work, capsys):
    root = _copy(work, "sweep", "resume-deleted")
    shutil.rmtree(root / "runs/dp8/seed-1")
    (root / "records/dp8/seed-1.json.gz").unlink()  # deleted with its record: redone
    (root / "runs/dp0/seed-1/summary.json").unlink()  # a run cut short: summary gone, checkpoints kept: resumed
    shutil.rmtree(root / "runs/dp8/seed-0")  # its folder gone, its record kept: still finished, never redone
    kept = {p: h for p, h in _snapshot(root).items() if p.startswith(("runs/dp0/seed-0", "records/dp8/seed-0"))}
    assert main(["sweep", *TINY_SWEEP, "--out", str(root)]) == 0
    assert "2 already done, 2 to run" in capsys.readouterr().out
    after = _snapshot(root)
    assert all(after[p] == h for p, h in kept.items())
    assert "runs/dp8/seed-1/summary.json" in after and "runs/dp0/seed-1/summary.json" in after
    assert not any(p.startswith("runs/dp8/seed-0") for p in after)


def test_failed_resume_leaves_config_json_untouched(work, capsys):
    run = _run_copy(work, "foreign-steps", lambda c: shutil.copy(work / "foreign.safetensors", c / "model.safetensors"))
    before = (run / "config.json").read_bytes()
    assert main([*RESUME, str(run), "--steps", "4"]) == 2
    assert "does not fit this model" in capsys.readouterr().err
    assert (run / "config.json").read_bytes() == before


def test_a_relabelled_checkpoint_is_refused_and_no_checkpoint_is_lost(work, capsys):
    """Issue 54: a weight relabelled I32 in the header of the newest checkpoint once resumed (loss 6.2 -> 6.5e10)
    and rotation then deleted the intact checkpoint before it. Resume (set to rotate at once), eval and export
    refuse it in one line, and every file of the run is as it was."""
    run = work / "cases" / "relabelled-rotation"
    assert main(["train", "--preset", "cpu-tiny", "--steps", "4", "--no-progress", "--set",
                 "train.checkpoint_every=2", "--set", "train.keep_checkpoints=2", "--out", str(run)]) == 0
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-000002", "step-000004"]
    relabel(run / "checkpoints/step-000004/model.safetensors", EMBED)
    before = _snapshot(run)
    capsys.readouterr()
    for argv in ([*RESUME, str(run), "--steps", "8", "--set", "train.keep_checkpoints=1"], ["eval", str(run)],
                 ["export", str(run), str(work / "o" / "relabelled-export")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{EMBED} is stored as int32, the model expects float32" in err, err
        assert "step-000004" in err and "Traceback" not in err
    assert _snapshot(run) == before and not (work / "o" / "relabelled-export").exists()

"""Streaming ingest, token shards, pre-tokenized input and mixtures, for real on small data."""

import gzip
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from plelab.config import resolve_config
from plelab.data import (
    Corpus,
    HashSet64,
    MixtureSampler,
    PackedSampler,
    ShardWriter,
    TokenStream,
    embedded_corpus,
    parse_mixture,
    prepare_data,
    split_for_training,
    train_tokenizer,
)
from plelab.data import archives
from plelab.data.corpus import corpus_fingerprint
from plelab.data.shards import open_split
from plelab.data.sources import chunk_paragraphs, file_documents, resolve_source
from plelab.data.streaming import prepare_tokens
from plelab.data.tokenizer import EOS, hash_sample
from plelab.errors import ConfigError, PlelabError

WORDS = "per layer embeddings give every decoder layer its own small lookup of the token id".split()


def _texts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [f"Record {i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(20, 80)))) + "." for i in range(n)]


def _old_streams(docs, tok, val_fraction):
    """The in-memory path the streaming ingest replaces: split the whole list, encode, join with EOS."""
    train, val, dups, _ = split_for_training(docs, val_fraction)
    eos = tok.token_to_id(EOS)
    enc = [[i for e in tok.encode_batch(d) for i in (*e.ids, eos)] for d in (train, val)]
    return np.asarray(enc[0]), np.asarray(enc[1]), dups, len(train), len(val)


def test_streaming_ingest_equals_the_in_memory_split_and_encoding(tmp_path):
    docs = _texts(300) + _texts(20)  # 20 exact duplicates
    corpus = Corpus("c", docs)
    tok = train_tokenizer(corpus, 400, show_progress=False)
    data = prepare_tokens(corpus, tok, 0.1)
    train, val, dups, n_train, n_val = _old_streams(docs, tok, 0.1)
    assert data.corpus_fingerprint == corpus.fingerprint
    assert np.array_equal(np.asarray(data.train), train) and np.array_equal(np.asarray(data.val), val)
    assert (data.n_duplicates, data.n_train_docs, data.n_val_docs) == (dups, n_train, n_val) and dups == 20
    assert data.train.dtype == np.uint16
    again = prepare_tokens(corpus, tok, 0.1)  # the cache: the same folder, memory-mapped
    assert again.location == data.location and np.array_equal(np.asarray(again.train), train)


def test_embedded_corpus_keeps_its_fingerprint():
    data = prepare_data(resolve_config("cpu-tiny"), progress=False)
    corpus = embedded_corpus()
    assert data.corpus_fingerprint == corpus.fingerprint
    assert data.n_train_docs + data.n_val_docs + data.n_duplicates == len(corpus.documents)


def test_text_read_in_blocks_equals_the_whole_file(tmp_path, monkeypatch):
    body = "\r\n\r\n".join(_texts(40)) + "\n\n\n" + "one line without breaks " * 3000 + "\r\n\r\nend"
    (tmp_path / "a.txt").write_bytes(body.encode("utf-8"))
    whole = list(chunk_paragraphs(body.replace("\r\n", "\n")))
    monkeypatch.setattr(archives, "BLOCK_BYTES", 7)  # blocks cut inside "\r\n" and inside paragraphs
    assert list(file_documents(tmp_path / "a.txt")) == whole and len(whole) > 10


def test_compressed_jsonl_parquet_row_groups_and_hf_folder_stream(tmp_path):
    texts = _texts(60)
    lines = "".join(json.dumps({"body": t}) + "\n" for t in texts).encode()
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(lines))
    zstd = pytest.importorskip("zstandard")
    (tmp_path / "d.jsonl.zst").write_bytes(zstd.ZstdCompressor().compress(lines))
    half = len(lines) // 2  # two frames with a skippable frame between them, read to the end of the last
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"plelb"
    (tmp_path / "f.jsonl.zst").write_bytes(zstd.ZstdCompressor(write_checksum=True).compress(lines[:half])
                                           + skippable + zstd.ZstdCompressor().compress(lines[half:]))
    assert archives.check_zstd_frames(tmp_path / "f.jsonl.zst") == 3
    for name in ("d.jsonl.gz", "d.jsonl.zst", "f.jsonl.zst"):
        assert list(file_documents(tmp_path / name, "body")) == texts
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress("\n\n".join(texts).encode()))
    assert list(file_documents(tmp_path / "d.txt.gz")) == list(chunk_paragraphs("\n\n".join(texts)))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": texts}), tmp_path / "d.parquet", row_group_size=7)
    assert pq.ParquetFile(tmp_path / "d.parquet").num_row_groups == 9
    assert list(file_documents(tmp_path / "d.parquet", "body")) == texts
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "hf"))
    cfg = resolve_config("cpu-tiny", [f"data.path={tmp_path / 'hf'}", "model.vocab_size=400"])
    data = prepare_data(cfg, progress=False)
    assert data.corpus_fingerprint == Corpus("x", texts).fingerprint


def test_hash_set_matches_a_python_set():
    rng = np.random.default_rng(0)
    hs, seen = HashSet64(), set()
    for _ in range(40):
        keys = rng.integers(0, 500, size=int(rng.integers(1, 60))).astype(np.uint64)
        new = hs.add_new(keys)
        expect = []
        for k in keys.tolist():
            expect.append(k not in seen)
            seen.add(k)
        assert new.tolist() == expect
    assert len(hs) == len(seen) and len(hs.levels) <= 10


def test_shards_across_boundaries_read_as_one_stream(tmp_path):
    w = ShardWriter(tmp_path, "train", np.uint16, shard_tokens=10)
    ids = np.arange(57, dtype=np.uint16)
    w.write_documents(ids[:20], np.array([0, 5]))
    w.write_documents(ids[20:], np.array([0]))
    entry = w.close()
    assert [s["tokens"] for s in entry["shards"]] == [10, 10, 10, 10, 10, 7] and entry["documents"] == 3
    stream = open_split(tmp_path, entry, "uint16")
    assert len(stream) == 57 and np.array_equal(stream[8:33], ids[8:33]) and np.array_equal(stream[50:99], ids[50:])
    assert np.fromfile(tmp_path / "train.docs.bin", dtype=np.uint64).tolist() == [0, 5, 20]
    assert np.array_equal(stream.bincount(60), np.bincount(ids, minlength=60))
    s = PackedSampler(stream, 8, seed=3)
    t = PackedSampler(ids, 8, seed=3)
    for step in range(5):
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(s.batch(step, 4), t.batch(step, 4)))


def test_pre_tokenized_bin_npy_folder_and_validation_splits(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 300, size=40_000).astype(np.uint16)
    ids.tofile(tmp_path / "all.bin")
    cfg = resolve_config("cpu-tiny", [f"data.path={tmp_path / 'all.bin'}", "data.token_dtype=uint16",
                                      "model.vocab_size=300"])
    data = prepare_data(cfg, progress=False)
    assert data.unit == "blocks" and data.tokenizer_json is None and len(data.train) + len(data.val) == 40_000
    assert 0 < len(data.val) < 0.2 * 40_000
    joined = np.sort(np.concatenate([np.asarray(data.train), np.asarray(data.val)]))
    assert np.array_equal(joined, np.sort(ids))
    assert np.array_equal(np.asarray(prepare_data(cfg, progress=False).val), np.asarray(data.val))  # deterministic
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        np.save(shards / f"s{i}.npy", ids[i * 10_000:(i + 1) * 10_000].astype(np.uint32))
    cfg = resolve_config("cpu-tiny", [f"data.path={shards}", "data.val_shard=s2.npy", "model.vocab_size=300"])
    data = prepare_data(cfg, progress=False)
    assert data.unit == "shards" and np.array_equal(np.asarray(data.val), ids[20_000:30_000])
    assert np.array_equal(np.asarray(data.train), ids[:20_000])
    with pytest.raises(PlelabError, match=r"holds id 29\d, beyond model.vocab_size=256; .*--vocab-size to at least"):
        prepare_data(resolve_config("cpu-tiny", [f"data.path={shards}", "model.vocab_size=256"]), progress=False)


def _tokenized_shard(corpus, folder):
    """A BPE trained on ``corpus`` (saved as tok.json) and the corpus's ids as a raw uint16 shard t.bin."""
    tok = train_tokenizer(corpus, 400, show_progress=False)
    tok.save(str(folder / "tok.json"))
    np.asarray([i for e in tok.encode_batch(corpus.documents) for i in e.ids], dtype=np.uint16).tofile(folder / "t.bin")
    return tok


def test_pre_tokenized_with_its_tokenizer(tmp_path):
    corpus = Corpus("c", _texts(200))
    tok = _tokenized_shard(corpus, tmp_path)
    cfg = resolve_config("cpu-tiny", [f"data.path={tmp_path / 't.bin'}", "data.token_dtype=uint16",
                                      f"data.tokenizer={tmp_path / 'tok.json'}", "model.vocab_size=512"])
    data = prepare_data(cfg, progress=False)
    assert data.tokenizer_json == tok.to_str()


def test_mixture_is_weighted_deterministic_and_addressed_by_step(tmp_path):
    assert parse_mixture(["a/:7", "b/:3"]) == [("a/", 0.7), ("b/", 0.3)]
    for bad in (["a/:x", "b/:1"], ["a/", "b/:1"], ["a/:1"], ["a/:1", "a/:2"], ["a/:-1", "b/:1"]):
        with pytest.raises(ConfigError):
            parse_mixture(bad)
    a, b = np.arange(0, 5_000) % 200, 200 + np.arange(0, 3_000) % 100
    m = MixtureSampler([a, b], [0.7, 0.3], seq_len=16, seed=5)
    assert m.weights == [0.7, 0.3]
    src, _ = m.slots(0, 1000)
    assert (src == 0).sum() == 700
    x0, y0 = m.batch(12, 10)
    fresh = MixtureSampler([a, b], [0.7, 0.3], seq_len=16, seed=5)
    x1, y1 = fresh.batch(12, 10)
    assert np.array_equal(x0.numpy(), x1.numpy()) and np.array_equal(y0.numpy(), y1.numpy())
    halves = [fresh.batch(12, 10, slice(0, 5))[0], fresh.batch(12, 10, slice(5, 10))[0]]
    assert np.array_equal(np.concatenate(halves), x0.numpy())  # rank slices partition the global batch
    from_a = (x0[:, 0] < 200).float().mean()
    assert 0.5 <= float(from_a) <= 0.9
    first = [tuple(m.batch(s, 4)[0][:, 0].tolist()) for s in range(30)]
    assert len(set(first)) > 20  # sources' own epoch orders, not one fixed pattern of sequences


def test_mixture_trains_from_the_cli_config(tmp_path):
    (tmp_path / "a.txt").write_text("\n\n".join(_texts(150, seed=1)))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(150, seed=2)))
    cfg = resolve_config("cpu-tiny", [f"data.mix={tmp_path / 'a.txt'}:0.6,{tmp_path / 'b.jsonl'}:0.4",
                                      "model.vocab_size=400"])
    data = prepare_data(cfg, progress=False)
    assert [round(w, 3) for _, _, w in data.mixture] == [0.6, 0.4] and data.val_mixture
    assert data.corpus_name == "a.txt+b.jsonl"
    other = prepare_data(resolve_config("cpu-tiny", [f"data.mix={tmp_path / 'a.txt'}:0.5,{tmp_path / 'b.jsonl'}:0.5",
                                                     "model.vocab_size=400"]), progress=False)
    assert other.corpus_fingerprint != data.corpus_fingerprint  # the weights are part of the fingerprint


def test_warm_cache_reads_no_text_and_verify_rehashes(tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(200)))
    cfg = resolve_config("cpu-tiny", [f"data.path={path}", "model.vocab_size=400"])
    first = prepare_data(cfg, progress=False)
    st = path.stat()
    text = path.read_text()
    path.write_text(text.replace("Record 1:", "Recxrd 1:"))  # same size; mtime put back below
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    def no_reading(*args, **kwargs):
        raise AssertionError("the text was read")

    with monkeypatch.context() as m:
        m.setattr("plelab.data.streaming.iter_documents", no_reading)
        m.setattr("plelab.data.pipeline.iter_documents", no_reading)
        warm = prepare_data(cfg, progress=False)
    assert warm.corpus_fingerprint == first.corpus_fingerprint
    checked = prepare_data(cfg, progress=False, verify=True)
    assert checked.corpus_fingerprint != first.corpus_fingerprint
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert checked.corpus_fingerprint == Corpus("x", texts).fingerprint


def test_tokenizer_sample_is_bounded_drawn_from_everywhere_and_the_whole_of_a_small_corpus():
    docs = _texts(500)
    assert hash_sample(iter(docs), 10**9) == docs  # the whole corpus, in order
    assert corpus_fingerprint(docs) == Corpus("x", docs).fingerprint
    part = hash_sample(iter(docs), 5_000)
    assert 0 < sum(len(d) for d in part) <= 5_000 and part == hash_sample(iter(docs), 5_000)  # bounded, deterministic
    positions = [docs.index(d) for d in part]
    assert positions == sorted(positions) and positions[-1] > 250 and positions[0] < 250  # from the whole corpus
    assert set(hash_sample(iter(docs), 2_500)) <= set(part)  # a smaller sample is part of a larger one


@pytest.mark.slow
def test_an_interrupted_ingest_restarts_cleanly(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("\n\n".join(_texts(9_000)))  # > 1 batch of text (BATCH_CHARS): killed after the first
    env = {**os.environ, "PLELAB_CACHE": str(tmp_path / "cache"), "PLELAB_FAULT": "ingest_batch:1"}
    cmd = [sys.executable, "-m", "plelab", "ingest", "--data", str(path), "--vocab-size", "400", "--no-progress",
           "--json"]
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    ingest_dir = tmp_path / "cache" / "ingest"
    assert [p.name for p in ingest_dir.iterdir() if not p.name.startswith(".")] == []  # nothing half-written
    env.pop("PLELAB_FAULT")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in ingest_dir.iterdir() if p.name.startswith(".")] == []  # the leftover removed
    summary = json.loads(done.stdout)
    corpus = Corpus("x", list(chunk_paragraphs(path.read_text())))
    assert summary["fingerprint"] == corpus.fingerprint and summary["train_tokens"] > 0
    check = subprocess.run([*cmd, "--check"], env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0
    missing = subprocess.run([*cmd[:-2], "--set", "data.val_fraction=0.1", "--check"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode == 1 and "not ingested yet" in missing.stderr


def test_stream_rejects_what_it_cannot_read():
    with pytest.raises(TypeError):
        TokenStream([np.arange(4)])[1]


@pytest.mark.slow
def test_two_processes_ingesting_one_corpus_build_it_once(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(3_000)))
    env = {**os.environ, "PLELAB_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "plelab", "ingest", "--data", str(path), "--vocab-size", "400", "--no-progress",
           "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    a, b = (json.loads(o) for o, _ in outs)
    assert a["fingerprint"] == b["fingerprint"] and a["location"] == b["location"]
    assert len(list((tmp_path / "cache" / "ingest").iterdir())) == 1
    assert len(list((tmp_path / "cache" / "tokenizers" / "by-source").glob("*.json"))) == 1


def test_review_cases_mixtures_of_text_and_shards_checks_and_messages(tmp_path):
    _tokenized_shard(Corpus("c", _texts(300)), tmp_path)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(300, seed=3)))
    cfg = resolve_config("cpu-tiny", [f"data.mix={tmp_path / 'a.jsonl'}:0.9,{tmp_path / 't.bin'}:0.1",
                                      "data.token_dtype=uint16", f"data.tokenizer={tmp_path / 'tok.json'}",
                                      "model.vocab_size=512"])
    data = prepare_data(cfg, progress=False)  # data.token_dtype applies to the shard, not to the text
    assert [round(w, 3) for _, _, w in data.mixture] == [0.9, 0.1]
    # validation weighs the sources as training does, even when one has few windows
    from plelab.data import TokenData, data_val_windows

    a, b = np.arange(5_000) % 100, 200 + np.arange(70) % 50  # b: 2 windows of 33 tokens
    mixed = TokenData(a, a, "x", "x", 1, 1, 0, val_mixture=[("a", a, 0.9), ("b", b, 0.1)])
    win = data_val_windows(mixed, 32, 64)
    from_b = (win[:, 0] >= 200).numpy()
    assert (len(win), int(from_b.sum())) == (20, 2) and from_b[:10].any()  # 18 : 2, interleaved
    # --check --verify on a changed file reports, removes nothing
    path = tmp_path / "a.jsonl"
    one = resolve_config("cpu-tiny", [f"data.path={path}", "model.vocab_size=400"])
    prepare_data(one, progress=False)
    st = path.stat()
    path.write_text(path.read_text().replace("Record 1:", "Recxrd 1:"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    from plelab.data.streaming import NotReady

    with pytest.raises(NotReady, match="changed without changing size or mtime"):
        prepare_data(one, progress=False, verify=True, build=False)
    assert prepare_data(one, progress=False).corpus_fingerprint  # the old entry is still there
    # messages: a bad UTF-8 byte on line 3 is reported on line 3; a .json file is refused
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "a"}\n{"text": null}\n{"text": "caf\xe9"}\n')
    with pytest.raises(PlelabError, match="line 3 is not UTF-8"):
        list(file_documents(bad))
    (tmp_path / "d.json").write_text('[{"text": "hello"}]')
    with pytest.raises(PlelabError, match="is not a format plelab reads"):
        resolve_source(tmp_path / "d.json")

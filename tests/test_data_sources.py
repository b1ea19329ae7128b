"""Users' data: every supported format for real, and a one-line error for every bad input."""

import json
import re

import pytest

from plelab.config import resolve_config
from plelab.data import load_corpus, user_corpus
from plelab.data.pipeline import prepare_token_data
from plelab.errors import PlelabError

TEXTS = [f"Record {i}: per-layer embeddings give every layer its own lookup of token {i % 13}." for i in range(50)]


def test_text_file_and_folder(tmp_path):
    (tmp_path / "a.txt").write_text("\n\n".join(TEXTS[:25]))
    (tmp_path / "b.md").write_text("\n\n".join(TEXTS[25:]))
    (tmp_path / "ignored.dat").write_bytes(b"\x00\x01")
    folder = user_corpus(tmp_path)
    single = user_corpus(tmp_path / "a.txt")
    assert "".join(folder.documents).count("Record") == 50
    assert "".join(single.documents).count("Record") == 25


def test_jsonl_with_text_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(TEXTS)) + "\n\n")
    assert user_corpus(path, text_field="body").documents == TEXTS
    with pytest.raises(PlelabError, match=r"line 1 has no field 'text' \(its fields: 'body', 'id'\); choose the text "
                                          "field with --text-field"):
        user_corpus(path)


def test_parquet_and_hf_datasets_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": TEXTS}), tmp_path / "d.parquet")
    assert user_corpus(tmp_path / "d.parquet", text_field="content").documents == TEXTS
    with pytest.raises(PlelabError, match="has no column 'text'"):
        user_corpus(tmp_path / "d.parquet")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "hf"))
    assert user_corpus(tmp_path / "hf").documents == TEXTS
    with pytest.raises(PlelabError, match=r"no column 'body' \(columns: text\)"):
        user_corpus(tmp_path / "hf", text_field="body")


@pytest.mark.parametrize("name, content, needle", [
    ("empty.txt", b"", "holds no text"),
    ("blank.txt", b"\n\n   \n", "holds no text"),
    ("binary.txt", b"abc\x00\x01\x02def", "looks binary"),
    ("latin1.txt", "café".encode("latin-1"), "is not UTF-8 (invalid byte at offset 3)"),
    ("bad.jsonl", b'{"text": "ok"}\n{"text": broken}\n', "line 2 is not valid JSON"),
    ("typed.jsonl", b'{"text": 5}\n', "field 'text' is int, not text"),
    ("bad.parquet", b"PAR1 not really parquet", "cannot read Parquet file"),
])
def test_bad_inputs_name_the_file_and_the_problem(tmp_path, name, content, needle):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PlelabError) as info:
        user_corpus(path)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg
    if "holds no text" not in msg:
        assert name in msg


def test_missing_unreadable_and_empty_folder(tmp_path, monkeypatch):
    with pytest.raises(PlelabError, match="does not exist"):
        load_corpus(str(tmp_path / "nope.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlelabError, match="has no .txt/.md/.text/.jsonl/.parquet files"):
        user_corpus(tmp_path / "empty")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")

    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith("locked.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(PlelabError, match="cannot read .*locked.txt: Permission denied"):
        user_corpus(locked)


def test_supplied_tokenizer_json_is_used_and_checked(tmp_path, tiny_data):
    from plelab.data import get_tokenizer, train_tokenizer

    corpus = user_corpus_from(tmp_path)
    tok = train_tokenizer(corpus, 300, show_progress=False)
    tok.save(str(tmp_path / "tok.json"))
    cfg = resolve_config("cpu-tiny", [f"data.path={tmp_path / 'c.txt'}", f"data.tokenizer={tmp_path / 'tok.json'}"])
    data = prepare_token_data(cfg, progress=False)
    assert int(max(data.train.max(), data.val.max())) < 300
    with pytest.raises(PlelabError, match="has 300 entries but model.vocab_size=256"):
        get_tokenizer(corpus, 256, str(tmp_path / "tok.json"))
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(PlelabError, match="cannot load tokenizer"):
        get_tokenizer(corpus, 512, str(tmp_path / "junk.json"))


def user_corpus_from(tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(TEXTS * 20))
    return user_corpus(tmp_path / "c.txt")


def _long_documents(n: int = 3) -> list[str]:
    import random

    rnd = random.Random(0)
    words = "per layer embeddings give every layer its own lookup of the token table and gate".split()
    return [" ".join(rnd.choice(words) for _ in range(5000)) + "\n" for _ in range(n)]


def test_a_corpus_of_few_long_documents_is_split_by_pieces_and_trains(tmp_path, capsys):
    """Only where the document split fails (3 documents of 27K characters at val_fraction 0.05) are the documents
    cut into pieces and split by the same hash; a corpus that splits by documents splits exactly as before."""
    from plelab.cli import main
    from plelab.data import pieces, split_documents, split_for_training

    docs = _long_documents()
    with pytest.raises(PlelabError, match="cannot split 3 distinct documents"):
        split_documents(docs, 0.05)
    train, val, dups, n = split_for_training(docs, 0.05)
    assert n == len(train) + len(val) == 42 and val and dups == 0
    assert all("".join(pieces(d)) == d and max(map(len, pieces(d))) <= 2000 for d in docs)  # nothing lost
    assert all(p.endswith((" ", "\n")) for d in docs for p in pieces(d))  # cut at spaces, never inside a word
    assert split_for_training(TEXTS * 2, 0.1) == (*split_documents(TEXTS * 2, 0.1), 0)  # splits as before
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--set", f"data.path={path}",
                 "--set", "data.val_fraction=0.05", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert "split as 42 pieces of ≤ 2,000 characters" in capsys.readouterr().out
    with pytest.raises(PlelabError, match="even cut into 1 pieces"):
        split_for_training(["one short document"], 0.05)


def _fake_package(root, name, version, body):
    pkg = root / name
    (pkg / "tests").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f'"""{name}: the top of the package."""\nraise RuntimeError("imported")\n')
    (pkg / "core.py").write_text(f'def f():\n    """{body}"""\n')
    (pkg / "tests" / "test_core.py").write_text('"""a test module: never in the corpus."""\n')
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_packages_corpus_reads_installed_docstrings_without_importing(tmp_path, monkeypatch):
    import plelab.data.corpus as corpus_mod
    from plelab.data import embedded_corpus
    from plelab.data.corpus import corpus_fingerprint, embedded_key

    _fake_package(tmp_path, "plelabfake_a", "1.0", "Alpha docstring.")
    _fake_package(tmp_path, "plelabfake_b", "3.1", "Beta docstring.")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(corpus_mod, "PACKAGE_CORPUS", ("plelabfake_a", "plelabfake_b"))
    stdlib, packages = embedded_corpus(), embedded_corpus("packages")
    assert packages.documents[:len(stdlib.documents)] == stdlib.documents
    assert packages.documents[len(stdlib.documents):] == [
        "plelabfake_a: the top of the package.", "Alpha docstring.", "plelabfake_b: the top of the package.",
        "Beta docstring."]  # package order, sorted files, tests skipped, __init__ never executed
    assert packages.name.endswith("-packages-docs") and stdlib.name.endswith("-docs")
    key = embedded_key("packages")
    _fake_package(tmp_path, "plelabfake_b", "3.1", "Beta docstring.")
    assert embedded_key("packages") == key
    (tmp_path / "plelabfake_b-3.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plelabfake_b\nVersion: 3.2\n")
    assert embedded_key("packages") != key  # an upgraded package is another corpus

    cfg = resolve_config("cpu-tiny", ["data.embedded=packages", "data.tokenizer_sample_chars=200000"])
    data = prepare_token_data(cfg, progress=False)
    assert data.corpus_name == packages.name
    assert data.corpus_fingerprint == corpus_fingerprint(packages.documents)
    assert data.n_train_docs + data.n_val_docs == len(set(packages.documents))  # distinct documents


def test_packages_corpus_refusals(monkeypatch):
    import plelab.data.corpus as corpus_mod
    from plelab.data import embedded_corpus
    from plelab.errors import ConfigError

    with pytest.raises(ConfigError, match="data.embedded.*stdlib when --data is given"):
        resolve_config("cpu-tiny", ["data.embedded=packages", "data.path=corpus.txt"])
    with pytest.raises(ConfigError, match=re.escape("data.embedded='wiki': allowed stdlib | packages")):
        resolve_config("cpu-tiny", ["data.embedded=wiki"])
    monkeypatch.setattr(corpus_mod, "PACKAGE_CORPUS", ("numpy", "plelab_not_installed"))
    with pytest.raises(PlelabError, match="plelab_not_installed is not installed: pip install plelab_not_installed"):
        embedded_corpus("packages")

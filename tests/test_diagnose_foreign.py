"""`plelab diagnose` on checkpoints plelab did not train, as an outside user runs it: two seeds of an attached HF
model saved with save_pretrained at step 0 and after training, their text and tokenizer; a tiny Gemma 4 folder.

The pair trains on token classes (12 classes of 8 ids; a token's class decides the next token's class), so rows of
one class have one job and two seeds' tables share that geometry. The null pair is trained identically but its
table rows are drawn i.i.d. per position, so no row can learn anything about its id."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hf_models import VOCAB, tiny_host
from tokenizers import Tokenizer, models, pre_tokenizers

import plelab
from plelab.cli import main

CLASSES = 12


def structured(seed: int, n: int, t: int = 17) -> torch.Tensor:
    """``[n, t]`` sequences: with probability 0.8 the next token is a random member of class ``(5·class + 1) % 12``
    of the current token (class = id mod 12), else any token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, t, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(1, t):
        cls = (x[:, i - 1] % CLASSES * 5 + 1) % CLASSES
        member = cls + CLASSES * torch.randint(0, VOCAB // CLASSES, (n,), generator=g)
        jump = torch.randint(0, VOCAB, (n,), generator=g)
        x[:, i] = torch.where(torch.rand(n, generator=g) < 0.8, member, jump)
    return x


def word_tokenizer(size: int = VOCAB) -> Tokenizer:
    """A word-level tokenizer whose token ``w{i}`` has id ``i``."""
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def as_text(x: torch.Tensor) -> str:
    return "\n\n".join(" ".join(f"w{i}" for i in row.tolist()) for row in x)


def train_pair(root, iid: bool = False, steps: int = 150):
    """Two seeds, each saved at step 0 (``s{seed}-init``) and after ``steps`` (``s{seed}``)."""
    data = structured(0, 8 * steps)
    for seed in (0, 1):
        model = plelab.attach(tiny_host(), 8, seed=seed, init="gemma")
        model.save_pretrained(root / f"s{seed}-init")
        opt = plelab.adamw(plelab.param_groups(model, lr=1e-2))
        ids_gen = torch.Generator().manual_seed(1000 + seed)  # the null control: rows drawn i.i.d., per seed
        for step in range(steps):
            ids = data[8 * step:8 * step + 8]
            extra = {"table_ids": torch.randint(0, VOCAB, ids.shape, generator=ids_gen)} if iid else {}
            model(ids, labels=ids, **extra).loss.backward()
            opt.step()
            opt.zero_grad()
        model.save_pretrained(root / f"s{seed}")
    word_tokenizer().save(str(root / "tokenizer.json"))
    (root / "val.txt").write_text(as_text(structured(7, 300)))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    real, null = tmp_path_factory.mktemp("real"), tmp_path_factory.mktemp("iid")
    train_pair(real)
    train_pair(null, iid=True)
    return real, null


def diagnose_json(tmp_path, *argv) -> dict:
    out = tmp_path / "d"
    assert main(["diagnose", *map(str, argv), "--no-progress", "--out", str(out)]) == 0
    return json.loads((out / "diagnostics.json").read_text())


def full(p):
    return [p / "s0", "--reference", p / "s1", "--init", p / "s0-init", "--reference-init", p / "s1-init",
            "--data", p / "val.txt", "--tokenizer", p / "tokenizer.json", "--seq-len", "32", "--windows", "128"]


@pytest.mark.slow
def test_the_full_verdict_on_a_foreign_pair_learned_and_used_and_not_for_iid_ids(pairs, tmp_path):
    real, null = pairs
    reps = [diagnose_json(tmp_path / p.name, *full(p)) for p in (real, null)]
    for rep in reps:
        table = rep["table"]
        assert table["basis"] == "Δ = W_t − W_0"
        assert table["cross_seed"]["null"] == "rows permuted within frequency bins"
        assert set(table["use"]) == {"reset", "permute"} and table["use"]["permute"]["windows"] == 128
        assert len(rep["layers"]) == 2 and all("cross_seed" in layer and layer["use"] for layer in rep["layers"])
        assert rep["rows"]["used"] == VOCAB and "val.txt" in rep["rows"]["counted_in"]
    assert reps[0]["table"]["verdict"]["structure"] == "LEARNED", reps[0]["table"]["verdict"]
    assert reps[0]["table"]["verdict"]["use"] == "USED", reps[0]["table"]["verdict"]
    assert reps[1]["table"]["verdict"]["structure"] != "LEARNED", reps[1]["table"]["verdict"]
    assert reps[1]["table"]["verdict"]["use"] != "USED", reps[1]["table"]["verdict"]


@pytest.mark.slow
def test_without_init_it_compares_wt_and_says_so(pairs, tmp_path):
    real, _ = pairs
    # folders saved after plelab.attach record the init's seed: W_0 is regenerated, the basis is Δ
    rep = diagnose_json(tmp_path / "attached", real / "s0", "--reference", real / "s1")
    assert rep["table"]["basis"] == "Δ = W_t − W_0 (W_0 regenerated from the seeds plelab.attach recorded)"
    for seed in ("s0", "s1"):  # the same tables without that record: W_t is all there is
        shutil.copytree(real / seed, tmp_path / seed)
        config = json.loads((tmp_path / seed / "config.json").read_text())
        del config["plelab_ple"]["seed"]
        (tmp_path / seed / "config.json").write_text(json.dumps(config))
    rep = diagnose_json(tmp_path, tmp_path / "s0", "--reference", tmp_path / "s1")
    assert rep["table"]["basis"] == "W_t (no W_0 given)" and rep["table"]["use"] is None
    reasons = rep["table"]["verdict"]["reasons"]
    assert "independent initialisations" in reasons[0] and "frequency not matched" in reasons[0]
    assert "give --data (text) and --tokenizer" in reasons[1]


TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
            layer_types=["full_attention"] * 2, max_position_embeddings=64)


def gemma_folder(layout: str, folder) -> None:
    """A tiny random HF Gemma with PLE, saved as a user's checkpoint would be."""
    import transformers as T

    torch.manual_seed(0)
    if layout == "gemma3n-text":
        model = T.Gemma3nForCausalLM(T.Gemma3nTextConfig(**TEXT, activation_sparsity_pattern=[0.0] * 2,
                                                         num_kv_shared_layers=0, laurel_rank=4))
    elif layout == "gemma4-multimodal":  # model.language_model.* names, a vision tower beside
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8)
        model = T.Gemma4ForConditionalGeneration(T.Gemma4Config(text_config=TEXT, vision_config=vision,
                                                                 audio_config=None))
    else:
        model = T.Gemma4ForCausalLM(T.Gemma4TextConfig(**TEXT))
    if layout == "gemma4-bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="40KB" if layout == "gemma4-sharded" else "5GB")
    word_tokenizer().save(str(folder / "tokenizer.json"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["gemma4-bf16", "gemma4-sharded", "gemma4-multimodal", "gemma3n-text"])
def test_the_use_test_runs_through_transformers_on_gemma_folders(pairs, tmp_path, layout):
    real, _ = pairs
    folder = tmp_path / layout
    gemma_folder(layout, folder)
    if layout == "gemma4-sharded":
        assert (folder / "model.safetensors.index.json").exists() and len(list(folder.glob("*.safetensors"))) > 1
    rep = diagnose_json(tmp_path, folder, "--data", real / "val.txt", "--seq-len", "16", "--windows", "16")
    assert rep["key"].endswith("embed_tokens_per_layer.weight") and rep["shape"] == [VOCAB, 2, 8]
    if layout == "gemma4-multimodal":
        assert rep["key"] == "model.language_model.embed_tokens_per_layer.weight"
    use = rep["table"]["use"]
    assert set(use) == {"permute"} and use["permute"]["windows"] == 16
    if layout == "gemma3n-text":
        # HF initialises Gemma 3n's altup.correct_output_scale to zero, and the PLE gate reads the scaled AltUp
        # output: at init the branch is exactly zero, so permuting rows changes nothing — and the verdict says so.
        assert use["permute"]["delta"] == 0.0 and rep["table"]["verdict"]["use"] == "UNUSED"
    else:
        assert use["permute"]["se"] > 0
    assert rep["table"]["verdict"]["structure"] == "UNDECIDED" and "no --reference" in rep["table"]["verdict"][
        "reasons"][0]
    assert any("no --init, so no reset-to-W_0" in n for n in rep["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("extra, needle", [
    (["--init", "{real}/s0-init"], "--init and --reference-init go together"),
    (["--init", "{real}/s0-init", "--reference-init", "{small}"], "has a table of shape"),
    (["--data", "{real}/val.txt", "--tokenizer", "{big}"], "does not fit the model"),
    (["--tokenizer", "{real}/tokenizer.json"], "add --data FILE"),
    (["--data", "{real}/val.txt", "--no-use"], "--no-use turns off"),
    (["--data", "{real}/val.txt"], "holds no tokenizer.json"),
    (["--data", "{real}/val.txt", "--tokenizer", "{real}/tokenizer.json", "--seq-len", "100000"], "fewer than"),
])
def test_bad_foreign_comparisons_are_refused(pairs, tmp_path, capsys, extra, needle):
    real, _ = pairs
    small = tmp_path / "small"
    plelab.attach(tiny_host(), 4).save_pretrained(small)
    word_tokenizer(VOCAB + 50).save(str(tmp_path / "big.json"))
    capsys.readouterr()
    argv = ["diagnose", str(real / "s0"), "--reference", str(real / "s1"), "--no-progress",
            *[a.format(real=real, small=small, big=tmp_path / "big.json") for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_a_reference_with_other_rows_is_refused(pairs, tmp_path, capsys):
    real, _ = pairs
    other = tmp_path / "other"
    plelab.attach(tiny_host(), 8, vocab_size=VOCAB // 2).save_pretrained(other)
    capsys.readouterr()
    assert main(["diagnose", str(real / "s0"), "--reference", str(other), "--no-progress"]) == 2
    assert "rows must be the same token ids" in capsys.readouterr().err

"""``plelab diagnose`` on any checkpoint, with the use test run through transformers.

:func:`diagnose` is :func:`plelab.diagnostics.diagnose.diagnose_run` plus, for a checkpoint plelab did not train, what
its use test needs (:class:`~plelab.diagnostics.foreign.ForeignUse`):

- the model, loaded by transformers from the checkpoint's folder — an HF Gemma 3n / Gemma 4 (``*ForCausalLM`` or
  ``*ForConditionalGeneration``), a folder ``save_pretrained`` wrote after :func:`plelab.attach`
  (:func:`~plelab.integrations.hf.load_attached`) or one ``plelab export`` wrote — in float32, in eval mode;
- token windows of ``data`` (a text, JSONL or Parquet file or a folder of them, read as ``plelab train --data``
  reads it) encoded with ``tokenizer`` (a ``tokenizer.json``, or a folder holding one; default: the checkpoint
  folder's), documents joined by the model's EOS;
- how often each table row is looked up in that data, for the frequency bins of the use test and of the
  cross-seed null.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch

from plelab.data.sources import user_corpus
from plelab.data.tokenizer import load_tokenizer
from plelab.data.tokens import val_windows
from plelab.diagnostics.diagnose import diagnose_run
from plelab.diagnostics.foreign import ForeignUse
from plelab.diagnostics.tables import TABLE_SUFFIX, TableSource, find_table
from plelab.diagnostics.verdict import calibrated_windows
from plelab.errors import PlelabError
from plelab.integrations.hf import load_attached
from plelab.integrations.pretrained import from_pretrained
from plelab.model.ple import token_table_ids

DEFAULT_SEQ_LEN = 128


def _config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        raise PlelabError(f"{folder} has no readable config.json: the use test loads the model with transformers, "
                          "so give the HF model folder (config.json and safetensors), not a bare table") from None


def load_model(source: TableSource) -> tuple[torch.nn.Module, torch.nn.Parameter, dict]:
    """``(model, its table parameter, its config.json)`` for the folder holding ``source``'s table."""
    folder = source.file.parent
    config = _config(folder)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if "plelab_ple" in config or "plelab_ple" in text:
        model = load_attached(folder, dtype=torch.float32)
    else:
        model = from_pretrained("AutoModelForCausalLM", folder, "a causal LM (the use test needs a model folder "
                                "transformers reads)", dtype=torch.float32)
    tables = [(n, p) for n, p in model.named_parameters() if n.endswith(TABLE_SUFFIX)]
    expected = (source.rows, source.num_layers * source.dim)
    if len(tables) != 1 or tuple(tables[0][1].shape) != expected:
        raise PlelabError(f"the model transformers loaded from {folder} has {len(tables)} per-layer tables "
                          f"({[list(p.shape) for _, p in tables]}), not one of shape {list(expected)} as in its file")
    return model.eval(), tables[0][1], config


def _eos(config: dict, tokenizer) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    eos = text.get("eos_token_id", config.get("eos_token_id"))
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        for name in ("<|endoftext|>", "<eos>", "</s>"):
            eos = tokenizer.token_to_id(name)
            if eos is not None:
                break
    return eos


def data_windows(data: str | Path, tokenizer_path: str | Path, config: dict, vocab: int, rows: int, seq_len: int,
                 windows: int, text_field: str = "text") -> tuple[torch.Tensor, np.ndarray, str]:
    """``(windows [N, seq_len+1], row counts [rows], description)`` of ``data`` under the tokenizer."""
    tok_path = Path(tokenizer_path)
    if tok_path.is_dir():
        tok_path = tok_path / "tokenizer.json"
    tokenizer = load_tokenizer(tok_path)
    if tokenizer.get_vocab_size() > vocab:
        raise PlelabError(f"the tokenizer {tok_path} has {tokenizer.get_vocab_size():,} entries, the model "
                          f"{vocab:,}: it does not fit the model — give the tokenizer the checkpoint was trained with")
    corpus = user_corpus(data, text_field)
    eos = _eos(config, tokenizer)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(corpus.documents):
        ids += enc.ids + ([eos] if eos is not None else [])
    stream = np.asarray(ids, dtype=np.int64)
    if len(stream) < seq_len + 1:
        raise PlelabError(f"--data {data} gives {len(stream):,} tokens, fewer than --seq-len + 1 = {seq_len + 1}; "
                          "give more text or a smaller --seq-len")
    if stream.max() >= vocab:
        raise PlelabError(f"the tokenizer {tok_path} produces id {int(stream.max())}, beyond the model's vocabulary of "
                          f"{vocab:,}: it does not fit the model")
    counts = np.bincount(token_table_ids(torch.from_numpy(stream), rows).numpy(), minlength=rows).astype(np.float64)
    win = val_windows(stream, seq_len, windows)
    return win, counts, f"{data} ({len(stream):,} tokens, {tok_path.name})"


def diagnose(path: str | Path, reference: str | Path | None = None, null_run: str | Path | None = None,
             use: bool = True, num_layers: int | None = None, dp: int | None = None, windows: int | None = None,
             progress: bool = True, null_reference: str | Path | None = None, init: str | Path | None = None,
             reference_init: str | Path | None = None, data: str | Path | None = None,
             tokenizer: str | Path | None = None, text_field: str = "text", seq_len: int | None = None,
             allow_mismatch: bool = False, dim: int | None = None) -> dict:
    """Everything ``plelab diagnose`` reports, as a JSON-ready dict (see the module doc for ``data``/``tokenizer``;
    the other arguments: :func:`plelab.diagnostics.diagnose.diagnose_run`). ``dim`` is the old name of ``dp``
    (deprecated; it warns)."""
    if dim is not None:
        if dp is not None:
            raise TypeError("diagnose() got dp and its old name dim: give dp only")
        warnings.warn("diagnose(dim=...) is deprecated: the table's dP is dp=", DeprecationWarning, stacklevel=2)
        dp = dim
    if data is None and (tokenizer is not None or seq_len is not None):
        raise PlelabError("--tokenizer and --seq-len are for the use test on --data: add --data FILE, or drop them")
    if data is not None and not use:
        raise PlelabError("--data is for the use test, which --no-use turns off: drop one of them")
    foreign_use = None
    windows = calibrated_windows() if windows is None else windows
    if data is not None:
        source = find_table(path, num_layers, dp)
        if source.config is not None or source.monitor is not None:
            raise PlelabError(f"{path} is a plelab run or Monitor folder: its use test reads the run's own validation "
                              "data and model; drop --data/--tokenizer")
        seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
        if seq_len < 1:
            raise PlelabError(f"--seq-len must be >= 1, got {seq_len}")
        tokenizer = tokenizer if tokenizer is not None else source.file.parent / "tokenizer.json"
        if not Path(tokenizer).exists():
            raise PlelabError(f"{source.file.parent} holds no tokenizer.json to encode --data with; give --tokenizer "
                              "(a tokenizer.json, or a folder holding one)")
        model, table, config = load_model(source)
        vocab = model.get_input_embeddings().num_embeddings
        win, counts, what = data_windows(data, tokenizer, config, vocab, source.rows, seq_len, windows, text_field)
        foreign_use = ForeignUse(model=model, table=table, windows=win, counts=counts, data=what)
    return diagnose_run(path, reference=reference, null_run=null_run, use=use, num_layers=num_layers, dp=dp,
                          windows=windows, progress=progress, null_reference=null_reference, init=init,
                          reference_init=reference_init, foreign_use=foreign_use, allow_mismatch=allow_mismatch)

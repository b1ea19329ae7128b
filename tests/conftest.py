"""Shared fixtures: an isolated cache folder, CPU hygiene, tiny configs and a small token stream."""

from __future__ import annotations

import pytest
import torch

from plelab.config import resolve_config


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PLELAB_CACHE", str(tmp_path_factory.mktemp("plelab-cache")))
    torch.set_flush_denormal(True)
    yield
    mp.undo()


@pytest.fixture
def tiny_cfg():
    return resolve_config("cpu-tiny")


@pytest.fixture(scope="session")
def tiny_data():
    """The embedded corpus tokenised with a 512-entry BPE (trained once per session)."""
    from plelab.data import get_tokenizer, load_corpus, prepare_tokens

    corpus = load_corpus(None)
    tok = get_tokenizer(corpus, 512, show_progress=False)
    return prepare_tokens(corpus, tok, 0.05)

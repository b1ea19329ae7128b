"""From a config to token streams: corpus -> tokenizer -> cached, memory-mapped token files.

Under torchrun, rank 0 does the work first (training the tokenizer, writing the caches)
while the other ranks wait; they then read the same cached files.
"""

from __future__ import annotations

from plelab.config.schema import RunConfig
from plelab.data.sources import load_corpus
from plelab.data.tokenizer import get_tokenizer
from plelab.data.tokens import TokenData, prepare_tokens
from plelab.distributed import DistInfo, all_ranks_ok
from plelab.errors import PlelabError


def prepare_data(cfg: RunConfig, progress: bool = True, dist=None) -> TokenData:
    dist = dist or DistInfo()

    def build() -> TokenData:
        corpus = load_corpus(cfg.data.path, cfg.data.text_field)
        tok = get_tokenizer(corpus, cfg.model.vocab_size, cfg.data.tokenizer, show_progress=progress and dist.is_main)
        return prepare_tokens(corpus, tok, cfg.data.val_fraction)

    if dist.is_main:
        try:
            data = build()
        except PlelabError:
            all_ranks_ok(False, dist)  # release the other ranks, then report here
            raise
        all_ranks_ok(True, dist)
        return data
    if not all_ranks_ok(True, dist):
        raise PlelabError("rank 0 could not prepare the data (its message says why)")
    return build()

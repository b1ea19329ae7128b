"""From a config to token streams: corpus -> tokenizer -> cached, memory-mapped token files.

Under torchrun, rank 0 does the work first (training the tokenizer, writing the caches)
while the other ranks wait; they then read the same cached files.
"""

from __future__ import annotations

from plelab.config.schema import RunConfig
from plelab.data.sources import load_corpus
from plelab.data.tokenizer import get_tokenizer
from plelab.data.tokens import TokenData, prepare_tokens


def prepare_data(cfg: RunConfig, progress: bool = True, dist=None) -> TokenData:
    from plelab.train.distributed import DistInfo, barrier

    dist = dist or DistInfo()

    def build() -> TokenData:
        corpus = load_corpus(cfg.data.path, cfg.data.text_field)
        tok = get_tokenizer(corpus, cfg.model.vocab_size, cfg.data.tokenizer, show_progress=progress and dist.is_main)
        return prepare_tokens(corpus, tok, cfg.data.val_fraction)

    if dist.is_main:
        data = build()
        barrier(dist)
        return data
    barrier(dist)
    return build()

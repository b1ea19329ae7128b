"""``plelab ingest``: prepare (or check) a corpus's token shards without training; the data flags ``train`` shares."""

from __future__ import annotations

import argparse
import json
import sys

from plelab.cli.common import config_args, config_settings
from plelab.config import resolve_run_config
from plelab.data.pipeline import ingest
from plelab.data.streaming import NotReady
from plelab.distributed import init_distributed, shutdown
from plelab.errors import ConfigError
from plelab.runs import check_budget


def data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", action="append", metavar="PATH[:WEIGHT]",
                   help="your data: text (.txt/.md, .jsonl[.gz|.zst], .parquet, a folder of them, a HF datasets "
                        "folder) or token shards (.bin/.npy, a folder of them); twice or more with :WEIGHT for a "
                        "mixture, e.g. --data web/:0.7 --data code/:0.3")
    p.add_argument("--text-field", help="JSONL field / Parquet or datasets column holding the text (default 'text')")
    p.add_argument("--tokenizer", help="use this tokenizer.json instead of training a BPE on the corpus (for token "
                                       "shards: the tokenizer they were made with)")
    p.add_argument("--vocab-size", type=int, help="model.vocab_size (token shards made without a tokenizer.json, "
                                                  "e.g. by tiktoken: the id range the shards use)")


def data_settings(args: argparse.Namespace) -> dict:
    """The config keys the data flags set: one ``--data`` is ``data.path``; several (PATH:WEIGHT each) ``data.mix``."""
    values = args.data or []
    out = {"data.text_field": args.text_field, "data.tokenizer": args.tokenizer, "model.vocab_size": args.vocab_size}
    if any(not v.strip() for v in values):
        raise ConfigError("--data is empty; give a file or folder, e.g. --data corpus.txt")
    if len(values) == 1:
        out["data.path"] = values[0]
    elif values:
        out["data.mix"] = list(values)
    return out


def cmd_ingest(args: argparse.Namespace) -> int:
    settings = config_settings(args, **data_settings(args))
    cfg = resolve_run_config(args.preset, config=args.config, overrides=args.overrides, settings=settings)
    check_budget(cfg, model=False)  # a vocabulary its BPE cannot reach, refused before the trainer aborts
    info = init_distributed(cfg.train.device)
    ok = False
    try:
        try:
            summary = ingest(cfg, progress=not args.no_progress, verify=args.verify, check=args.check, dist=info)
        except NotReady as err:
            print(f"plelab: not ready: {err}", file=sys.stderr)
            ok = True
            return 1
        if info.is_main:
            if args.json:
                print(json.dumps(summary, indent=1))
            else:
                print(f"{summary['name']}: {summary['train_tokens']:,} train / {summary['val_tokens']:,} validation "
                      f"tokens ({summary['dtype']}), {summary['split']}; sha256 {summary['fingerprint'][:16]}…; "
                      f"shards in {summary['location']} ({summary['seconds']:.1f} s)")
        ok = True
    finally:
        shutdown(info, ok)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("ingest", help="prepare (or --check) a corpus's token shards without training")
    config_args(p, seed=False, gate=False)  # the data do not depend on the seed or the gate
    data_args(p)
    p.add_argument("--verify", action="store_true",
                   help="re-read and re-hash the text even when the cache's file list (sizes, mtimes) matches; "
                        "re-ingest if it changed")
    p.add_argument("--check", action="store_true",
                   help="build nothing: exit 0 if the shards are ready, 1 (saying what is missing) if not")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_ingest)

"""Streaming ingest at corpus scale: peak memory, throughput against HF ``tokenizers`` itself, the warm data step.

    python bench/ingest.py [--gb 2] [--workdir /tmp/plelab-ingest-bench] [--keep]

1. Generates ``--gb`` GB of JSONL text on the fly (not checked in): documents of 10–60 sentences drawn
   from a pool of 200 k sentences over a Zipf(1.1) vocabulary of 60 k syllable-built words, so that BPE
   meets a realistic spread of words and no document repeats.
2. In a child process (so its peak RSS is its own): trains the tokenizer on the bounded sample
   (``data.tokenizer_sample_chars``, default 100 M characters: the documents with the smallest hashes)
   and ingests the corpus into token shards
   (``plelab.data.pipeline.load_data``); then, in the same process and on the first 64 MB of the same
   documents, times HF ``Tokenizer.encode_batch_fast`` alone, in the same 2 M-character batches.
   Throughput is MB of UTF-8 text per second of the ingest pass (tokenizer training excluded, and
   reported on its own).
3. In a fresh child process: the data step on the warm cache (``prepare_data``), timed after imports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

SYLLABLES = ("ka ri to me na lo su pe de vi ra mo ne ti la ko sa pu be ni ro ga fe li do se mu ta zo "
             "chi sha tra ple ver ion ent ous ing ers").split()


def generate(folder: Path, gb: float, seed: int = 0) -> int:
    """JSONL files of about ``gb`` GB in ``folder``; returns the bytes written."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=60_000)
    words = ["".join(rng.choice(SYLLABLES, size=k)) for k in lengths]
    ranks = np.arange(1, len(words) + 1, dtype=np.float64) ** -1.1
    cdf = np.cumsum(ranks / ranks.sum())
    pool = []
    for _ in range(200_000):
        ids = np.searchsorted(cdf, rng.random(int(rng.integers(6, 20))))
        s = " ".join(words[i] for i in ids)
        pool.append(s[0].upper() + s[1:] + ".")
    folder.mkdir(parents=True, exist_ok=True)
    target, written, part = int(gb * 1e9), 0, 0
    while written < target:
        with open(folder / f"part-{part:03d}.jsonl", "w", encoding="utf-8") as f:
            size = 0
            while size < 256_000_000 and written + size < target:
                picks = rng.integers(0, len(pool), size=int(rng.integers(10, 60)))
                line = json.dumps({"text": " ".join(pool[i] for i in picks)}) + "\n"
                f.write(line)
                size += len(line)
        written += size
        part += 1
    return written


def child_ingest(data: str, vocab: int) -> dict:
    """Runs in the child: tokenizer, ingest, then HF's own encode on 64 MB of the same text."""
    from plelab.config import resolve_config
    from plelab.data.pipeline import data_sources, resolve_tokenizer
    from plelab.data.sources import iter_documents
    from plelab.data.streaming import BATCH_CHARS, ingest_source

    cfg = resolve_config("cpu-tiny", [f"data.path={data}", f"model.vocab_size={vocab}"])
    sources = data_sources(cfg.data)
    t0 = time.perf_counter()
    tok = resolve_tokenizer(cfg.data, sources, vocab, progress=False)
    t_tok = time.perf_counter() - t0
    rss_tok = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    out = ingest_source(sources[0][0], tok, cfg.data.val_fraction, progress=False)
    t_ingest = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    text_bytes = sum(f.stat().st_size for f in sources[0][0].files)
    batches, batch, size, taken = [], [], 0, 0
    for doc in iter_documents(sources[0][0]):
        batch.append(doc)
        size += len(doc)
        taken += len(doc.encode("utf-8"))
        if size >= BATCH_CHARS:
            batches.append(batch)
            batch, size = [], 0
        if taken >= 64_000_000:
            break
    t0 = time.perf_counter()
    for b in batches:
        tok.encode_batch_fast(b)
    t_hf = time.perf_counter() - t0
    hf_bytes = sum(len(d.encode("utf-8")) for b in batches for d in b)
    return {"tokenizer_s": t_tok, "rss_after_tokenizer_gib": rss_tok, "ingest_s": t_ingest, "peak_rss_gib": rss,
            "file_bytes": text_bytes, "tokens": len(out.train) + len(out.val),
            "ingest_mb_s": text_bytes / 1e6 / t_ingest,
            "hf_encode_mb_s": hf_bytes / 1e6 / t_hf, "hf_sample_mb": hf_bytes / 1e6}


def child_warm(data: str, vocab: int) -> dict:
    from plelab.config import resolve_config
    from plelab.runs import prepare_data

    cfg = resolve_config("cpu-tiny", [f"data.path={data}", f"model.vocab_size={vocab}"])
    t0 = time.perf_counter()
    d = prepare_data(cfg, progress=False)
    return {"warm_data_step_s": time.perf_counter() - t0, "train_tokens": len(d.train),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--workdir", default="/tmp/plelab-ingest-bench")
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus and cache")
    ap.add_argument("--child", choices=("ingest", "warm"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.workdir)
    if args.child:
        fn = child_ingest if args.child == "ingest" else child_warm
        print(json.dumps(fn(str(work / "corpus"), args.vocab)))
        return
    print(f"machine: {machine()}")
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    n = generate(work / "corpus", args.gb)
    print(f"generated {n / 1e9:.2f} GB of JSONL in {time.perf_counter() - t0:.0f} s")
    env = {**os.environ, "PLELAB_CACHE": str(work / "cache")}
    results = {}
    for child in ("ingest", "warm"):
        proc = subprocess.run([sys.executable, __file__, "--child", child, "--gb", str(args.gb), "--vocab",
                               str(args.vocab), "--workdir", str(work)], env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{child} child failed:\n{proc.stderr[-3000:]}")
        results[child] = json.loads(proc.stdout.strip().splitlines()[-1])
    r, w = results["ingest"], results["warm"]
    print(f"tokenizer (100 M-character sample): {r['tokenizer_s']:.1f} s, "
          f"peak RSS so far {r['rss_after_tokenizer_gib']:.2f} GiB")
    print(f"ingest: {r['file_bytes'] / 1e9:.2f} GB -> {r['tokens']:,} tokens in {r['ingest_s']:.0f} s = "
          f"{r['ingest_mb_s']:.2f} MB/s; HF encode_batch_fast alone on {r['hf_sample_mb']:.0f} MB of the same text: "
          f"{r['hf_encode_mb_s']:.2f} MB/s; ratio {r['ingest_mb_s'] / r['hf_encode_mb_s']:.2f}")
    print(f"peak RSS of the ingest process (tokenizer training included): {r['peak_rss_gib']:.2f} GiB "
          f"({r['peak_rss_gib'] * 2**30 / r['file_bytes']:.3f} bytes of RSS per byte of text)")
    print(f"warm cache: data step {w['warm_data_step_s']:.2f} s after imports, peak RSS {w['peak_rss_gib']:.2f} GiB")
    print(json.dumps(results))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""``plelab export``, ``generate`` and ``consolidate``: a run's model out of plelab (an HF folder), text from it, and
the single-file weights of a sharded (FSDP2) checkpoint."""

from __future__ import annotations

import argparse

from plelab.integrations.export import export
from plelab.runs.generation import generate_text
from plelab.training.checkpoint import consolidate_checkpoint


def cmd_export(args: argparse.Namespace) -> int:
    result = export(args.run, args.out, verify=not args.no_verify)
    check = (f"logits match the run's (max |Δ| {result.max_logit_diff:.1e})" if result.max_logit_diff is not None
             else "not verified (--no-verify)")
    print(f"wrote {result.out}: {result.architecture} from step {result.step}; {check}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    text = generate_text(args.run, args.prompt, args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k or None, seed=args.seed, device=args.device)
    print(args.prompt + text)
    return 0


def cmd_consolidate(args: argparse.Namespace) -> int:
    out = consolidate_checkpoint(args.path)
    print(f"wrote {out} ({out.stat().st_size / 2**20:,.1f} MiB): plelab eval, diagnose and export read it")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("export", help="write a text run as an HF folder (LlamaForCausalLM for dP=0, PlelabForCausalLM "
                                      "with PLE) with its tokenizer")
    p.add_argument("run", help="a run folder (its latest checkpoint) or a checkpoints/step-N folder")
    p.add_argument("out", help="the folder to create (must not exist)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip loading the folder back through transformers to compare logits")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("generate", help="continue a prompt with a trained text run (KV cache, table memory-mapped)")
    p.add_argument("run", help="a run folder (its latest checkpoint) or a checkpoints/step-N folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="at most this many new tokens (default 64)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens; 0: all (default 50)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="cpu", help="where the trunk runs (the table stays memory-mapped on the host)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("consolidate", help="write model.safetensors for a sharded (FSDP2) checkpoint, so that eval, "
                                           "diagnose and export read it")
    p.add_argument("path", help="a run folder (its latest checkpoint) or a checkpoints/step-N folder")
    p.set_defaults(func=cmd_consolidate)

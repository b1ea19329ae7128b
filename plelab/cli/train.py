"""``plelab train``, ``plelab eval``, ``plelab diagnose``: one run, its validation loss, its table's verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plelab.cli.common import config_args, config_settings, dp_value, trunk_args, trunk_settings
from plelab.cli.data import data_args, data_settings
from plelab.config import RunConfig, resolve_run_config
from plelab.config.overrides import LEGACY_KEYS, get_value
from plelab.errors import ConfigError, PlelabError
from plelab.integrations.checkpoints import diagnose
from plelab.io import check_folder_target, ensure_dir, os_reason
from plelab.reports.diagnostics import diagnostics_text, plot_diagnostics, plot_run_history, write_json_report
from plelab.runs import train
from plelab.training.evaluate import evaluate


def check_run_folder(out: Path) -> None:
    """Refuse, before anything is read or written, a run folder that cannot be one: a file given as --out,
    a file or unreadable folder in the place of its parts."""
    check_folder_target(out, "--out", "choose another --out for the run folder")
    for name in ("checkpoints", "config.json", "metrics.jsonl", "summary.json"):
        part = out / name
        if part.exists() and part.is_dir() != (name == "checkpoints"):
            kind = "a file" if name == "checkpoints" else "a folder"
            raise PlelabError(f"{part} is {kind}, so {out} is not a plelab run; move it away or choose another --out")


def cmd_train(args: argparse.Namespace) -> int:
    if not args.out.strip():
        raise ConfigError("--out is empty; name the run folder, e.g. --out runs/my-run")
    out = Path(args.out)
    check_run_folder(out)
    saved = out / "config.json"
    settings = config_settings(args, **{
        "ple.dim": args.dp, "train.steps": args.steps, "train.table_device": args.ple_table_device,
        "train.table_optimizer": args.table_optimizer, **data_settings(args), **trunk_settings(args)})
    cfg = resolve_run_config(args.preset, saved=saved if args.resume and saved.exists() else None,
                             config=args.config, overrides=args.overrides, settings=settings)
    given = {o.partition("=")[0].strip() for o in args.overrides} | {k for k, v in settings.items() if v is not None}
    refuse_without_effect(cfg, given)
    train(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    return 0


# settings of the per-layer table: without one (ple.dim=0) they would be recorded and do nothing
TABLE_ONLY = ("ple.vocab_size", "ple.vocab_remap", "ple.gate", "ple.gate_init", "ple.gate_learn", "ple.table_init_std",
              "ple.ids", "ple.table", "ple.table_scale", "ple.table_scale_dim", "train.table_lr", "train.table_lr_mult",
              "train.table_weight_decay", "train.table_optimizer", "train.table_device")


def refuse_without_effect(cfg, given: set[str]) -> None:
    """Refuse, in one line, a setting given on this command line (``--set`` or a flag) that this run would record and
    not use: a table setting with ``ple.dim=0``, ``ple.gate_init`` / ``ple.gate_learn`` under a gate that has no
    learned value, ``data.tokenizer_sample_chars`` with a given tokenizer. (A config file or a sweep's arm may carry
    them: a study's baseline shares its arms' settings.)"""
    default = RunConfig()
    given = {LEGACY_KEYS[k][0] if k in LEGACY_KEYS else k for k in given}  # visual.enabled is kind
    changed = [k for k in sorted(given) if get_value(cfg, k) != get_value(default, k)]
    if not cfg.ple.enabled:
        for key in changed:
            if key in TABLE_ONLY:
                raise ConfigError(f"{key}={get_value(cfg, key)!r} sets the per-layer table, but ple.dim=0 has none: "
                                  "drop it, or give --dp")
    if cfg.ple.gate not in ("scalar", "vector"):
        for key in ("ple.gate_init", "ple.gate_learn"):
            if key in changed:
                raise ConfigError(f"{key}={get_value(cfg, key)!r} sets a learned gate, but ple.gate={cfg.ple.gate} has "
                                  "none: drop it, or --set ple.gate=scalar (or vector)")
    if "data.tokenizer_sample_chars" in changed and cfg.data.tokenizer is not None:
        raise ConfigError("data.tokenizer_sample_chars sizes the sample a BPE is trained on, but --tokenizer gives "
                          "the tokenizer: drop one of them")


def cmd_eval(args: argparse.Namespace) -> int:
    out = evaluate(args.path, device=args.device, windows=args.windows, batch=args.batch,
                   table_in_memory=args.table_in_memory, progress=not args.no_progress)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        where = ("memory-mapped on the host" if out["table_memory_mapped"] else f"in memory on {out['table_device']}"
                 ) if out["table_device"] is not None else "no PLE table"
        print(f"{out['checkpoint']}: validation loss {out['val_loss']:.4f} nats over {out['windows']} windows "
              f"(trunk on {out['device']}, table {where}; loaded in {out['load_seconds']:.2f} s)")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    fix = "give a writable folder for diagnostics.json and the plots"
    if args.out:
        check_folder_target(args.out, "--out", fix)
    rep = diagnose(args.path, reference=args.reference, null_run=args.null, use=not args.no_use,
                   num_layers=args.num_layers, dp=args.dp, windows=args.windows, progress=not args.no_progress,
                   null_reference=args.null_reference, init=args.init, reference_init=args.reference_init,
                   data=args.data, tokenizer=args.tokenizer, text_field=args.text_field, seq_len=args.seq_len,
                   allow_mismatch=args.allow_mismatch)
    print(json.dumps(rep, indent=1) if args.json else diagnostics_text(rep))
    if args.out:
        ensure_dir(args.out, "--out", fix)
        try:
            write_json_report(rep, Path(args.out) / "diagnostics.json")
        except OSError as err:
            raise PlelabError(f"cannot write to {args.out}: {os_reason(err)}") from None
        written = plot_diagnostics(rep, args.out)
        if rep.get("run_dir"):
            written += plot_run_history(rep["run_dir"], args.out)
        for path in written:
            print(f"wrote {path}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("train", help="train one model: RUN/config.json, metrics.jsonl, checkpoints, summary.json")
    config_args(p)
    p.set_defaults(func=cmd_train)
    p.add_argument("--dp", type=dp_value, help="dP (ple.dim)")
    p.add_argument("--steps", type=int, help="optimizer steps (train.steps)")
    p.add_argument("--out", required=True, help="run folder to create (or to continue with --resume)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    data_args(p)
    trunk_args(p)
    p.add_argument("--ple-table-device", choices=("auto", "cpu"),
                   help="cpu: keep the per-layer table and its optimizer state in host memory (train.table_device)")
    p.add_argument("--table-optimizer", choices=("adamw", "row-sparse"),
                   help="row-sparse: update only the table rows in the batch (train.table_optimizer; default adamw)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")

    p = sub.add_parser("eval", help="validation loss of a trained text model (per-layer table memory-mapped)")
    p.add_argument("path", help="a run folder (its latest checkpoint) or a checkpoints/step-N folder")
    p.add_argument("--device", default="auto", help="where the trunk runs: auto | cpu | cuda | cuda:N")
    p.add_argument("--windows", type=int, help="validation windows (default: the run's own, as in training)")
    p.add_argument("--batch", type=int, help="windows per forward pass (default: the run's micro-batch)")
    p.add_argument("--table-in-memory", action="store_true",
                   help="read the table into memory on --device instead of memory-mapping it")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("diagnose", help="has a per-layer table learned structure, and is it used? (early verdict)")
    p.add_argument("path", help="a run folder, a checkpoint folder, or a safetensors file/folder with "
                                "embed_tokens_per_layer.weight (HF Gemma 3n / Gemma 4)")
    p.add_argument("--reference", help="the same run with another seed (cross-seed agreement of the change); a run "
                                       "folder is read at this checkpoint's step (or the nearest, noted)")
    p.add_argument("--null", help="a matched null run (same config with --set ple.ids=iid): its Δ metrics beside")
    p.add_argument("--null-reference", help="the null run's second seed: their agreement bounds what a real "
                                            "table's cross-seed agreement must exceed")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare a --reference / --null of another model, table shape, precision, corpus (or the same "
                        "seed) anyway; what differs is printed in the notes")
    p.add_argument("--init", help="for a checkpoint plelab did not train: its step-0 checkpoint (W_0, for Δ)")
    p.add_argument("--reference-init", help="the --reference checkpoint's step-0 checkpoint (with --init)")
    p.add_argument("--data", help="for a checkpoint plelab did not train: text (file or folder, as train --data) for "
                                  "the use test, run through transformers")
    p.add_argument("--tokenizer", help="with --data: its tokenizer.json, or a folder holding one (default: the "
                                       "checkpoint folder's)")
    p.add_argument("--text-field", default="text", help="with --data: the JSONL/Parquet text field (default 'text')")
    p.add_argument("--seq-len", type=int, help="with --data: tokens per window (default 128)")
    p.add_argument("--num-layers", type=int, help="L, for a safetensors table without config.json")
    p.add_argument("--dp", type=dp_value, help="dP, for a safetensors table without config.json")
    p.add_argument("--windows", type=int, help="validation windows for the use test (default: the calibration's, "
                   "64: the verdict's error rates were measured with it)")
    p.add_argument("--no-use", action="store_true", help="skip the use test (no model evaluation)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--out", help="also write diagnostics.json and PNG plots into this folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_diagnose)

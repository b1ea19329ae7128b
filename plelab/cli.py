"""The ``plelab`` command line. Thin: parse arguments, resolve the config, call the package.

User errors (:class:`~plelab.errors.PlelabError` and argparse errors) print one line on
stderr and exit with code 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plelab import __version__
from plelab.errors import ConfigError, PlelabError
import plelab.visual  # noqa: F401,E402  (registers the visual kind of run)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"plelab: error: {message} (see '{self.prog} --help')\n")


def _config_args(p: argparse.ArgumentParser, preset: str | None = "cpu-tiny", seed: bool = True) -> None:
    from plelab.config import GATE_KINDS, PRESETS

    shown = f"default {preset}" if preset else "default cpu-tiny; when resuming, the run's own"
    p.add_argument("--preset", default=preset, help=f"named preset: {', '.join(PRESETS)} ({shown})")
    p.add_argument("--gate", choices=GATE_KINDS, help="PLE gate variant (default gemma)")
    if seed:
        p.add_argument("--seed", type=int, help="run seed (default 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config field, e.g. --set model.hidden_size=128 (repeatable)")


def _parse_dp_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"invalid --dp {text!r}: give integers >= 0 separated by commas, e.g. 0,64,128") from None
    if not values:
        raise ConfigError("invalid --dp '': give integers >= 0 separated by commas, e.g. 0,64,128")
    return values


def cmd_params(args: argparse.Namespace) -> int:
    from plelab.config import resolve_config
    from plelab.model.accounting import account
    from plelab.report.tables import accounting_tables

    base_cfg = resolve_config(args.preset, args.overrides, gate=args.gate, seed=args.seed)
    dims = _parse_dp_list(args.dp) if args.dp else [base_cfg.ple.dim]
    rows = []
    for dp in sorted(set([0, *dims])):
        cfg = resolve_config(args.preset, args.overrides, gate=args.gate, seed=args.seed, dp=dp)
        rows.append(account(cfg.model, cfg.ple, cfg.train.seq_len))
    if args.json:
        print(json.dumps({"preset": args.preset, "rows": [r.to_dict() for r in rows]}, indent=2))
    else:
        m = base_cfg.model
        vp = base_cfg.ple.resolved_vocab_size(m)
        shape = (f"H={m.hidden_size}, L={m.num_hidden_layers}, V={m.vocab_size:,}, Vp={vp:,}, "
                 f"gate={base_cfg.ple.gate}")
        print(accounting_tables(args.preset, rows, shape))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from plelab.config import resolve_config

    dims = _parse_dp_list(args.dp) if args.dp else [None]
    if len(dims) > 1:
        raise ConfigError(f"config takes one dP, got --dp {args.dp}; use plelab params for several")
    dp = dims[0]
    cfg = resolve_config(args.preset, args.overrides, gate=args.gate, seed=args.seed, dp=dp)
    print(json.dumps(cfg.to_dict(), indent=2))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from plelab.config import PRESETS
    from plelab.model.accounting import account
    from plelab.report.tables import format_table

    rows = []
    for name, make in PRESETS.items():
        cfg = make()
        m = cfg.model
        a = account(m, cfg.ple, cfg.train.seq_len)
        rows.append([name, m.hidden_size, m.num_hidden_layers, f"{m.num_attention_heads}/{m.num_key_value_heads}",
                     f"{m.vocab_size:,}", cfg.ple.dim, f"{a.base:,}", f"{a.total:,}"])
    print(format_table(["preset", "H", "L", "heads q/kv", "V", "dP", "base params", "total params"], rows))
    return 0


def _check_run_folder(out: Path) -> None:
    """Refuse, before anything is read or written, a run folder that cannot be one: a file given as --out,
    a file or unreadable folder in the place of its parts."""
    from plelab.io import check_folder_target

    check_folder_target(out, "--out", "choose another --out for the run folder")
    for name in ("checkpoints", "config.json", "metrics.jsonl", "summary.json"):
        part = out / name
        if part.exists() and part.is_dir() != (name == "checkpoints"):
            kind = "a file" if name == "checkpoints" else "a folder"
            raise PlelabError(f"{part} is {kind}, so {out} is not a plelab run; move it away or choose another --out")


def cmd_train(args: argparse.Namespace) -> int:
    from plelab.config import RunConfig, apply_overrides, resolve_config, set_value
    from plelab.runtime import resolve_device
    from plelab.train.distributed import init_distributed, shutdown
    from plelab.runs import describe_data, make_trainer, prepare_data

    if not args.out.strip():
        raise ConfigError("--out is empty; name the run folder, e.g. --out runs/my-run")
    _check_run_folder(Path(args.out))
    saved = Path(args.out) / "config.json"
    if args.resume and saved.exists():
        try:
            cfg = RunConfig.from_dict(json.loads(saved.read_text()))
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read {saved} ({err}); fix it or start a new --out") from None
        except PlelabError as err:
            raise ConfigError(f"{saved}: {err}; fix it or start a new --out") from None
        if args.preset is not None and args.preset != cfg.preset:
            raise ConfigError(f"--preset {args.preset} differs from the run's preset {cfg.preset}; "
                              "drop --preset when resuming")
        given = (("ple.dim", args.dp), ("ple.gate", args.gate), ("seed", args.seed), ("train.steps", args.steps))
        for key, value in given:
            if value is not None:
                set_value(cfg, key, value, from_text=isinstance(value, str))
        cfg = apply_overrides(cfg, args.overrides)
    else:
        cfg = resolve_config(args.preset or "cpu-tiny", args.overrides, dp=args.dp, gate=args.gate, seed=args.seed,
                             steps=args.steps)
    for key, value in (("train.table_device", args.ple_table_device), ("train.table_optimizer", args.table_optimizer)):
        if value is not None:
            set_value(cfg, key, value)
    cfg.validate()
    for key, value in (("data.path", args.data), ("data.text_field", args.text_field),
                       ("data.tokenizer", args.tokenizer)):
        if value is not None:
            set_value(cfg, key, value)
    dist = init_distributed(resolve_device(cfg.train.device).type)
    try:
        data = prepare_data(cfg, progress=not args.no_progress, dist=dist)
        if dist.is_main:
            entropy = data.unigram_entropy(cfg.model.vocab_size)
            print(f"{cfg.preset} dP={cfg.ple.dim}: {describe_data(cfg, data)}; "
                  f"validation unigram entropy {entropy:.3f} nats")
        log = print if dist.is_main else (lambda *a, **k: None)
        result = make_trainer(cfg, data, args.out, resume=args.resume, progress=not args.no_progress,
                              log=log).fit()
        if dist.is_main and result.val_history:
            print(f"final validation loss {result.final_val_loss:.4f} nats; unigram entropy {entropy:.3f} "
                  f"({entropy - result.final_val_loss:+.3f} below it); run in {args.out}")
    finally:
        shutdown(dist)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from plelab.diagnostics.diagnose import diagnose
    from plelab.report.diagnostics import diagnostics_text, plot_diagnostics, plot_run_history, write_json_report

    if args.out:
        from plelab.io import check_folder_target

        check_folder_target(args.out, "--out", "give a writable folder for diagnostics.json and the plots")
    rep = diagnose(args.path, reference=args.reference, null_run=args.null, use=not args.no_use,
                   num_layers=args.num_layers, dim=args.dp, windows=args.windows, progress=not args.no_progress,
                   null_reference=args.null_reference)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(diagnostics_text(rep))
    if args.out:
        from plelab.io import ensure_dir, os_reason

        ensure_dir(args.out, "--out", "give a writable folder for diagnostics.json and the plots")
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="plelab", description="Per-Layer Embeddings lab: models, accounting, training, studies.")
    parser.add_argument("--version", action="version", version=f"plelab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("params", help="exact parameter accounting and FLOPs over dP values")
    _config_args(p)
    p.add_argument("--dp", help="comma-separated dP values, e.g. 0,64,128,256,512 (default: the preset's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("config", help="print the resolved config (preset + overrides) as JSON")
    _config_args(p)
    p.add_argument("--dp", help="dP (ple.dim)")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("presets", help="list the named presets with their parameter counts")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("train", help="train one model: RUN/config.json, metrics.jsonl, checkpoints, summary.json")
    _config_args(p, preset=None)
    p.set_defaults(func=cmd_train)
    p.add_argument("--dp", help="dP (ple.dim)")
    p.add_argument("--steps", type=int, help="optimizer steps (train.steps)")
    p.add_argument("--out", required=True, help="run folder to create (or to continue with --resume)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--data", help="your text: .txt/.md/.jsonl/.parquet file, a folder of them, or a HF datasets folder")
    p.add_argument("--text-field", help="JSONL field / Parquet or datasets column holding the text (default 'text')")
    p.add_argument("--tokenizer", help="use this tokenizer.json instead of training a BPE on the corpus")
    p.add_argument("--ple-table-device", choices=("auto", "cpu"),
                   help="cpu: keep the per-layer table and its optimizer state in host memory (train.table_device)")
    p.add_argument("--table-optimizer", choices=("adamw", "row-sparse"),
                   help="row-sparse: update only the table rows in the batch (train.table_optimizer; default adamw)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")

    p = sub.add_parser("diagnose", help="has a per-layer table learned structure, and is it used? (early verdict)")
    p.add_argument("path", help="a run folder, a checkpoint folder, or a safetensors file/folder with "
                                "embed_tokens_per_layer.weight (HF Gemma 3n / Gemma 4)")
    p.add_argument("--reference", help="the same run with another seed (cross-seed agreement of the change)")
    p.add_argument("--null", help="a matched null run (same config with --set ple.ids=iid): its Δ metrics beside")
    p.add_argument("--null-reference", help="the null run's second seed: their agreement bounds what a real "
                                            "table's cross-seed agreement must exceed")
    p.add_argument("--num-layers", type=int, help="L, for a safetensors table without config.json")
    p.add_argument("--dp", type=int, help="dP, for a safetensors table without config.json")
    p.add_argument("--windows", type=int, default=128, help="validation windows for the use test (default 128)")
    p.add_argument("--no-use", action="store_true", help="skip the use test (no model evaluation)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--out", help="also write diagnostics.json and PNG plots into this folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_diagnose)

    from plelab.train.evaluate import add_eval_parser

    add_eval_parser(sub)
    from plelab.demo import add_demo_parser

    add_demo_parser(sub, _config_args)
    from plelab.sweep.commands import add_sweep_parsers

    add_sweep_parsers(sub, _config_args)
    from plelab.visual.commands import add_visual_parsers

    add_visual_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PlelabError as err:
        print(f"plelab: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("plelab: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # a file-system failure no check above foresaw: still one line, never a traceback
        from plelab.io import os_reason

        where = f" {err.filename}" if err.filename else ""
        print(f"plelab: error: cannot access{where}: {os_reason(err)}; check the path, its permissions and the free "
              "disk space, then rerun (finished work is kept)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``plelab`` command line. Thin: parse arguments, resolve the config, call the package.

User errors (:class:`~plelab.errors.PlelabError` and argparse errors) print one line on
stderr and exit with code 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from plelab import __version__
from plelab.errors import ConfigError, PlelabError


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"plelab: error: {message} (see '{self.prog} --help')\n")


def _config_args(p: argparse.ArgumentParser) -> None:
    from plelab.config import GATE_KINDS, PRESETS

    p.add_argument("--preset", default="cpu-tiny", help=f"named preset: {', '.join(PRESETS)} (default cpu-tiny)")
    p.add_argument("--gate", choices=GATE_KINDS, help="PLE gate variant (default gemma)")
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

    dp = _parse_dp_list(args.dp)[0] if args.dp else None
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

    from plelab.demo import add_demo_parser

    add_demo_parser(sub, _config_args)
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


if __name__ == "__main__":
    sys.exit(main())

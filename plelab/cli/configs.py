"""``plelab params``, ``plelab config``, ``plelab presets``: configs and their exact parameter accounting."""

from __future__ import annotations

import argparse
import json

from plelab.cli.common import config_args, config_settings, dp_list, dp_value
from plelab.config import PRESETS, RunConfig, resolve_run_config
from plelab.config.aux_schema import AUX_KINDS
from plelab.errors import PlelabError
from plelab.model.accounting import account
from plelab.reports.tables import accounting_tables, format_table


def resolved(args: argparse.Namespace, **settings) -> RunConfig:
    """The config the shared options describe (``--preset`` / ``--config`` / ``--set`` / ``--gate`` / ``--seed``),
    with ``settings`` (config key -> value) on top."""
    return resolve_run_config(args.preset, config=args.config, overrides=args.overrides,
                              settings=config_settings(args, **settings))


def aux_list(text: str) -> list[str]:
    """``--aux ple,value,ngram``: kinds of the table family, each once."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in AUX_KINDS]
    if not kinds or unknown or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(f"invalid --aux {text!r}: give distinct kinds from {', '.join(AUX_KINDS)}, "
                                         "comma-separated")
    return kinds


def cmd_params(args: argparse.Namespace) -> int:
    base_cfg = resolved(args)
    kinds = args.aux or ["ple"]
    if "ple" not in kinds and args.dp:
        raise PlelabError("--dp sizes PLE, which --aux leaves out: add ple to --aux (e.g. --aux ple,value), or drop "
                          "--dp")
    rows = []
    for dp in sorted({0, *(args.dp or [base_cfg.ple.dim])}) if "ple" in kinds else [0]:
        cfg = resolved(args, **{"ple.dim": dp, "aux.kind": "ple"})
        rows.append(account(cfg.model, cfg.ple, cfg.train.seq_len, cfg.aux))
    for kind in (k for k in kinds if k != "ple"):
        cfg = resolved(args, **{"ple.dim": 0, "aux.kind": kind})
        rows.append(account(cfg.model, cfg.ple, cfg.train.seq_len, cfg.aux))
    if args.json:
        print(json.dumps({"preset": base_cfg.preset, "rows": [r.to_dict() for r in rows]}, indent=2))
    else:
        m = base_cfg.model
        vp = base_cfg.ple.resolved_vocab_size(m)
        shape = (f"H={m.hidden_size}, L={m.num_hidden_layers}, V={m.vocab_size:,}, Vp={vp:,}, "
                 f"gate={base_cfg.ple.gate}")
        print(accounting_tables(base_cfg.preset, rows, shape))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    print(json.dumps(resolved(args, **{"ple.dim": args.dp}).to_dict(), indent=2))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    rows = []
    for name, make in PRESETS.items():
        cfg = make()
        m = cfg.model
        a = account(m, cfg.ple, cfg.train.seq_len, cfg.aux)
        rows.append([name, m.hidden_size, m.num_hidden_layers, f"{m.num_attention_heads}/{m.num_key_value_heads}",
                     f"{m.vocab_size:,}", cfg.ple.dim, f"{a.base:,}", f"{a.total:,}"])
    print(format_table(["preset", "H", "L", "heads q/kv", "V", "dP", "base params", "total params"], rows))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("params", help="exact parameter accounting and FLOPs over dP values")
    config_args(p, seed=False)  # counts and FLOPs do not depend on the seed: --seed would be accepted without effect
    p.add_argument("--dp", type=dp_list, help="comma-separated dP values, e.g. 0,64,128,256,512 (default: the "
                                              "preset's)")
    p.add_argument("--aux", type=aux_list, help="comma-separated kinds of the table family to count beside the "
                                                "trunk: ple (the --dp rows), value, ngram, modulation (default: ple; "
                                                "their sizes: --set aux.*)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("config", help="print the resolved config (preset or --config, --set, flags) as JSON")
    config_args(p)
    p.add_argument("--dp", type=dp_value, help="dP (ple.dim)")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("presets", help="list the named presets with their parameter counts")
    p.set_defaults(func=cmd_presets)

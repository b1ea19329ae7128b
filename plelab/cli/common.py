"""What the verbs share: the one-line-error parser, the config options, and the argparse types of list flags.

Every list-valued or dP flag converts through :func:`plelab.config.parse_numbers` (one parser, one
spelling: ``--dp`` is a comma list where several values make sense, one integer elsewhere). A type that
fails raises :class:`~plelab.errors.ConfigError`, which argparse lets through to :func:`plelab.cli.main`
(one line, exit 2).
"""

from __future__ import annotations

import argparse

from plelab.config import GATE_KINDS, PRESETS, parse_numbers
from plelab.errors import ConfigError

# Spellings users reach for (and other tools use) -> plelab's; an unrecognised one gets a one-line hint.
OLD_SPELLINGS = {"--dim": "--dp", "--dims": "--dp", "--ple-dim": "--dp", "--ple_dim": "--dp", "--dP": "--dp",
                 "--d-p": "--dp", "--hidden-size-per-layer-input": "--dp"}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage dump), and a hint for the old spellings of a flag."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments: "):
            for token in message.removeprefix("unrecognized arguments: ").split():
                name = token.split("=", 1)[0]
                if name in OLD_SPELLINGS:
                    new = OLD_SPELLINGS[name]
                    message = (f"{name} is spelled {new} (dP, the config key ple.dim): {new} 64, or a comma list "
                               f"where several dP make sense ({new} 0,64,128 for plelab params and plelab sweep)")
                    break
        self.exit(2, f"plelab: error: {message} (see '{self.prog} --help')\n")


def dp_list(text: str) -> list[int]:
    """``--dp 0,64,128`` where a verb takes several dP."""
    return parse_numbers(text, "--dp", example="0,64,128")


def dp_value(text: str) -> int:
    """``--dp 64`` where a verb takes one dP."""
    return parse_numbers(text, "--dp", one=True, example="64", note="plelab params and plelab sweep take several dP")


def int_list(flag: str, example: str):
    """The argparse type of a comma list of integers such as ``--seed-list``."""
    return lambda text: parse_numbers(text, flag, example=example)


def float_list(flag: str, example: str):
    """The argparse type of a comma list of numbers such as ``--lr-mults``."""
    return lambda text: parse_numbers(text, flag, item=float, example=example)


def one_int(flag: str, example: str):
    """The argparse type of one integer flag that shares the dP parser (``--control-dp``)."""
    return lambda text: parse_numbers(text, flag, one=True, example=example)


def names(flag: str):
    """The argparse type of a comma list of names (``--methods none,oracle``)."""
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise ConfigError(f"invalid {flag} {text!r}: give names separated by commas")
        return items
    return parse


def config_args(p: argparse.ArgumentParser, preset: str = "cpu-tiny", seed: bool = True, gate: bool = True) -> None:
    """``--preset``, ``--config``, (``--gate``,) (``--seed``,) ``--set``: how every verb that resolves a config gets
    one (:func:`plelab.config.resolve_run_config`)."""
    p.add_argument("--preset", help=f"named preset: {', '.join(PRESETS)} (default {preset}; the one --config names; "
                                    "when resuming, the run's own)")
    p.add_argument("--config", metavar="FILE", help="a JSON or TOML config file (a run's config.json, or any subset "
                                                    "of its keys) as the base; --set and the flags apply on top")
    if gate:
        p.add_argument("--gate", choices=GATE_KINDS, help="PLE gate variant (default gemma)")
    if seed:
        p.add_argument("--seed", type=int, help="run seed (default 0)")
    add_set(p)


def add_set(p: argparse.ArgumentParser, what: str = "any config field") -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help=f"override {what}, e.g. --set model.hidden_size=128 (repeatable)")


def trunk_args(p: argparse.ArgumentParser) -> None:
    """``--hf-config`` / ``--model``: the trunk PLE is added to, when it is not plelab's decoder
    (:mod:`plelab.training.hosts`)."""
    p.add_argument("--hf-config", metavar="PATH",
                   help="train an HF decoder built by transformers from this config.json (or its folder), PLE "
                        "attached per run (model.hf_config)")
    p.add_argument("--model", metavar="MODULE:FUNCTION", help="train your own PyTorch model: FUNCTION(cfg) builds it "
                                                              "per run (model.factory; the protocol: docs)")


def trunk_settings(args: argparse.Namespace) -> dict:
    """The config keys ``--hf-config`` / ``--model`` set (``None``: not given)."""
    return {"model.hf_config": getattr(args, "hf_config", None), "model.factory": getattr(args, "model", None)}


def config_settings(args: argparse.Namespace, **more) -> dict:
    """The config keys the shared flags set (``None``: not given), plus ``more``."""
    return {"ple.gate": getattr(args, "gate", None), "seed": getattr(args, "seed", None), **more}

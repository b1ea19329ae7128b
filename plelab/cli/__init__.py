"""The ``plelab`` command line. Thin: parse arguments, call the package's library functions, print.

One module per verb group (:mod:`~plelab.cli.configs`: params / config / presets;
:mod:`~plelab.cli.data`: ingest;
:mod:`~plelab.cli.train`: train / eval / diagnose; :mod:`~plelab.cli.models`: export / generate;
:mod:`~plelab.cli.sweep`: sweep / report / advise / demo; :mod:`~plelab.cli.visual`: visual-ids / visual-study;
:mod:`~plelab.cli.calibrate`: calibrate);
nothing below this package imports argparse. :func:`main` imports only the module of the verb it runs
(:data:`VERBS`): a sweep's ``plelab train`` worker starts without the statistics, report and visual wings (about a
second sooner on a 2-core machine); ``plelab --help`` and an unknown verb import them all. Elsewhere imports are at
module level (the layering test, ``tests/test_layers.py``); only optional or heavy dependencies (transformers,
matplotlib, ...) load when a command needs them.

User errors (:class:`~plelab.errors.PlelabError` and argparse errors) print one line on
stderr and exit with code 2; they never show a traceback. A closed pipe (``plelab config | head -1``)
ends the output quietly with exit code 0.
"""

from __future__ import annotations

import importlib
import os
import select
import sys

from plelab import _PLUGINS, __version__  # trunks and attached-folder loaders, as for the API
from plelab.cli.common import Parser
from plelab.errors import PlelabError
from plelab.io import os_reason

__all__ = ["VERBS", "build_parser", "main"]

# each verb's group: a module of plelab.cli with add_parsers(sub), listed in help's order (tests/test_cli.py checks
# the table against what the groups register)
VERBS = {
    "params": "configs", "config": "configs", "presets": "configs", "ingest": "data",
    "train": "train", "eval": "train", "diagnose": "train", "export": "models", "generate": "models",
    "consolidate": "models", "sweep": "sweep", "lr-search": "sweep", "report": "sweep", "advise": "sweep",
    "plan": "sweep", "fit": "sweep", "pack": "sweep", "demo": "sweep", "visual-ids": "visual",
    "visual-study": "visual", "calibrate": "calibrate", "validate": "calibrate",
}
GROUPS = tuple(dict.fromkeys(VERBS.values()))


def build_parser(verb: str | None = None) -> Parser:
    """The parser of every verb, or of ``verb``'s group only (its module alone imported)."""
    parser = Parser(prog="plelab", description="Per-Layer Embeddings lab: models, accounting, training, studies.")
    parser.add_argument("--version", action="version", version=f"plelab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in [VERBS[verb]] if verb in VERBS else GROUPS:
        importlib.import_module(f"plelab.cli.{group}").add_parsers(sub)
    return parser


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``| head``): its write end then polls as an error."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file descriptor
        return False
    if not hasattr(select, "poll"):  # no poll() (Windows): a broken pipe on stdout is the likely one
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def _os_error(err: OSError) -> int:
    """A file-system failure no check foresaw: still one line, never a traceback. Writers name their file
    (:func:`plelab.io.naming`); one the operating system left nameless still says where to look."""
    if err.filename:
        where = f"{err.filename} (or {err.filename2})" if err.filename2 else f"{err.filename}"
        print(f"plelab: error: cannot access {where}: {os_reason(err)}; check the path, its permissions and the "
              "free disk space, then rerun (finished work is kept)", file=sys.stderr)
    else:
        print(f"plelab: error: a file read or write failed: {os_reason(err)} (the system named no file); check the "
              "free disk space and the permissions of the output folder and of the cache ($PLELAB_CACHE), then "
              "rerun (finished work is kept)", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        for plugin in _PLUGINS:
            importlib.import_module(plugin)
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError as err:
        if not _stdout_closed():
            return _os_error(err)
        # the reader has gone: what is left goes nowhere (the Python docs' recipe), the output ends quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except PlelabError as err:
        print(f"plelab: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("plelab: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        return _os_error(err)

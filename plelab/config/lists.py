"""The one parser of number lists on the command line (``--dp 0,64,128``, ``--seed-list 0,2``, ``--lambdas``).

A flag that takes a list and a flag that takes one value go through the same function, so that
``--dp`` is spelled, typed and checked the same in every verb. Ranges are the config's business
(``ple.dim`` must be >= 0 is checked where the value becomes ``ple.dim``), not the parser's.
"""

from __future__ import annotations

from plelab.errors import ConfigError


def parse_numbers(text: str, flag: str, *, item: type = int, one: bool = False, example: str = "0,64,128",
                  note: str = "") -> list | int | float:
    """``"0,64,128"`` -> ``[0, 64, 128]`` (``item`` each: int or float); with ``one``, exactly one value, returned
    bare. Anything else is a one-line :class:`ConfigError` naming ``flag``, with ``example`` (and ``note``)."""
    kind = "integer" if item is int else "number"
    hint = (f"give one {kind}, e.g. {flag} {example}" if one else
            f"give {kind}s separated by commas, e.g. {flag} {example}") + (f" ({note})" if note else "")
    try:
        values = [item(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"invalid {flag} {text!r}: {hint}") from None
    if not values or (one and len(values) != 1):
        raise ConfigError(f"invalid {flag} {text!r}: {hint}")
    return values[0] if one else values

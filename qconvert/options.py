"""Options as dataclass fields, given as text or as values: the one parser passes and backends share.

A pass (`lower-quant-ops{rounding=...}`) and a backend (`--form integer`) both declare their options as
the fields of a frozen dataclass; `options_from_text` turns a mapping of option names (dashes or
underscores) to text into field values by each field's type, or keeps a value that is already typed
(a Python caller's `fuse_arithmetic=True`). Choices and help live in the field's metadata (`option`),
and `check_choice` is the one spelling of "not one of the choices".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError

HELP = "help"
CHOICES = "choices"


def option(default: Any, help: str, choices: Iterable[str] = ()) -> Any:
    """A dataclass field for an option: its default, one line of help and, for a word, its choices."""
    return dataclasses.field(default=default, metadata={HELP: help, CHOICES: tuple(choices)})


def option_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The option fields of a dataclass, by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def flag(name: str) -> str:
    """`fuse_arithmetic` -> `--fuse-arithmetic`, the option as the command line spells it."""
    return "--" + name.replace("_", "-")


def check_choice(option_flag: str, value: str, choices: Iterable[str]) -> str:
    """`value` when it is one of `choices`, else InputError naming the option and the choices."""
    allowed = tuple(choices)
    if value not in allowed:
        suggestion = did_you_mean(value, allowed)
        raise InputError(f"unknown {option_flag} '{value}'; available: {', '.join(allowed)}{suggestion}")
    return value


def options_from_text(cls: type, options: Mapping[str, object], owner: str) -> dict[str, Any]:
    """Field values of dataclass `cls` from `options` (text converted by the field's default's type;
    anything else kept as given). `owner` names who takes them in errors (`pass 'inline'`)."""
    fields = option_fields(cls)
    values: dict[str, Any] = {}
    for key, given in options.items():
        field_name = key.replace("-", "_")
        if field_name not in fields:
            raise InputError(f"{owner} has no option '{key}' (options: {', '.join(fields) or 'none'})")
        if not isinstance(given, str):
            values[field_name] = given
            continue
        default = fields[field_name].default
        try:
            if isinstance(default, bool):  # a unit option (`canonicalize{test-convergence}`) means true
                values[field_name] = parse_bool_option(given)
            else:
                values[field_name] = type(default)(given) if default is not dataclasses.MISSING else given
        except ValueError as error:
            raise InputError(f"{owner}: bad value '{given}' for option '{key}': {error}") from None
    return values


def parse_bool_option(text: str) -> bool:
    """An MLIR boolean pass option: empty (given without a value), true/false, 1/0."""
    lowered = text.lower()
    if lowered in ("", "true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError("expected true or false")

"""How `qconvert`'s help reads: verbs in workflow order, flags shown as flags, examples at each verb's foot.

The typer group of qconvert/cli.py uses `WorkflowGroup`: every verb (whoever added it) is listed in the
order a user runs them, an unknown verb gets "did you mean", and each verb's options are shown the same
way (a boolean as `--per-channel`, not `--per-channel <bool>`; `-h` beside `--help`).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import typer
from typer.core import TyperGroup

from qconvert.did_you_mean import closest

WORKFLOW_ORDER = ("inspect", "calibrate", "check", "convert", "import", "opt", "report", "run")
HELP_OPTION_NAMES = ["-h", "--help"]

# Two or three command lines at the foot of each verb's help (the sample model ships in models/).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "inspect": (
        "qconvert inspect models/digits_cnn.qdq.onnx",
        "qconvert inspect model.onnx --input-shape input_ids=1x128 --json -",
    ),
    "calibrate": (
        "qconvert calibrate models/digits_cnn.onnx --data models/digits_cnn.inputs.npz -o digits.qdq.onnx",
        "qconvert calibrate m.onnx --data samples/ --target-cosine 0.99 --json r.json -o q.onnx",
        "qconvert calibrate model.onnx --data samples/ --executor ray --workers 8 --ranges ranges.json",
    ),
    "check": (
        "qconvert check models/digits_cnn.qdq.onnx --data models/digits_cnn.inputs.npz",
        "qconvert check model.qdq.onnx --data samples/ --backend stablehlo --engine xla --json report.json",
        "qconvert check digits.storage.onnx --against models/digits_cnn.qdq.onnx",
    ),
    "convert": (
        "qconvert convert models/digits_cnn.qdq.onnx --to stablehlo -o digits.mlir",
        "qconvert convert model.qdq.onnx --to stablehlo --form integer --json summary.json -o model.mlir",
        "qconvert convert models/digits_cnn.qdq.onnx --to onnx-storage -o digits.storage.onnx",
    ),
    "import": (
        "qconvert import models/digits_cnn.qdq.onnx -o digits.mlir",
        "qconvert import model.onnx --ranges ranges.json --elide-weights | less",
    ),
    "opt": (
        "qconvert opt digits.mlir --lower-quant-ops=rounding=onnx -o lowered.mlir",
        "qconvert opt samples/quant_casts.mlir --split-input-file --normalize-quant-types",
    ),
    "report": (
        "qconvert report result.json -o report.html",
        "qconvert check model.qdq.onnx --data samples/ --json check.json && qconvert report check.json",
    ),
    "run": (
        "qconvert run digits.mlir --data models/digits_cnn.inputs.npz -o outputs.npz",
        "qconvert run digits.mlir --data samples/ --engine interpreter --json -",
        "qconvert run digits.storage.onnx --data models/digits_cnn.inputs.npz -o outputs.npz",
    ),
}


def version() -> str:
    """The installed distribution's version (the source tree's pyproject version when run from it)."""
    try:
        return metadata.version("qconvert")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def examples_epilog(verb: str) -> str | None:
    """`Examples:` and one command per line, kept as lines by typer's rich help (a `\\b` paragraph)."""
    lines = EXAMPLES.get(verb)
    if not lines:
        return None
    return "\b\nExamples:\n" + "\n".join(f"  $ {line}" for line in lines)


METAVARS = {int: "N", float: "X"}


def _flags_as_flags(parameters: list[Any]) -> None:
    """A flag shows no value (typer would print `<bool>`); an option's value is named (`--data DATA`,
    `--workers N`), not typed (`<str>`, `<list[str]>`)."""
    for parameter in parameters:
        if (
            parameter is None
            or parameter.metavar is not None
            or getattr(parameter, "param_type_name", "") != "option"
        ):
            continue
        if getattr(parameter, "is_flag", False):
            parameter.metavar = ""
            continue
        annotation = getattr(getattr(parameter, "type_descriptor", None), "annotation", None)
        name = (parameter.name or "").removesuffix("_path")
        parameter.metavar = METAVARS.get(
            annotation, "PATH" if name in ("json", "out", "output") else name.upper()
        )  # type: ignore[arg-type]


def _plain_defaults(parameters: list[Any]) -> None:
    """`[default: minmax]`, not click's `[default: (minmax)]`: an option whose default is None (so the code
    can tell it was not given) names its effective default as text, which reads as a value, as others do."""
    for parameter in parameters:
        text = getattr(parameter, "show_default", None)
        if isinstance(text, str) and hasattr(parameter, "_get_default_string"):
            parameter._get_default_string = lambda *_, _text=text, **__: _text


def _first_sentence(text: str) -> str:
    """The verb's line in `qconvert -h`: its help's first sentence, on one line."""
    flat = " ".join(text.split("\n\n")[0].split())
    sentence, period, _ = flat.partition(". ")
    return sentence + ("." if period else "")


def _tidy(command: Any, verb: str, ctx: Any) -> None:
    """Show booleans as flags, name the examples; once per command (typer builds them per run)."""
    if getattr(command, "_qconvert_tidied", False):
        return
    _flags_as_flags([*getattr(command, "params", []), command.get_help_option(ctx)])
    _plain_defaults(getattr(command, "params", []))
    if getattr(command, "epilog", None) is None:
        command.epilog = examples_epilog(verb)
    if getattr(command, "short_help", None) is None and getattr(command, "help", None):
        command.short_help = _first_sentence(command.help)
    command._qconvert_tidied = True


class NoSuchCommand(typer.BadParameter):
    """A misspelled verb, worded as click's own ("No such command ..."), not "Invalid value: ..." (exit 2)."""

    def format_message(self) -> str:
        return self.message


class WorkflowGroup(TyperGroup):
    """qconvert's verbs in workflow order, each tidied, with "did you mean" for a misspelled verb."""

    def get_help_option(self, ctx: Any) -> Any:
        _flags_as_flags([*self.params, super().get_help_option(ctx)])
        return super().get_help_option(ctx)

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        known = {name: index for index, name in enumerate(WORKFLOW_ORDER)}
        return sorted(names, key=lambda name: (known.get(name, len(known)), names.index(name)))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _tidy(command, cmd_name, ctx)
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if args and not name.startswith("-") and super().get_command(ctx, name) is None:
            match = closest(name, self.list_commands(ctx))
            hint = f" Did you mean '{match}'?" if match else ""
            raise NoSuchCommand(
                f"No such command '{name}'.{hint} (commands: {', '.join(self.list_commands(ctx))})", ctx
            )
        return super().resolve_command(ctx, args)

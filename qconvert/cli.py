"""The `qconvert` command line: one typer app, each verb a thin layer over a public function."""

from __future__ import annotations

import gc
import sys

import typer

from qconvert import opt as opt_command
from qconvert.errors import QConvertError

INTERNAL_ERROR = 3

app = typer.Typer(
    name="qconvert",
    help="Convert quantized ONNX models through MLIR's quant dialect, and check every number.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command(
    "opt",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
)
def opt(context: typer.Context) -> None:
    """mlir-opt for the quant dialect: FILE [-o OUT] [--split-input-file] [--verify-diagnostics] [PASSES]."""
    raise typer.Exit(opt_command.main(context.args))


@app.callback()
def callback() -> None:
    """qconvert: quantized ONNX -> quant-dialect IR -> StableHLO / TOSA / AscendC / storage ONNX."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `qconvert` console script: the exit code, never a traceback."""
    arguments = sys.argv[1:] if argv is None else argv
    try:
        if arguments and arguments[0] == "opt":
            # mlir-opt's single-dash long flags (-split-input-file) must reach our own parser untouched.
            code = opt_command.main(arguments[1:])
            if argv is None:
                # The process exits next (console script, `python -m qconvert`): leave the IR's objects
                # to the OS rather than have the collector walk and free them at shutdown (~0.5 s per
                # 100k ops). Callers that pass `argv` (tests, other Python code) keep a normal collector.
                gc.freeze()
            return code
        app(arguments, prog_name="qconvert")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 0
    except QConvertError as error:
        print(f"qconvert: {error}", file=sys.stderr)
        return error.exit_code
    except Exception as error:  # a bug of ours: say so in one line, with what to report
        print(
            f"qconvert: internal error: {type(error).__name__}: {error} (please report this)", file=sys.stderr
        )
        return INTERNAL_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())

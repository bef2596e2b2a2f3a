"""The `qconvert` command line: one typer app, each verb a thin layer over a public function."""

from __future__ import annotations

import sys

import typer

from qconvert import opt as opt_command

app = typer.Typer(
    name="qconvert",
    help="Convert quantized ONNX models through MLIR's quant dialect, and check every number.",
    no_args_is_help=True,
    add_completion=False,
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
    """Entry point of the `qconvert` console script."""
    arguments = sys.argv[1:] if argv is None else argv
    if arguments and arguments[0] == "opt":
        # mlir-opt's single-dash long flags (-split-input-file) must reach our own parser untouched.
        return opt_command.main(arguments[1:])
    try:
        app(arguments, standalone_mode=False)
    except typer.Exit as exit_:
        return exit_.exit_code
    except Exception as error:  # click's usage errors
        import click

        if isinstance(error, click.ClickException):
            error.show()
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

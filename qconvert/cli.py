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


def _parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """`["x=1x128", "mask=1x128"]` -> `{"x": (1, 128), "mask": (1, 128)}`; InputError when malformed."""
    from qconvert.errors import InputError

    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, _, dims = spec.rpartition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            name = ""
        if not name:
            raise InputError(f"--input-shape '{spec}': expected NAME=D0xD1x... (e.g. x=1x128)")
    return shapes


@app.command("import")
def import_command(
    model: str = typer.Argument(..., help="ONNX model file (external data next to it)"),
    output: str = typer.Option("-", "-o", "--output", help="output .mlir file ('-' for stdout)"),
    elide_weights: bool = typer.Option(
        False, "--elide-weights", help="print weights as dense_resource<__elided__> (no data)"
    ),
    resource_threshold: int = typer.Option(
        64,
        "--resource-threshold",
        help="weights of at least this many elements print as dense_resource blobs (0: all inline)",
    ),
    input_shape: list[str] = typer.Option([], "--input-shape", help="NAME=1x128, fixes dynamic dims"),  # noqa: B008
) -> None:
    """Lift an ONNX model into the quant-dialect IR and write its text, weights as `dense_resource`
    blobs (parse it with `qconvert opt --allow-unregistered-dialect`)."""
    import os
    import tempfile

    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx
    from qconvert.frontends.onnx.summary import elide_weights as elide
    from qconvert.ir.printer import write_module

    if resource_threshold < 0:
        raise InputError(f"--resource-threshold {resource_threshold}: expected 0 or more elements")
    module = import_onnx(model, _parse_input_shapes(input_shape), resource_threshold=resource_threshold)
    if elide_weights:
        elide(module)
    if output == "-":
        write_module(module, sys.stdout)
        return
    folder = os.path.dirname(os.path.abspath(output))
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as f:
        try:
            write_module(module, f)  # streamed: each weight is read only while it is written
        except BaseException:
            f.close()
            os.unlink(f.name)
            raise
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # a temporary file is 0600; the output gets the usual mode
    os.replace(f.name, output)  # no partial output file on failure


@app.command("convert")
def convert_command(
    model: str = typer.Argument(..., help="ONNX model file (external data next to it)"),
    to: str = typer.Option("stablehlo", "--to", help="target: stablehlo"),
    form: str = typer.Option("quantized", "--form", help="stablehlo: quantized, integer or qdq"),
    semantics: str = typer.Option("onnx", "--semantics", help="quantize rounding: onnx (exact) or stablehlo"),
    output: str = typer.Option("-", "-o", "--output", help="output .mlir file ('-' for stdout)"),
    input_shape: list[str] = typer.Option([], "--input-shape", help="NAME=1x128, fixes dynamic dims"),  # noqa: B008
    elide_weights: bool = typer.Option(False, "--elide-weights", help="weights as dense_resource<...>"),
    inline_weights: bool = typer.Option(
        False, "--inline-weights", help='weights inline as dense<"0x..."> (XLA refuses dense_resource)'
    ),
) -> None:
    """Convert an ONNX model to StableHLO MLIR text; every op that cannot be lowered is listed (exit 2)."""
    from qconvert.convert import convert, write

    module = convert(
        model,
        to=to,
        form=form,
        semantics=semantics,
        input_shapes=_parse_input_shapes(input_shape),
        elide_weights=elide_weights,
        inline_weights=inline_weights,
    )
    write(module, sys.stdout if output == "-" else output)


@app.command("inspect")
def inspect_command(
    model: str = typer.Argument(..., help="ONNX model file"),
    input_shape: list[str] = typer.Option([], "--input-shape", help="NAME=1x128, fixes dynamic dims"),  # noqa: B008
) -> None:
    """Summarize an ONNX model as lifted: ops, quantized tensors by scheme, storage types."""
    from qconvert.frontends.onnx import import_onnx
    from qconvert.frontends.onnx.summary import summarize

    summary = summarize(import_onnx(model, _parse_input_shapes(input_shape)))
    typer.echo("\n".join(summary.lines()))


@app.command("check")
def check_command(
    model: str = typer.Argument(..., help="ONNX model file (float, QDQ or QOperator)"),
    data: str | None = typer.Option(None, "--data", help="INPUTS.npz: one array per graph input, by name"),
    backend: str = typer.Option("interpreter", "--backend", help="engine that runs the lifted IR"),
    json_path: str | None = typer.Option(None, "--json", help="write the report as JSON to this path"),
    atol: float | None = typer.Option(None, "--atol", help="end to end: |ours - ref| <= atol + rtol |ref|"),
    rtol: float | None = typer.Option(None, "--rtol", help="end to end: relative tolerance (with --atol)"),
    max_lsb: float | None = typer.Option(None, "--max-lsb", help="end to end: max difference in steps"),
    max_mismatch_fraction: float | None = typer.Option(
        None, "--max-mismatch-fraction", help="end to end: max fraction of differing elements"
    ),
    min_sqnr: float | None = typer.Option(None, "--min-sqnr", help="end to end: minimum SQNR in dB"),
    input_shape: list[str] = typer.Option([], "--input-shape", help="NAME=1x128, fixes dynamic dims"),  # noqa: B008
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar; the verdict line only"),
) -> None:
    """Check MODEL against onnxruntime: every quantization node bit-exact, outputs beside the noise floor.

    Exit 0 when every check passes, 1 when a comparison fails, 2 on bad input."""
    from qconvert.check import Tolerances, check
    from qconvert.check_render import render

    tolerances = Tolerances(
        atol=atol, rtol=rtol, max_lsb=max_lsb, max_mismatch_fraction=max_mismatch_fraction, min_sqnr=min_sqnr
    )
    report = check(
        model,
        data,
        backend=backend,
        tolerances=tolerances,
        input_shapes=_parse_input_shapes(input_shape),
        show_progress=not quiet,
    )
    if json_path is not None:
        report.write_json(json_path)
    render(report, summary_only=quiet)
    raise typer.Exit(0 if report.passed else 1)


if __name__ == "__main__":
    sys.exit(main())

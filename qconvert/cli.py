"""The `qconvert` command line: one typer app, each verb a thin layer over a public function."""

from __future__ import annotations

import contextlib
import gc
import sys

import typer

from qconvert import opt as opt_command
from qconvert.backends import REGISTRY, option_help
from qconvert.cli_help import HELP_OPTION_NAMES, WorkflowGroup
from qconvert.errors import QConvertError

INTERNAL_ERROR = 3

app = typer.Typer(
    name="qconvert",
    help="Convert quantized ONNX models through MLIR's quant dialect, and check every number.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=WorkflowGroup,  # verbs in workflow order, flags shown as flags, examples at each verb's foot
    context_settings={"help_option_names": HELP_OPTION_NAMES},
)


@app.command(
    "opt",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
)
def opt(context: typer.Context) -> None:
    """mlir-opt for the quant dialect: FILE [-o OUT] [--split-input-file] [--verify-diagnostics] [PASSES]."""
    raise typer.Exit(opt_command.main(context.args))


def _print_version(given: bool) -> None:
    if given:
        from qconvert.cli_help import version

        typer.echo(f"qconvert {version()}")
        raise typer.Exit(0)


@app.callback()
def callback(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="print the version and exit"
    ),
) -> None:
    """qconvert: quantized ONNX -> quant-dialect IR -> StableHLO / TOSA / AscendC / storage ONNX."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `qconvert` console script: the exit code, never a traceback.

    SIGTERM takes Ctrl-C's path: its handler raises `Terminated`, so worker processes and temporary files
    are cleaned up before the exit (128 + 15); a second SIGTERM during that cleanup ends the process."""
    import signal
    import threading

    from qconvert.errors import Terminated

    arguments = sys.argv[1:] if argv is None else argv

    def terminate(signal_number: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, previous_handler)
        raise Terminated()

    previous_handler = signal.getsignal(signal.SIGTERM) or signal.SIG_DFL  # None: set outside Python
    on_main_thread = threading.current_thread() is threading.main_thread()  # where handlers may be set
    if on_main_thread and previous_handler is not signal.SIG_IGN:  # an inherited "ignore" stays, as SIGINT's
        signal.signal(signal.SIGTERM, terminate)
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
    except Terminated:
        print("qconvert: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except QConvertError as error:
        print(f"qconvert: {error}", file=sys.stderr)
        return error.exit_code
    except Exception as error:  # a bug of ours: say so in one line, with what to report
        print(
            f"qconvert: internal error: {type(error).__name__}: {error} (please report this)", file=sys.stderr
        )
        return INTERNAL_ERROR
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    return 0


def _targets_help() -> str:
    """`--to`'s help, from the backend registry: `target: stablehlo (StableHLO MLIR text), onnx (...)`."""
    return "target: " + ", ".join(f"{backend.name} ({backend.summary})" for backend in REGISTRY)


def _engines_help() -> str:
    """`check --engine`'s help, from the registry: `stablehlo: interpreter | xla (default xla)`."""
    return "; ".join(
        f"{backend.name}: {' | '.join(backend.engines)} (default {backend.default_engine})"
        for backend in REGISTRY
        if backend.engines
    )


def _check_backends_help() -> str:
    """`check --backend`'s help: the interpreter, and every registered backend with engines."""
    runners = [backend.name for backend in REGISTRY if backend.engines]
    return "interpreter (the lifted IR, default) or " + " / ".join(runners)


INPUT_SHAPE_HELP = "NAME=1x128, fixes dynamic dims (repeat, or NAME=..,NAME=..)"
SENTINEL_HELP = "NAME=keep|clip|quantize (repeat, or commas)"
BACKEND_OPTION_HELP = (
    "NAME=VALUE: any option of the backend, flag or not (e.g. form=integer); repeat, or NAME=V,NAME=V"
)


def _backend_options(specs: list[str], flags: dict[str, object]) -> dict[str, object]:
    """`--backend-option form=integer` and the options' own flags, by field name (the backend parses the
    text); InputError when malformed or when one option is given both ways."""
    from qconvert.backends import given_options
    from qconvert.errors import InputError

    options: dict[str, object] = dict(given_options(flags))
    for spec in _named_values(specs):
        name, equals, value = spec.partition("=")
        key = name.strip().replace("-", "_")
        if not equals or not key:
            raise InputError(f"--backend-option '{spec}': expected NAME=VALUE (e.g. form=integer)")
        if key in options:
            raise InputError(f"--backend-option '{spec}': {key} is already given")
        options[key] = value
    return options


def _one_of_two(name: str, value: str | None, old_name: str, old_value: str | None) -> str | None:
    """The value of a flag given by its name or by its old spelling (a hidden alias); both: InputError."""
    from qconvert.errors import InputError

    if value is not None and old_value is not None:
        raise InputError(f"{name} and {old_name} (its old spelling) are the same option; give one")
    return value if value is not None else old_value


def _json_or_output(json_path: str | None, output: str | None) -> str | None:
    """check's -o/--output is its --json (the JSON report is what check writes, as -o is each verb's
    artifact); given both: InputError."""
    from qconvert.errors import InputError

    if json_path is not None and output is not None:
        raise InputError("--json and -o/--output both name check's JSON report; give one")
    return json_path if json_path is not None else output


def _named_values(specs: list[str]) -> list[str]:
    """`--input-shape x=1x128,mask=1,128` as two: repetition and commas both list values; a comma splits
    only before the next NAME= (dims may be comma-separated)."""
    import re

    return [part for spec in specs for part in re.split(r",(?=[^,=]+=)", spec) if part]


def _parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """`["x=1x128", "mask=1,128"]` -> `{"x": (1, 128), "mask": (1, 128)}` (dims split by x or a comma; an
    empty shape is a scalar); InputError when malformed or a name is given twice."""
    import re

    from qconvert.errors import InputError

    shapes: dict[str, tuple[int, ...]] = {}
    for spec in _named_values(specs):
        name, _, dims = spec.rpartition("=")
        try:
            shape = tuple(int(d) for d in re.split(r"[x,]", dims)) if dims else ()
        except ValueError:
            name = ""
        if not name or any(d < 0 for d in shape):
            raise InputError(f"--input-shape '{spec}': expected NAME=D0xD1x... (e.g. x=1x128 or x=1,128)")
        if name in shapes and shapes[name] != shape:
            raise InputError(f"--input-shape gives '{name}' twice: {list(shapes[name])} and {list(shape)}")
        shapes[name] = shape
    return shapes


WRITE_JSON_HELP = "write a summary (ops, ops on quantized types, notes, outputs) as JSON here ('-': stdout)"


def _check_json_output(json_path: str | None, output: str, model: str) -> None:
    """`--json` is a writable path, and not stdout when the artifact goes there too."""
    from qconvert.errors import InputError

    _check_output(json_path, model, "--json")
    if json_path == "-" and output == "-":
        raise InputError("--json - and the output on stdout: give -o PATH or --json PATH (one stdout)")


def _report_written(
    verb: str, target: str, artifact: object, outputs: list[str], json_path: str | None, quiet: bool
) -> None:
    """After a verb wrote its artifact: the artifact's notes and a one-line summary on stderr, `--json`."""
    from qconvert.cli_summary import summarize_artifact

    summary = summarize_artifact(verb, target, artifact, outputs)
    if json_path is not None:
        summary.write_json(json_path)
    for line in summary.notes:  # the artifact's own summary (onnx-storage: what was stripped, and why)
        typer.echo(line, err=True)
    if not quiet:
        typer.echo(summary.line(), err=True)


def _check_output(output: str | None, model: str, option: str = "-o") -> None:
    """Refuse an output that cannot be written (no such folder, a folder, the model itself) before work."""
    from qconvert.calibrate.outputs import check_output_paths

    if output is not None and output != "-":
        check_output_paths({option: output}, {"MODEL": model})


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
    input_shape: list[str] = typer.Option([], "--input-shape", help=INPUT_SHAPE_HELP),  # noqa: B008
    ranges: str | None = typer.Option(
        None,
        "--ranges",
        help="a `qconvert calibrate --ranges` JSON: each observed value gets its !quant.calibrated range",
    ),
    json_path: str | None = typer.Option(None, "--json", help=WRITE_JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no summary line on stderr (warnings only)"),
) -> None:
    """Lift an ONNX model into the quant-dialect IR and write its text, weights as `dense_resource`
    blobs (parse it with `qconvert opt --allow-unregistered-dialect`)."""

    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx
    from qconvert.frontends.onnx.summary import elide_weights as elide
    from qconvert.ir.printer import write_module_to

    if resource_threshold < 0:
        raise InputError(f"--resource-threshold {resource_threshold}: expected 0 or more elements")
    _check_output(output, model)
    _check_json_output(json_path, output, model)
    from qconvert.stdout_console import phase

    with phase(f"lifting {model}", not quiet):
        module = import_onnx(model, _parse_input_shapes(input_shape), resource_threshold=resource_threshold)
    if ranges is not None:
        from qconvert.calibrate.attach import attach_ranges
        from qconvert.calibrate.ranges import CalibrationRanges

        loaded = CalibrationRanges.load(ranges)
        unmatched = attach_ranges(module, loaded, model)
        if unmatched and len(unmatched) == len(loaded.ranges):
            raise InputError(
                f"{ranges}: none of its {len(unmatched)} ranges names a float tensor of {model} "
                f"(the ranges of another model?)"
            )
        if unmatched:
            listed = ", ".join(unmatched[:5]) + (" ..." if len(unmatched) > 5 else "")
            warning = f"{ranges}: no float tensor for {len(unmatched)} range(s): {listed}"
            print(f"qconvert: warning: {warning}", file=sys.stderr)
    if elide_weights:
        elide(module)
    with phase(f"writing {output if output != '-' else 'stdout'}", not quiet):
        write_module_to(module, output)  # streamed: each weight is read only while it is written
    _report_written("import", "quant-dialect IR", module, [output], json_path, quiet)


@app.command("convert")
def convert_command(
    model: str = typer.Argument(..., help="ONNX model file (external data next to it)"),
    to: str = typer.Option("stablehlo", "--to", help=_targets_help()),
    form: str | None = typer.Option(None, "--form", help=option_help("form")),
    semantics: str | None = typer.Option(None, "--semantics", help=option_help("semantics")),
    output: str | None = typer.Option(
        None,
        "-o",
        "--output",
        help="output file (omitted or '-': stdout; an ONNX model: -o PATH, or -o - into a pipe)",
    ),
    input_shape: list[str] = typer.Option([], "--input-shape", help=INPUT_SHAPE_HELP),  # noqa: B008
    elide_weights: bool = typer.Option(False, "--elide-weights", help=option_help("elide_weights")),
    inline_weights: bool = typer.Option(False, "--inline-weights", help=option_help("inline_weights")),
    fuse_arithmetic: bool = typer.Option(False, "--fuse-arithmetic", help=option_help("fuse_arithmetic")),
    inputs: str | None = typer.Option(None, "--inputs", help=option_help("inputs")),
    outputs: str | None = typer.Option(None, "--outputs", help=option_help("outputs")),
    rounding: str | None = typer.Option(None, "--rounding", help=option_help("rounding")),
    allow_float: bool = typer.Option(False, "--allow-float", help=option_help("allow_float")),
    float_boundary: bool = typer.Option(False, "--float-boundary", help=option_help("float_boundary")),
    product: str | None = typer.Option(None, "--product", help=option_help("product")),
    round_mode: str | None = typer.Option(None, "--round-mode", help=option_help("round_mode")),
    backend_option: list[str] = typer.Option([], "--backend-option", help=BACKEND_OPTION_HELP),  # noqa: B008
    json_path: str | None = typer.Option(None, "--json", help=WRITE_JSON_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no summary on stderr (warnings only)"),
) -> None:
    """Convert an ONNX model with a backend (`--to`: StableHLO MLIR text, or back to ONNX); every op that
    cannot be lowered is listed (exit 2). The backend options a backend does not take are refused. An
    artifact that has a summary (onnx-storage: what was stripped, what stays float and why) prints it on
    stderr once written."""
    from qconvert.convert import convert, write

    _check_output(output, model)
    _check_json_output(json_path, output or "-", model)
    flags = {
        "form": form,
        "semantics": semantics,
        "elide_weights": elide_weights,
        "inline_weights": inline_weights,
        "fuse_arithmetic": fuse_arithmetic,
        "inputs": inputs,
        "outputs": outputs,
        "rounding": rounding,
        "allow_float": allow_float,
        "float_boundary": float_boundary,
        "product": product,
        "round_mode": round_mode,
    }
    options = _backend_options(backend_option, flags)
    from qconvert.stdout_console import phase

    with phase(f"converting {model} to {to}", not quiet):
        module = convert(model, to=to, input_shapes=_parse_input_shapes(input_shape), **options)
    with phase(f"writing {output or 'stdout'}", not quiet):
        write(module, sys.stdout if output is None else output, to=to)  # "-": the backend writes to stdout
    _report_written("convert", to, module, [output or "-"], json_path, quiet)


@app.command("inspect")
def inspect_command(
    model: str = typer.Argument(..., help="ONNX model file"),
    input_shape: list[str] = typer.Option([], "--input-shape", help=INPUT_SHAPE_HELP),  # noqa: B008
    json_path: str | None = typer.Option(
        None, "--json", help="write the summary as JSON to this path ('-': stdout, instead of the text)"
    ),
    output: str = typer.Option("-", "-o", "--output", help="write the text summary here ('-': stdout)"),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="list every quantized tensor (else the first 12)"
    ),
) -> None:
    """Summarize an ONNX model: each input and output (dtype, shape), the opsets, its quantization style(s)
    (static Q/DQ, QOperator, dynamic, weight-only, MatMulNBits) with counts, ops, and each quantized
    tensor's type (storage, scale, zero point, axis, block)."""
    import json

    from qconvert.atomic_file import atomic_text_file
    from qconvert.frontends.onnx.summary import summarize_model

    _check_output(json_path, model, "--json")
    _check_output(output, model)
    summary = summarize_model(model, _parse_input_shapes(input_shape))
    if json_path is not None:
        with atomic_text_file(json_path) as stream:
            stream.write(json.dumps(summary.to_json(), indent=1) + "\n")
        if json_path == "-" and output == "-":
            return
    with atomic_text_file(output) as stream:
        stream.write("\n".join(summary.lines(shown=None if verbose else 12)) + "\n")


@app.command("check")
def check_command(
    model: str = typer.Argument(..., help="ONNX model file (float, QDQ or QOperator)"),
    data: str | None = typer.Option(
        None,
        "--data",
        help="folder of .npz/.npy samples, one .npz (samples on axis 0), or MODULE:FUNCTION; streamed "
        "in batches (default: seeded random inputs)",
    ),
    max_samples: int | None = typer.Option(
        None, "--max-samples", help="read at most N samples of --data (whole batches: fixed batch dim)"
    ),
    batch_size: int | None = typer.Option(
        None, "--batch-size", help="samples per run (default: the model's fixed batch dim, else 8)"
    ),
    allow_not_run: bool = typer.Option(
        False, "--allow-not-run", help="accept nodes or outputs not run (else INCOMPLETE, exit 1)"
    ),
    backend: str = typer.Option("interpreter", "--backend", help=_check_backends_help()),
    engine: str | None = typer.Option(None, "--engine", help=_engines_help()),
    form: str | None = typer.Option(None, "--form", help=option_help("form") + " (check: not qdq)"),
    semantics: str | None = typer.Option(None, "--semantics", help=option_help("semantics")),
    fuse_arithmetic: bool = typer.Option(
        False, "--fuse-arithmetic", help=option_help("fuse_arithmetic") + ", each fused group checked"
    ),
    backend_option: list[str] = typer.Option([], "--backend-option", help=BACKEND_OPTION_HELP),  # noqa: B008
    json_path: str | None = typer.Option(
        None, "--json", help="write the report as JSON to this path ('-': stdout, the table to stderr)"
    ),
    output: str | None = typer.Option(
        None, "-o", "--output", help="the same as --json: check's artifact is its JSON report ('-': stdout)"
    ),
    atol: float | None = typer.Option(None, "--atol", help="end to end: |ours - ref| <= atol + rtol |ref|"),
    rtol: float | None = typer.Option(None, "--rtol", help="end to end: relative tolerance (with --atol)"),
    max_lsb: float | None = typer.Option(None, "--max-lsb", help="end to end: max difference in steps"),
    max_mismatch_fraction: float | None = typer.Option(
        None, "--max-mismatch-fraction", help="end to end: max fraction of differing elements"
    ),
    min_sqnr: float | None = typer.Option(None, "--min-sqnr", help="end to end: minimum SQNR in dB"),
    input_shape: list[str] = typer.Option([], "--input-shape", help=INPUT_SHAPE_HELP),  # noqa: B008
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar; the verdict line only"),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="every failing node in the tables (else the worst 20 of each)"
    ),
    report_path: str | None = typer.Option(
        None,
        "--report",
        help="also write the report as one self-contained HTML page (plots; `qconvert report`)",
    ),
    model_explorer: str | None = typer.Option(
        None,
        "--model-explorer",
        help="write per-node results as Model Explorer node data: OUT.json (SQNR, verdict colours) and "
        "OUT.steps.json (max steps off), to load beside the model in Model Explorer",
    ),
    against: str | None = typer.Option(
        None,
        "--against",
        help="SOURCE.onnx: MODEL is its stripped copy (--to onnx-storage); both run in onnxruntime, boundary "
        "storage compared bit-exact (takes --data, --max-samples, --batch-size, --json / -o, --quiet)",
    ),
) -> None:
    """Check MODEL against onnxruntime: every node (quantization nodes bit-exact, float nodes within a
    float32 bound), every output beside the noise floor. With --against SOURCE: MODEL, a stripped model,
    against SOURCE in onnxruntime (qconvert/check/against.py).

    Exit 0 when PASSED, 1 when FAILED or INCOMPLETE (something not run; --allow-not-run accepts it),
    2 on bad input, 3 when a bug of ours kept a node or output from running (after the report)."""
    from qconvert.check import Tolerances, check
    from qconvert.check.render import ROWS_SHOWN, render
    from qconvert.stdout_console import stdout_console

    json_path = _json_or_output(json_path, output)
    _check_output(json_path, model, "--json")
    _check_output(report_path, model, "--report")
    _check_output(model_explorer, model, "--model-explorer")
    if against is not None:
        given = {
            "--allow-not-run": allow_not_run,
            "--backend": backend != "interpreter",
            "--engine": engine,
            "--form": form,
            "--semantics": semantics,
            "--fuse-arithmetic": fuse_arithmetic,
            "--backend-option": backend_option,
            "--atol / --rtol / --max-lsb / --max-mismatch-fraction / --min-sqnr": (atol, rtol, max_lsb)
            != (None, None, None)
            or (max_mismatch_fraction, min_sqnr) != (None, None),
            "--input-shape": input_shape,
            "--model-explorer": model_explorer is not None,
        }
        _check_against(model, against, data, max_samples, batch_size, json_path, quiet, given, report_path)
    tolerances = Tolerances(
        atol=atol, rtol=rtol, max_lsb=max_lsb, max_mismatch_fraction=max_mismatch_fraction, min_sqnr=min_sqnr
    )
    report = check(
        model,
        data,
        backend=backend,
        engine=engine,
        tolerances=tolerances,
        input_shapes=_parse_input_shapes(input_shape),
        show_progress=not quiet,
        allow_not_run=allow_not_run,
        max_samples=max_samples,
        batch_size=batch_size,
        **_backend_options(
            backend_option, {"form": form, "semantics": semantics, "fuse_arithmetic": fuse_arithmetic}
        ),
    )
    if json_path is not None:
        report.write_json(json_path)
    _write_check_reports(report.to_json(), model, report_path, model_explorer)
    table = sys.stderr if "-" in (json_path, report_path) else sys.stdout  # stdout carries that one alone
    with stdout_console(table, piped_width=200) as console:  # piped: one row per node, for grep
        render(report, console, summary_only=quiet, limit=None if verbose else ROWS_SHOWN)
    if report.bugs:  # the report stands, but a bug of ours kept part of it from running: exit 3
        print(
            f"qconvert: internal error: {len(report.bugs)} node(s) or output(s) not checked because of a bug "
            f"of qconvert's, e.g. {report.bugs[0]} (please report this)",
            file=sys.stderr,
        )
        raise typer.Exit(3)
    raise typer.Exit(0 if report.passed else 1)


def _write_check_reports(
    result: dict[str, object], model: str, report_path: str | None, model_explorer: str | None
) -> None:
    """check's --report (HTML) and --model-explorer (node data) files, from its JSON result."""
    if report_path is not None:
        from qconvert.report import write_report

        write_report(result, report_path)
    if model_explorer is not None:
        from qconvert.report import write_model_explorer

        write_model_explorer(result, model, model_explorer)


def _check_against(
    model: str,
    against: str,
    data: str | None,
    max_samples: int | None,
    batch_size: int | None,
    json_path: str | None,
    quiet: bool,
    given: dict[str, object],
    report_path: str | None = None,
) -> None:
    """`check MODEL --against SOURCE`: the stripped model against its source (exit 0 PASSED, else 1)."""
    from qconvert.check.against import check_against, render_against
    from qconvert.errors import InputError
    from qconvert.stdout_console import stdout_console

    refused = [flag for flag, value in given.items() if value]
    if refused:
        raise InputError(f"--against compares two ONNX models in onnxruntime; not with {', '.join(refused)}")
    report = check_against(
        model, against, data, max_samples=max_samples, batch_size=batch_size, show_progress=not quiet
    )
    if json_path is not None:
        report.write_json(json_path)
    _write_check_reports(report.to_json(), model, report_path, None)
    table = sys.stderr if "-" in (json_path, report_path) else sys.stdout  # stdout carries that one alone
    with stdout_console(table, piped_width=200) as console:
        render_against(report, console, summary_only=quiet)
    raise typer.Exit(0 if report.passed else 1)


@app.command("calibrate")
def calibrate_command(
    model: str = typer.Argument(..., help="float ONNX model (external data next to it)"),
    data: str | None = typer.Option(
        None, "--data", help="folder of .npz/.npy samples, one .npz (samples on axis 0), or MODULE:FUNCTION"
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="minmax | moving-average | percentile | entropy | mse | distribution",
        show_default="minmax",
    ),
    out: str | None = typer.Option(
        None, "-o", "--output", help="write the QDQ ONNX model here ('-': stdout)", show_default="none"
    ),
    out_alias: str | None = typer.Option(None, "--out", hidden=True, help="old spelling of -o/--output"),
    ranges: str | None = typer.Option(
        None, "--ranges", help="save the calibrated ranges as JSON ('-': stdout)"
    ),
    load_ranges: str | None = typer.Option(
        None, "--load-ranges", help="reuse a ranges JSON instead of calibrating (--data: for --evaluate)"
    ),
    workers: int | None = typer.Option(
        None, "--workers", help="processes (or Ray tasks) sharing the batches", show_default="1"
    ),
    executor: str | None = typer.Option(
        None, "--executor", help="where the workers run: local (processes) or ray", show_default="local"
    ),
    engine: str | None = typer.Option(None, "--engine", hidden=True, help="old spelling of --executor"),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="join this Ray cluster (HOST:PORT or auto; implies --executor ray); with --executor ray and no "
        "address: $RAY_ADDRESS, else a private local instance",
    ),
    threads_per_worker: int | None = typer.Option(
        None, "--threads-per-worker", help="onnxruntime threads of each worker", show_default="its CPUs"
    ),
    batch_size: str | None = typer.Option(
        None,
        "--batch-size",
        metavar="N|given",
        help="samples per run (default: the model's fixed batch dim, else 8), or 'given': each item of "
        "--data is one run, fed as stored (sequence-first models, inputs without a batch axis)",
    ),
    percentile: float | None = typer.Option(None, "--percentile", help="percentile: the kept percentage"),
    num_bins: int | None = typer.Option(
        None, "--num-bins", help="histogram methods: bins, 16..65536 (entropy <= 16384, distribution >= 512)"
    ),
    num_quantized_bins: int | None = typer.Option(None, "--num-quantized-bins", help="entropy: target bins"),
    activation_type: str = typer.Option(
        "int8", "--activation-type", help="int8|uint8|int16|uint16|int4|uint4|float8e4m3fn"
    ),
    weight_type: str = typer.Option(
        "int8", "--weight-type", help="storage of weights (as --activation-type)"
    ),
    symmetric_activations: bool = typer.Option(False, "--symmetric-activations", help="zero point at 0"),
    asymmetric_weights: bool = typer.Option(False, "--asymmetric-weights", help="weights with a zero point"),
    per_channel: bool = typer.Option(
        False, "--per-channel", help="one scale per output channel of weights (the default)"
    ),
    per_tensor_weights: bool = typer.Option(
        False, "--per-tensor-weights", help="one scale per weight tensor (onnxruntime's default)"
    ),
    block_size: int = typer.Option(0, "--block-size", help="blocked weights of this size (opset 21)"),
    reduce_range: bool = typer.Option(False, "--reduce-range", help="7-bit weights"),
    float8_scale: str = typer.Option(
        "std", "--float8-scale", help="float8e4m3fn scales: std (onnxruntime's) | max (max|x| / 448)"
    ),
    overrides: str | None = typer.Option(
        None,
        "--overrides",
        help="per-tensor overrides: a JSON file in onnxruntime's TensorQuantOverrides form",
    ),
    op_types: list[str] = typer.Option([], "--op-types", help="only these op types (comma-separated)"),  # noqa: B008
    exclude_op_types: list[str] = typer.Option([], "--exclude-op-types", help="not these op types (commas)"),  # noqa: B008
    nodes: list[str] = typer.Option([], "--nodes", help="only these node names (comma-separated)"),  # noqa: B008
    exclude_nodes: list[str] = typer.Option([], "--exclude-nodes", help="not these node names (commas)"),  # noqa: B008
    sentinel: str | None = typer.Option(
        None, "--sentinel", help="masked/padded ranges: keep (float) | clip | off", show_default="keep"
    ),
    sentinel_override: list[str] = typer.Option([], "--sentinel-override", help=SENTINEL_HELP),  # noqa: B008
    json_path: str | None = typer.Option(
        None, "--json", help="write the result (ranges, samples) as JSON ('-': stdout, the table to stderr)"
    ),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar and no table; warnings only"),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="every range in the table (else the 25 with notes or widest first); Ray's own log",
    ),
    evaluate_samples: int = typer.Option(
        32,
        "--evaluate",
        help="compare the QDQ model with the float one in onnxruntime on this many of the "
        "first samples, whole batches (0: skip)",
    ),
    report_path: str | None = typer.Option(
        None,
        "--report",
        help="also write the result as one self-contained HTML page (histograms, ranges; `qconvert report`)",
    ),
    worst_tensors: int = typer.Option(
        0,
        "--worst-tensors",
        help="also list the N activations losing most to their own Q/DQ (--evaluate's samples)",
    ),
    target_cosine: float | None = typer.Option(
        None,
        "--target-cosine",
        help="widen the fewest activations to int16 until the outputs' mean cosine to float on held-out data "
        "reaches this",
    ),
    eval_data: str | None = typer.Option(
        None,
        "--eval-data",
        help="--target-cosine/--target-metric's held-out data (as --data)",
        show_default="the last quarter of --data's batches, then not calibrated on",
    ),
    target_output: list[str] = typer.Option(  # noqa: B008
        [],
        "--target-output",
        help="--target-cosine/--target-metric: the outputs that count (default: every float one)",
    ),
    target_metric: list[str] = typer.Option(  # noqa: B008
        [],
        "--target-metric",
        metavar="METRIC[:OUTPUT]>=X|<=X",
        help="search for a held-out target (repeatable, all must hold): cosine, min-cosine, top1 (>=), "
        "max-abs, mean-abs (<=), e.g. top1:logits>=0.99, max-abs:out<=0.05",
    ),
    smooth_quant: str | None = typer.Option(
        None,
        "--smooth-quant",
        metavar="ALPHA|auto",
        help="SmoothQuant: migrate MatMul/Gemm inputs' outlier channels into the weights (alpha in [0, 1], "
        "0.5 is the paper's; auto: per input by its product's Q/DQ error) before calibrating",
        show_default="off",
    ),
    outlier_channels: str = typer.Option(
        "widen",
        "--outlier-channels",
        metavar="widen|off",
        help="widen to int16 the activations whose largest channel is >= 16x their median one on the first "
        "32 samples (at most 10% of them), or off",
    ),
    bias_correction: str = typer.Option(
        "off",
        "--bias-correction",
        metavar="on|off",
        help="add mean(x)·(W - W_q) to each MatMul(+Add)/Gemm/Conv bias: the mean shift its weight's "
        "quantization causes (mean(x): the input's per-channel mean on the first 32 samples)",
    ),
) -> None:
    """Calibrate a float ONNX model on data and write it as QDQ ONNX (exit 2 on bad input; nothing written)

    Progress on stderr, then a table of the ranges (and any sentinel warning) on stdout."""
    from qconvert.calibrate.api import calibrate, refuse_unused_with_load_ranges
    from qconvert.calibrate.dataset import AS_GIVEN
    from qconvert.calibrate.overrides import read_overrides
    from qconvert.calibrate.render import progress_bar, render

    out = _one_of_two("-o/--output", out, "--out", out_alias)
    executor_flag = "--engine" if engine is not None else "--executor"  # the message names the one given
    executor = _one_of_two("--executor", executor, "--engine", engine)
    if executor is not None:
        from qconvert.calibrate.workers import ENGINES
        from qconvert.did_you_mean import did_you_mean
        from qconvert.errors import InputError

        if executor not in ENGINES:
            suggestion = did_you_mean(executor, ENGINES)
            raise InputError(f"{executor_flag} {executor}: expected one of {', '.join(ENGINES)}{suggestion}")
    if load_ranges is not None:  # what only calibrating reads (calibrate() checks the rest)
        options = {"--method": method, "--sentinel": sentinel, "--workers": workers, executor_flag: executor}
        options["--batch-size"] = batch_size if data is None else None  # with --data: --evaluate's batches
        options.update({"--ray-address": ray_address, "--threads-per-worker": threads_per_worker})
        refuse_unused_with_load_ranges(
            load_ranges, {name: value is not None for name, value in options.items()}
        )

    def names(values: list[str]) -> frozenset[str] | None:
        split = [n.strip() for v in values for n in v.split(",") if n.strip()]
        return frozenset(split) if split else None

    scheme = {
        "activation_type": activation_type,
        "weight_type": weight_type,
        "activation_symmetric": symmetric_activations,
        "weight_symmetric": False if asymmetric_weights else None,
        "per_channel": not _per_tensor_weights(per_channel, per_tensor_weights),
        "block_size": block_size,
        "reduce_range": reduce_range,
        "float8_scale": float8_scale,
        "tensor_overrides": read_overrides(overrides) if overrides else {},
        "op_types_to_quantize": names(op_types),
        "op_types_to_exclude": names(exclude_op_types) or frozenset(),
        "nodes_to_quantize": names(nodes),
        "nodes_to_exclude": names(exclude_nodes) or frozenset(),
    }
    given = {"percentile": percentile, "num_bins": num_bins, "num_quantized_bins": num_quantized_bins}
    batch: int | str | None = batch_size
    with contextlib.suppress(TypeError, ValueError):  # a number, else 'given' or a word calibrate names
        batch = int(batch_size)  # type: ignore[arg-type]
    unit = "runs" if batch == AS_GIVEN else "samples"
    if report_path is not None:  # written after calibrate returns: checked with its outputs before any work
        from qconvert.calibrate.outputs import check_output_paths

        check_output_paths(
            {"--out": out, "--ranges": ranges, "--json": json_path, "--report": report_path},
            {"the model": model, "--data": data, "--load-ranges": load_ranges},
        )
    with progress_bar(not quiet, unit=unit) as progress:
        result = calibrate(
            model,
            data,
            method="minmax" if method is None else method,
            method_options={k: v for k, v in given.items() if v is not None},
            scheme=scheme,
            out=out,
            ranges_path=ranges,
            load_ranges=load_ranges,
            json_path=json_path,
            workers=1 if workers is None else workers,
            engine="local" if executor is None else executor,
            ray_address=ray_address,
            threads_per_worker=threads_per_worker,
            verbose=verbose,  # Ray's own log too
            batch_size=batch,
            sentinel="keep" if sentinel is None else sentinel,
            sentinel_overrides=_named_values(sentinel_override),
            progress=progress,
            evaluate_samples=evaluate_samples,
            evaluate_tensors=worst_tensors > 0,
            target_cosine=target_cosine,
            eval_data=eval_data,
            target_outputs=[n.strip() for v in target_output for n in v.split(",") if n.strip()],
            target_metrics=target_metric,
            smooth_quant=smooth_quant,
            outlier_channels=outlier_channels,
            bias_correction=bias_correction,
        )
    if report_path is not None:
        from qconvert.report import write_report

        write_report(result.to_json(), report_path)
    if "-" in (out, ranges, json_path, report_path):  # stdout carries that output alone; the table: stderr
        render(result, sys.stderr, sys.stderr, quiet, worst_tensors, verbose)
        return
    render(result, sys.stdout, sys.stderr, quiet, worst_tensors, verbose)


def _per_tensor_weights(per_channel: bool, per_tensor_weights: bool) -> bool:
    """--per-tensor-weights, refused beside --per-channel (the default it opts out of)."""
    if per_channel and per_tensor_weights:
        from qconvert.errors import InputError

        raise InputError("--per-channel and --per-tensor-weights: give one (per-channel is the default)")
    return per_tensor_weights


@app.command("report")
def report_command(
    result: str = typer.Argument(..., help="a `check --json` or `calibrate --json` result ('-': stdin)"),
    output: str = typer.Option("report.html", "-o", "--output", help="the HTML page ('-': stdout)"),
) -> None:
    """Draw a check or calibrate result as one self-contained HTML page (no network needed to open it)."""
    from qconvert.report import write_report

    _check_output(output, result)
    write_report(result, output)
    if output != "-":
        typer.echo(f"wrote {output}", err=True)


@app.command("run")
def run_command(
    artifact: str = typer.Argument(
        ..., help="what qconvert emitted: .onnx (QDQ / storage) or .mlir (StableHLO / TOSA)"
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="folder of .npz/.npy samples, one .npz (samples on axis 0), or MODULE:FUNCTION "
        "(default: seeded random inputs)",
    ),
    output: str | None = typer.Option(None, "-o", "--output", help="write the outputs as .npz ('-': stdout)"),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="onnx: onnxruntime; stablehlo: xla (default) | interpreter; tosa: reference (default) | iree",
    ),
    max_samples: int | None = typer.Option(None, "--max-samples", help="read at most N samples of --data"),
    batch_size: int | None = typer.Option(
        None, "--batch-size", help="samples per run (default: the artifact's fixed batch dim, else 8)"
    ),
    json_path: str | None = typer.Option(
        None, "--json", help="write a summary (outputs' shapes, dtypes, ranges) as JSON ('-': stdout)"
    ),
) -> None:
    """Run an artifact qconvert emitted on data, on a real engine; quantized storage at its boundary takes
    and gives floats (ONNX's Q/DQ rules), the raw storage kept as NAME.storage."""
    import json

    from qconvert.atomic_file import atomic_text_file
    from qconvert.run import run

    _check_output(output, artifact)
    _check_output(json_path, artifact, "--json")
    result = run(artifact, data, engine=engine, max_samples=max_samples, batch_size=batch_size)
    if output is not None:
        result.save(output)
    summary = result.to_json()
    if json_path is not None:
        with atomic_text_file(json_path) as stream:
            stream.write(json.dumps(summary, indent=1) + "\n")
    if "-" in (output, json_path):
        return
    typer.echo(f"ran {artifact} on {result.engine}: {result.samples} samples in {result.runs} run(s)")
    for name, entry in summary["outputs"].items():  # type: ignore[union-attr]
        ranges = f" min {entry['min']:.6g} max {entry['max']:.6g}" if "min" in entry else ""
        typer.echo(f"  {name}: {entry['dtype']}{entry['shape']}{ranges}")
    for note in result.notes:
        typer.echo(f"qconvert: note: {note}", err=True)


if __name__ == "__main__":
    sys.exit(main())

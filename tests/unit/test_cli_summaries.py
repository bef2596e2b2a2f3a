"""What the verbs say once done (issue 22): --json summaries, calibrate's scales, screens, the Python API."""

from __future__ import annotations

import inspect
import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

import qconvert
from qconvert.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS_QDQ = MODELS / "digits_cnn.qdq.onnx"
DIGITS_FLOAT = MODELS / "digits_cnn.onnx"
DIGITS_DATA = MODELS / "digits_cnn.inputs.npz"


def _op_names(text: str) -> list[str]:
    """Every op of MLIR text, generic (`"onnx.Conv"(`) or pretty (`stablehlo.add %`), by its name."""
    return re.findall(r'(?:= |^\s*)"?([a-z_]+\.[a-z_A-Z0-9.]+)"?[ (%<{]', text, flags=re.MULTILINE)


@pytest.mark.parametrize("verb", ["convert", "import"])
def test_json_summary_counts_the_ops_written(
    verb: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out, summary_path = tmp_path / "out.mlir", tmp_path / "summary.json"
    assert main([verb, str(DIGITS_QDQ), "--elide-weights", "-o", str(out), "--json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    written = [name for name in _op_names(out.read_text()) if name not in ("func.func", "func.return")]
    assert summary["outputs"] == [str(out)] and summary["verb"] == verb
    assert sum(summary["ops"].values()) == len(written)
    assert all(written.count(name) == count for name, count in summary["ops"].items())
    assert f"qconvert {verb}: wrote {out}" in capsys.readouterr().err  # the one-line summary
    assert main([verb, str(DIGITS_QDQ), "-o", str(out), "--json", str(summary_path), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main([verb, str(DIGITS_QDQ), "-o", "-", "--json", "-"]) == 2  # one stdout


def test_opt_json_summary(tmp_path: Path) -> None:
    lifted, lowered, summary_path = tmp_path / "in.mlir", tmp_path / "out.mlir", tmp_path / "s.json"
    assert main(["import", str(DIGITS_QDQ), "-o", str(lifted), "--quiet"]) == 0
    command = ["opt", str(lifted), "--allow-unregistered-dialect", "--lower-quant-ops", "-o", str(lowered)]
    assert main([*command, "--json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    assert summary["notes"] == ["pass lower-quant-ops"] and "quant.qcast" not in summary["ops"]
    assert summary["ops"]["arith.constant"] == lowered.read_text().count("arith.constant")


def test_calibrate_reports_the_scale_and_zero_point_it_wrote(tmp_path: Path) -> None:
    out, report = tmp_path / "q.onnx", tmp_path / "result.json"
    command = ["calibrate", str(DIGITS_FLOAT), "--data", str(DIGITS_DATA), "--evaluate", "0", "--quiet"]
    assert main([*command, "-o", str(out), "--json", str(report)]) == 0
    written = json.loads(report.read_text())["quantization"]
    model = onnx.load(str(out))
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    quantizers = [
        n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in constants
    ]
    # each Q node is named after the calibrated tensor it quantizes (its input may be renamed: a graph output)
    tensors = {node.name.removesuffix("_QuantizeLinear"): node for node in quantizers}
    assert quantizers and set(tensors) == set(written) <= set(json.loads(report.read_text())["ranges"])
    for tensor, node in tensors.items():
        assert np.float32(written[tensor]["scale"]) == constants[node.input[1]]
        assert written[tensor]["zero_point"] == int(constants[node.input[2]])


def test_a_long_table_shows_the_worst_rows_and_counts_the_rest() -> None:
    from qconvert.calibrate.api import CalibrationResult
    from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
    from qconvert.calibrate.render import ROWS_SHOWN, render

    widths = np.random.default_rng(3).permutation(40) + 1.0
    ranges = {f"t{i}": TensorRange(f"t{i}", 0.0, float(width), "minmax") for i, width in enumerate(widths)}
    ranges["t7"].note = "noted"
    note = "per-channel skipped for weight 'w{}': its consumer is LayerNormalization"
    result = CalibrationResult(CalibrationRanges(ranges), "minmax", notes=[note.format(i) for i in range(5)])
    stdout, stderr = io.StringIO(), io.StringIO()
    render(result, stdout, stderr, quiet=False)
    rows = [line.split()[0] for line in stdout.getvalue().splitlines() if re.match(r"t\d+ ", line)]
    widest = sorted((name for name in ranges if name != "t7"), key=lambda n: -ranges[n].max)
    assert rows == ["t7", *widest[: ROWS_SHOWN - 1]]
    assert f"{40 - ROWS_SHOWN} more (--verbose lists all)" in stdout.getvalue()
    notes = [line for line in stdout.getvalue().splitlines() if line.startswith("note:")]
    assert notes == [f"note: {note.format(0)} (x5 alike: 'w0', 'w1', 'w2', ...)"]
    verbose = io.StringIO()
    render(result, verbose, stderr, quiet=False, verbose=True)
    assert sum(1 for line in verbose.getvalue().splitlines() if re.match(r"t\d+ ", line)) == 40


def test_the_python_api(tmp_path: Path) -> None:
    from qconvert.calibrate.methods import METHODS

    assert [method.value for method in qconvert.Method] == list(METHODS)
    assert qconvert.Form.INTEGER == "integer" and "stablehlo" in list(qconvert.Target)
    assert (
        isinstance(qconvert.__version__, str) and "method" in inspect.signature(qconvert.calibrate).parameters
    )
    out = tmp_path / "q.onnx"
    result = qconvert.calibrate(
        str(DIGITS_FLOAT), str(DIGITS_DATA), method=qconvert.Method.MINMAX, out=str(out)
    )
    assert repr(result) == f"CalibrationResult(minmax, 9 ranges, 8 samples, wrote {out})"
    assert json.loads(json.dumps(result.to_json()))["method"] == "minmax"
    with pytest.raises(qconvert.InputError) as caught:
        qconvert.calibrate(str(DIGITS_FLOAT), str(DIGITS_DATA), method="entropi")
    assert "`method` entropi" in caught.value.message and "--method" not in caught.value.message
    module = qconvert.convert(qconvert.import_onnx(str(DIGITS_QDQ)), to=qconvert.Target.STABLEHLO)
    assert any(op.name == "stablehlo.convolution" for op in module.walk())
    report = qconvert.check(str(DIGITS_QDQ), str(DIGITS_DATA), max_samples=8)
    assert repr(report).startswith(f"CheckReport({report.verdict}, {DIGITS_QDQ} on interpreter, nodes ")


def test_progress_of_an_unknown_total_is_a_count_and_a_rate() -> None:
    from rich.console import Console
    from rich.progress import Progress, TextColumn

    from qconvert.stdout_console import progress_columns

    lines = []
    for total in (None, 64):
        screen = io.StringIO()
        console = Console(file=screen, width=120, color_system=None)
        bar = Progress(TextColumn("{task.description}"), *progress_columns("samples"), console=console)
        task = bar.add_task("end to end", total=total)
        bar.update(task, completed=12)
        console.print(bar.make_tasks_table(bar.tasks))  # the line a terminal shows, drawn once
        lines.append(screen.getvalue().strip())
    streamed, counted = lines
    assert "12 samples" in streamed and "?" not in streamed and "ETA" not in streamed and "━" not in streamed
    assert "12/64 samples" in counted and "ETA" in counted


def test_check_lists_the_worst_failing_nodes_and_counts_the_rest() -> None:
    from rich.console import Console

    from qconvert.check.render import ROWS_SHOWN, render
    from qconvert.check.report import FAIL, CheckReport, LayerResult, Tolerances

    steps = np.random.default_rng(5).permutation(30) + 1.0
    layers = {
        f"q{i}": LayerResult(
            node=f"q{i}", op_type="QuantizeLinear", domain="", verdict=FAIL, elements=8, max_lsb_diff=float(s)
        )
        for i, s in enumerate(steps)
    }
    report = CheckReport(
        model="m.onnx",
        backend="interpreter",
        tolerances=Tolerances(),
        layers=layers,
        outputs={},
        inputs_source="random",
        notes=["a 'x'", "a 'y'"],
    )
    shown = io.StringIO()
    render(report, Console(file=shown, width=200), limit=ROWS_SHOWN)
    rows = [
        line.split("│")[1].strip() for line in shown.getvalue().splitlines() if re.match(r"│ q\d+ ", line)
    ]
    assert rows == sorted(layers, key=lambda name: -layers[name].max_lsb_diff)[:ROWS_SHOWN]
    assert f"{30 - ROWS_SHOWN} more (--verbose lists all)" in shown.getvalue()
    assert "note: a 'x' (x2 alike: 'x', 'y')" in shown.getvalue()
    everything = io.StringIO()
    render(report, Console(file=everything, width=200), limit=None)
    assert sum(1 for line in everything.getvalue().splitlines() if re.match(r"│ q\d+ ", line)) == 30


def test_convert_shows_its_phases_on_a_terminal(tmp_path: Path) -> None:
    """On a pseudo-terminal, as a user sees it: a transient line per phase, then the one-line summary."""
    import os
    import pty
    import subprocess
    import sys

    try:
        leader, follower = pty.openpty()
    except OSError as error:  # a container without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here: {error}")
    out = tmp_path / "d.mlir"
    cli = "import sys; from qconvert.cli import main; sys.exit(main())"
    command = [sys.executable, "-c", cli, "convert", str(DIGITS_QDQ), "-o", str(out)]
    environment = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    process = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=environment)
    os.close(follower)
    screen = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    assert process.wait(timeout=120) == 0
    text = screen.decode(errors="replace")
    assert f"converting {DIGITS_QDQ} to stablehlo" in text and f"writing {out}" in text
    assert f"qconvert convert: wrote {out} (stablehlo)" in text

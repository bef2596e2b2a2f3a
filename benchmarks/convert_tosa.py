#!/usr/bin/env python3
"""`qconvert convert --to tosa` beside torch-mlir's ONNX -> TOSA pipeline, on the same quantized models.

Per model, two rows, each command in a fresh process (seconds of wall time, peak MB its own ru_maxrss):

- `qconvert`: `qconvert convert MODEL --to tosa -o OUT.mlir` (refused as integer-only: again with
  `--allow-float`, the row says so), then `qconvert check MODEL --data NPZ --backend
  tosa` (the TOSA reference model), whose verdict line and end-to-end mismatches against onnxruntime are the
  `runs` / `error` columns;
- `torch-mlir`: `torch-mlir-import-onnx MODEL`, then `torch-mlir-opt --pass-pipeline=
  builtin.module(torch-onnx-to-torch-backend-pipeline,torch-backend-to-tosa-backend-pipeline)`; its output is
  not run here (its function takes and returns f32 tensors, so it is no PRO-INT graph to feed storage to).

For each output text: how many ops return f32 tensors (PRO-INT has none),
how many `tosa.rescale` ops, and how many ops in all. Dynamic axes are pinned from the data's arrays.

Usage: python benchmarks/convert_tosa.py [--corpus DIR] [--model PATH --data NPZ ...] [--keep DIR]
Default models: models/digits_cnn.qdq.onnx, and from a built corpus (models/corpus/build.py --out DIR, or
pytest's cache) mobilenet_fpn.qdq and minilm.qdq.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TOSA_PIPELINE = "builtin.module(torch-onnx-to-torch-backend-pipeline,torch-backend-to-tosa-backend-pipeline)"
TIMEOUT = 300.0
F32_TENSOR = re.compile(r"tensor<[0-9x?]*f32>")
OP_NAME = re.compile(r'^\s*(?:%[^=]+=\s*)?"?([a-z_]+\.[a-z_0-9.]+)"?[ (]', re.MULTILINE)


@dataclass
class Row:
    model: str
    tool: str
    status: str
    seconds: float | None = None
    peak_mb: float | None = None
    f32_values: int | None = None
    rescales: int | None = None
    ops: int | None = None
    runs: str = ""


def run(command: list[str]) -> tuple[int, float, float, str]:
    """Exit code, wall seconds, peak MB (the child's own ru_maxrss) and stderr of one command."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
    return process.returncode, time.perf_counter() - started, usage.ru_maxrss / 1024.0, stderr


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors[0] if errors else lines[-1] if lines else "")[:150]


def tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else None


def shape_flags(data: Path) -> list[str]:
    with np.load(data) as arrays:
        return [
            f for n in arrays.files for f in ("--input-shape", f"{n}={'x'.join(map(str, arrays[n].shape))}")
        ]


def describe(row: Row, text: str) -> None:
    """Count the ops whose results are f32 tensors, the rescales and the TOSA ops of an MLIR text."""
    results = [line.split("->")[-1] if "->" in line else line.split(":")[-1] for line in text.splitlines()]
    row.f32_values = sum(
        1 for line, result in zip(text.splitlines(), results) if "= " in line and F32_TENSOR.search(result)
    )
    names = OP_NAME.findall(text)
    row.rescales = sum(1 for name in names if name == "tosa.rescale")
    row.ops = sum(1 for name in names if name.startswith("tosa."))


def qconvert_row(model: Path, data: Path, work: Path) -> Row:
    qconvert = tool("qconvert")
    assert qconvert is not None, "run with the project's venv python"
    row = Row(model.name, "qconvert --to tosa", "ok")
    output = work / f"{model.stem}.qconvert.tosa.mlir"
    convert = [qconvert, "convert", str(model), "--to", "tosa", *shape_flags(data), "-o", str(output)]
    code, seconds, peak, stderr = run(convert)
    check_options: list[str] = []
    if code == 2:  # refused as integer-only: float islands as float TOSA (PRO-FP), when they can be
        code, seconds, peak, allow_stderr = run([*convert, "--allow-float"])
        row.tool, check_options = "qconvert --allow-float", ["--backend-option", "allow_float=true"]
        stderr = allow_stderr if code != 0 else stderr
    if code != 0:
        row.status, row.runs = "failed", last_line(stderr)
        return row
    row.seconds, row.peak_mb = seconds, peak
    describe(row, output.read_text())
    done = subprocess.run(
        [qconvert, "check", str(model), "--data", str(data), "--backend", "tosa", *check_options],
        capture_output=True,
        text=True,
        check=False,
    )
    verdict = [
        line for line in done.stdout.splitlines() if line.startswith(("PASSED", "FAILED", "INCOMPLETE"))
    ]
    ends = [
        line
        for line in done.stdout.splitlines()
        if line.startswith("│") and "/" in line and "noise" not in line
    ]
    end_to_end = ends[-1].split("│")[2].strip() if ends else "?"
    row.runs = f"{verdict[-1][:60] if verdict else last_line(done.stderr)}; end to end {end_to_end} off"
    return row


def torch_mlir_row(model: Path, work: Path) -> Row:
    importer, optimizer = tool("torch-mlir-import-onnx"), tool("torch-mlir-opt")
    row = Row(model.name, "torch-mlir onnx->tosa", "ok")
    if importer is None or optimizer is None:
        row.status = "not found"
        return row
    imported, lowered = work / f"{model.stem}.torch.mlir", work / f"{model.stem}.torch-mlir.tosa.mlir"
    seconds, peak = 0.0, 0.0
    for step, command, output in (
        ("import", [importer, str(model), "-o", str(imported)], imported),
        (
            "pipeline",
            [optimizer, f"--pass-pipeline={TOSA_PIPELINE}", str(imported), "-o", str(lowered)],
            lowered,
        ),
    ):
        code, step_seconds, step_peak, stderr = run(command)
        if code != 0 or not output.exists():
            row.status, row.runs = "failed", f"{step}: {last_line(stderr)}"
            return row
        seconds, peak = seconds + step_seconds, max(peak, step_peak)
    row.seconds, row.peak_mb = seconds, peak
    describe(row, lowered.read_text())
    row.runs = "not run (f32 boundary: not a PRO-INT graph)"
    return row


def default_models(corpus: Path | None) -> list[tuple[Path, Path]]:
    models = [(REPO / "models/digits_cnn.qdq.onnx", REPO / "models/digits_cnn.inputs.npz")]
    if corpus is None:
        found = sorted((REPO / ".pytest_cache/d/qconvert-corpus").glob("*/manifest.json"))
        corpus = found[0].parent if found else None
    if corpus is not None:
        for name in ("mobilenet_fpn", "minilm"):
            models.append((corpus / f"{name}.qdq.onnx", corpus / f"{name}.inputs.npz"))
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a built corpus folder (models/corpus/build.py --out)")
    parser.add_argument("--model", type=Path, action="append", default=[])
    parser.add_argument("--data", type=Path, action="append", default=[])
    parser.add_argument("--keep", type=Path, help="keep the outputs in this folder")
    arguments = parser.parse_args(argv)
    models = list(zip(arguments.model, arguments.data, strict=True)) or default_models(arguments.corpus)
    work = arguments.keep or Path(tempfile.mkdtemp(prefix="convert-tosa-"))
    work.mkdir(parents=True, exist_ok=True)
    header = (
        f"{'model':24} {'tool':24} {'status':9} {'s':>6} {'MB':>6} {'f32':>5} {'rescale':>7} {'ops':>5}  runs"
    )
    print(header)
    for model, data in models:
        for row in (qconvert_row(model, data, work), torch_mlir_row(model, work)):

            def cell(value: float | int | None, width: int, digits: int = 0) -> str:
                return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

            print(
                f"{row.model[:24]:24} {row.tool:24} {row.status:9} {cell(row.seconds, 6, 2)} "
                f"{cell(row.peak_mb, 6)} {cell(row.f32_values, 5)} {cell(row.rescales, 7)} "
                f"{cell(row.ops, 5)}  {row.runs}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Import speed and peak memory of `qconvert import` on a quantized transformer, beside `iree-import-onnx`.

The model (built into a temporary directory, never committed): models/build_transformer.py with
`--layers 6 --hidden 384 --heads 12 --vocab 30522 --train-steps 0 --qdq-only`, the shape of
all-MiniLM-L6-v2 (untrained weights: the import does not care), about 90 MB of float weights, then
onnxruntime's `quantize_static` (QDQ, per-channel int8 weights). `--model PATH` benchmarks a given model.

Rows, each the whole command in a fresh process (start-up, load, lift / import, print, write, exit):

- `qconvert import`: `python -m qconvert import MODEL -o OUT` (weights as `dense_resource` blobs);
- `qconvert import --elide-weights`: the same without the blobs (`dense_resource<__elided__>`);
- `iree-import-onnx`: the peer's ONNX -> MLIR import (pip `iree-base-compiler`), `MODEL -o OUT`.

Seconds are the median of `--repeat` runs, peak MB the largest peak RSS of those runs (`os.wait4` on
that one child, spawned from a small launcher: see benchmarks/parse_print.py, whose launcher this
reuses). A missing tool is `not found`; a failing one `failed` with its message; a run over `--timeout`
`timeout`; none of them ever shows a time. The output of `qconvert import` is then parsed by MLIR's C++
(`iree-opt --allow-unregistered-dialect`, `checked` column) and by `qconvert opt`, which must print it
back byte for byte.

Usage: python benchmarks/import_onnx.py [--model PATH] [--keep DIR] [--repeat K] [--timeout S] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parse_print  # the launcher and the row type are shared
from parse_print import Row, child_env, last_line, measure_command

REPO = parse_print.REPO
BUILD = [
    "--layers", "6", "--hidden", "384", "--heads", "12", "--vocab", "30522",
    "--train-steps", "0", "--qdq-only", "--stem", "encoder6x384",
]  # fmt: skip
STEM = "encoder6x384"


def find_tool(name: str) -> str | None:
    """A console script next to this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def build_model(folder: Path) -> tuple[Path, Path]:
    command = [sys.executable, str(REPO / "models" / "build_transformer.py"), "--out", str(folder), *BUILD]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"building the model failed:\n{result.stderr[-2000:]}")
    return folder / f"{STEM}.onnx", folder / f"{STEM}.qdq.onnx"


def parse_model_arguments(doc: str | None, argv: list[str] | None) -> argparse.Namespace:
    """The options of the benchmarks on this model (convert_stablehlo.py shares them)."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--model", type=Path, help="benchmark this ONNX model instead of building one")
    parser.add_argument("--keep", type=Path, help="build the model into this folder and keep it")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median seconds, max peak)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per run")
    parser.add_argument("--json", type=Path, help="write every sample here")
    return parser.parse_args(argv)


def model_to_benchmark(arguments: argparse.Namespace, work: Path) -> tuple[Path | None, Path]:
    """(float model or None, QDQ model): `--model` as given, else built into `--keep` or `work`."""
    if arguments.model is not None:
        return None, arguments.model.resolve()
    folder = arguments.keep.resolve() if arguments.keep else work
    folder.mkdir(parents=True, exist_ok=True)
    print(f"building the model in {folder} ...", file=sys.stderr)
    return build_model(folder)


def measure(tool: str, command: list[str], output: Path, repeat: int, env: dict[str, str] | None) -> Row:
    return measure_command("import", tool, command, output, repeat, env)


def check_output(path: Path, iree_opt: str | None) -> dict[str, str]:
    """Does MLIR's C++ parse our output, and does `qconvert opt` print it back identically?"""
    verdict: dict[str, str] = {}
    if iree_opt is None:
        verdict["iree-opt parses it"] = "not found"
    else:
        result = subprocess.run(
            [iree_opt, "--allow-unregistered-dialect", str(path), "-o", "/dev/null"],
            capture_output=True,
            text=True,
            check=False,
        )
        verdict["iree-opt parses it"] = "yes" if result.returncode == 0 else f"no: {last_line(result.stderr)}"
    again = path.with_suffix(".again.mlir")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "qconvert",
            "opt",
            str(path),
            "--allow-unregistered-dialect",
            "-o",
            str(again),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=child_env(),
    )
    if result.returncode != 0:
        verdict["qconvert opt prints it back"] = f"no: {last_line(result.stderr)}"
    else:
        same = again.read_bytes() == path.read_bytes()
        verdict["qconvert opt prints it back"] = "identical" if same else "DIFFERENT"
    again.unlink(missing_ok=True)
    return verdict


def render(rows: list[Row], model_mb: float, float_mb: float | None, floor_mb: float) -> str:
    lines = [
        f"model: {model_mb:.1f} MB on disk (QDQ)"
        + (f"; float model {float_mb:.1f} MB" if float_mb is not None else ""),
        f"launcher floor (peak RSS of `true`): {floor_mb:.1f} MB",
        "",
        f"{'tool':<34} {'status':<10} {'seconds':>8} {'peak MB':>8} {'peak/model':>10}  note",
    ]
    for row in rows:
        seconds = f"{row.seconds:.2f}" if row.seconds is not None else "-"
        peak = f"{row.peak_mb:.0f}" if row.peak_mb is not None else "-"
        ratio = f"{row.peak_mb / model_mb:.1f}x" if row.peak_mb is not None else "-"
        lines.append(f"{row.tool:<34} {row.status:<10} {seconds:>8} {peak:>8} {ratio:>10}  {row.note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_model_arguments(__doc__, argv)
    launcher = parse_print.start_launcher(arguments.timeout)
    scratch = tempfile.TemporaryDirectory(prefix="qconvert-bench-import-")
    try:
        work = Path(scratch.name)
        float_path, model = model_to_benchmark(arguments, work)
        model_mb = model.stat().st_size / 1e6
        float_mb = float_path.stat().st_size / 1e6 if float_path is not None else None
        _, _, floor_mb, _, _ = launcher.run(["/bin/true"])

        env = child_env()
        ours, elided, theirs = work / "qconvert.mlir", work / "qconvert-elided.mlir", work / "iree.mlir"
        qconvert = [sys.executable, "-m", "qconvert", "import", str(model)]
        rows = [
            measure("qconvert import", [*qconvert, "-o", str(ours)], ours, arguments.repeat, env),
            measure(
                "qconvert import --elide-weights",
                [*qconvert, "--elide-weights", "-o", str(elided)],
                elided,
                arguments.repeat,
                env,
            ),
        ]
        iree_import = find_tool("iree-import-onnx")
        if iree_import is None:
            rows.append(Row("import", "iree-import-onnx", "not found", note="pip install iree-base-compiler"))
        else:
            rows.append(
                measure(
                    "iree-import-onnx",
                    [iree_import, str(model), "-o", str(theirs)],
                    theirs,
                    arguments.repeat,
                    None,
                )
            )
        verdict = check_output(ours, find_tool("iree-opt")) if rows[0].status == "ok" else {}
        print(render(rows, model_mb, float_mb, floor_mb))
        for key, value in verdict.items():
            print(f"qconvert's output: {key}: {value}")
        if arguments.json:
            report = {
                "model": str(model),
                "model_mb": model_mb,
                "float_model_mb": float_mb,
                "launcher_floor_mb": floor_mb,
                "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
                "rows": [{**asdict(r), "seconds": r.seconds, "peak_mb": r.peak_mb} for r in rows],
                "output_checks": verdict,
            }
            arguments.json.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    finally:
        launcher.close()
        scratch.cleanup()


if __name__ == "__main__":
    sys.exit(main())

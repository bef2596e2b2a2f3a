#!/usr/bin/env python3
"""Speed and peak memory of `qconvert convert --to stablehlo` on the 90 MB quantized transformer, per form.

The model is import_onnx.py's (built into a temporary directory, never committed): a 6-layer, 384-wide
BERT-shaped encoder, 89.5 MB of float weights quantized by onnxruntime's `quantize_static` (QDQ,
per-channel int8 weights). `--model PATH` benchmarks a given model.

Rows, each the whole command in a fresh process spawned from parse_print.py's launcher (start-up, load,
lift, lower, print with weights as `dense_resource` blobs, write, exit); median seconds over `--repeat`,
the largest peak RSS of those runs; `failed` / `timeout` never show a time:

- `qconvert import` (the lift alone, for reference);
- `qconvert convert --form quantized | integer | qdq` (default `--semantics onnx`);
- `qconvert convert --form quantized --semantics stablehlo`.

Each output is then parsed and verified by jaxlib's MLIR (`verified` column) when jax is installed.
A second table times the stages inside one process per form (lift, convert, print), wall and CPU
seconds (CPU time is steadier on a busy machine).

Usage: python benchmarks/convert_stablehlo.py [--model PATH] [--keep DIR] [--repeat K] [--timeout S]
       [--json PATH]
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import import_onnx  # the model builder
import parse_print  # the launcher and the row type
from parse_print import Row, child_env, last_line, measure_command

FORMS = [
    ("quantized", "onnx"),
    ("integer", "onnx"),
    ("qdq", "onnx"),
    ("quantized", "stablehlo"),
]


def measure(tool: str, command: list[str], output: Path, repeat: int, env: dict[str, str]) -> Row:
    return measure_command("convert", tool, command, output, repeat, env)


def verified_by_jaxlib(path: Path) -> str:
    """'yes', 'no: <error>', or 'not run' without jax (the `stablehlo` extra)."""
    try:
        from qconvert.backends.stablehlo import run
    except ImportError:
        return "not run"
    try:
        run.verify(path.read_text(encoding="utf-8"))
    except Exception as error:  # EngineError, VerifyError, or jax missing
        return f"no: {last_line(str(error))}"
    return "yes"


def stage_child(model: str, form: str, semantics: str) -> None:
    """Time lift / convert / print in this process; print one JSON line (wall and CPU seconds)."""
    import os
    import time

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    start = clocks()
    from qconvert.backends.stablehlo.convert import convert_to_stablehlo, stablehlo_lowerings
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.printer import write_module

    stablehlo_lowerings()  # imports every lowering module, so "imports" counts them
    marks = {"imports": clocks()}
    module = import_onnx(model)
    marks["lift"] = clocks()
    converted = convert_to_stablehlo(module, form, semantics)
    marks["convert"] = clocks()
    with open(os.devnull, "w", encoding="utf-8") as sink:
        write_module(converted, sink)
    marks["print"] = clocks()
    result, previous = {}, start
    for stage, now in marks.items():
        result[stage] = {"wall": now[0] - previous[0], "cpu": now[1] - previous[1]}
        previous = now
    print(json.dumps(result))


def stage_rows(model: Path, env: dict[str, str]) -> list[str]:
    import subprocess

    lines = [
        f"{'stages (one process)':<44} "
        + " ".join(f"{s:>15}" for s in ("imports", "lift", "convert", "print"))
    ]
    for form, semantics in FORMS:
        command = [sys.executable, __file__, "--stage-child", str(model), form, semantics]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        label = f"  --form {form} --semantics {semantics}"
        if done.returncode != 0:
            lines.append(f"{label:<44} failed: {last_line(done.stderr)}")
            continue
        times = json.loads(done.stdout.strip().splitlines()[-1])
        cells = [f"{t['wall']:6.2f}s ({t['cpu']:4.2f}cpu)" for t in times.values()]
        lines.append(f"{label:<44} " + " ".join(f"{c:>15}" for c in cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 5 and sys.argv[1] == "--stage-child":
        stage_child(*sys.argv[2:])
        return 0
    arguments = import_onnx.parse_model_arguments(__doc__, argv)
    launcher = parse_print.start_launcher(arguments.timeout)
    scratch = tempfile.TemporaryDirectory(prefix="qconvert-bench-convert-")
    try:
        work = Path(scratch.name)
        _, model = import_onnx.model_to_benchmark(arguments, work)
        model_mb = model.stat().st_size / 1e6
        _, _, floor_mb, _, _ = launcher.run(["/bin/true"])
        env = child_env()
        qconvert = [sys.executable, "-m", "qconvert"]
        lifted = work / "lifted.mlir"
        rows = [
            measure("qconvert import", [*qconvert, "import", str(model), "-o", str(lifted)], lifted, 1, env)
        ]
        outputs: dict[str, Path] = {}
        for form, semantics in FORMS:
            tool = f"convert --form {form}" + (" --semantics stablehlo" if semantics != "onnx" else "")
            output = work / f"{form}-{semantics}.mlir"
            command = [
                *qconvert,
                "convert",
                str(model),
                "--form",
                form,
                "--semantics",
                semantics,
                "-o",
                str(output),
            ]
            rows.append(measure(tool, command, output, arguments.repeat, env))
            outputs[tool] = output
        verdicts = {
            tool: verified_by_jaxlib(path) if path.exists() else "-" for tool, path in outputs.items()
        }
        stages = stage_rows(model, env)
    finally:
        launcher.close()
        scratch.cleanup()

    print(f"model: {model_mb:.1f} MB on disk (QDQ); launcher floor (peak RSS of `true`): {floor_mb:.1f} MB\n")
    print(f"{'row':<44} {'status':<8} {'seconds':>8} {'peak MB':>8}  {'jaxlib verifies':<16} note")
    for row in rows:
        seconds = f"{row.seconds:.2f}" if row.seconds is not None else "-"
        peak = f"{row.peak_mb:.0f}" if row.peak_mb is not None else "-"
        verdict = verdicts.get(row.tool, "")
        print(f"{row.tool:<44} {row.status:<8} {seconds:>8} {peak:>8}  {verdict:<16} {row.note}")
    print()
    print("\n".join(stages))
    if arguments.json is not None:
        payload = {
            "machine": platform.platform(),
            "python": platform.python_version(),
            "model_mb": model_mb,
            "floor_mb": floor_mb,
            "rows": [asdict(r) for r in rows],
            "verified": verdicts,
        }
        arguments.json.write_text(json.dumps(payload, indent=2))
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

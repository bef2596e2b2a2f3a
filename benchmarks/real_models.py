#!/usr/bin/env python3
"""Real quantized models: `convert --to stablehlo` per form and `check`, beside onnxruntime and torch-mlir.

The models are the corpus's MiniLM entries (models/corpus: all-MiniLM-L6-v2's real weights, exported by
torch with dynamic axes, quantized by onnxruntime's `quantize_dynamic` and `quantize_static` QDQ), built into
a temporary folder; `--model PATH --data NPZ` (repeatable, paired in order) benchmarks given models instead.
Dynamic axes are pinned from the data's arrays (`--input-shape NAME=DIMS` on every command that takes it).

Rows per model, each the whole command in a fresh process spawned from parse_print.py's launcher (peak MB is
that child's own ru_maxrss); `failed` / `timeout` never show a time:

- `qconvert convert --form quantized | integer | qdq` (`-o OUT.mlir`);
- `torch-mlir`: `torch-mlir-import-onnx MODEL`, then `torch-mlir-opt` with the ONNX -> torch -> StableHLO
  pipeline (`torch-onnx-to-torch-backend-pipeline,torch-backend-to-stablehlo-backend-pipeline`); the two
  steps' seconds are added, the peak is the larger one, and a failure names the step and its message;
- `onnxruntime run`: an InferenceSession (CPU, default optimizations) running the data's arrays once, as
  `check` feeds them: `seconds` is the whole process; the note gives the session's run time alone;
- `qconvert check` with the interpreter and with `--backend stablehlo --engine xla` on the same data; the
  note gives the verdict's last line and check's seconds over onnxruntime's run alone (`x ort`).

The conv decoder (`--built conv-decoder`): 87 Conv1d layers of 544 channels, 82 M parameters, quantized by
`quantize_dynamic` into 87 ConvInteger: the size of the TTS model on which `check` once took 406 s and 3.9 GB.

Usage: python benchmarks/real_models.py [--built minilm,conv-decoder | --model PATH --data NPZ ...]
       [--repeat K] [--timeout S] [--keep DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parse_print  # the launcher and the row type
from parse_print import Row, Sample, child_env, last_line, measure_command, run_child

REPO = parse_print.REPO
FORMS = ("quantized", "integer", "qdq")
PIPELINE = "builtin.module(torch-onnx-to-torch-backend-pipeline,torch-backend-to-stablehlo-backend-pipeline)"
ONNXRUNTIME_CHILD = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
model, data = sys.argv[1], np.load(sys.argv[2])
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()]
feeds = {name: data[name] for name in names}
started = time.perf_counter()
session.run(None, feeds)
print(json.dumps({"run_s": time.perf_counter() - started, "samples": len(feeds[names[0]])}))
"""


def input_shape_flags(data: Path) -> list[str]:
    """`--input-shape NAME=DIMS` per array of the data file, as `check` feeds it (the arrays whole)."""
    with np.load(data) as arrays:
        return [
            flag
            for name in arrays.files
            for flag in ("--input-shape", f"{name}={'x'.join(str(d) for d in arrays[name].shape)}")
        ]


def find_tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else None


def torch_mlir_row(model: Path, work: Path, repeat: int) -> Row:
    importer, optimizer = find_tool("torch-mlir-import-onnx"), find_tool("torch-mlir-opt")
    if importer is None or optimizer is None:
        return Row("convert", "torch-mlir", "not found", note="pip install torch-mlir")
    imported, lowered = work / f"{model.stem}.torch.mlir", work / f"{model.stem}.torch-mlir.stablehlo.mlir"
    row = Row("convert", "torch-mlir", "ok")
    for _ in range(repeat):
        steps = (
            ("import", [importer, str(model), "-o", str(imported)], imported),
            (
                "pipeline",
                [optimizer, f"--pass-pipeline={PIPELINE}", str(imported), "-o", str(lowered)],
                lowered,
            ),
        )
        seconds, peak = 0.0, 0.0
        for step, command, output in steps:
            output.unlink(missing_ok=True)
            try:
                code, step_seconds, step_peak, _, stderr = run_child(command)
            except TimeoutError:
                return Row(
                    "convert", "torch-mlir", "timeout", note=f"{step} over {parse_print.TIMEOUT:.0f} s"
                )
            if code != 0 or not output.exists():
                message = next((line for line in stderr.splitlines() if "error" in line), last_line(stderr))
                return Row("convert", "torch-mlir", "failed", note=f"{step}: {message.strip()[:160]}")
            seconds, peak = seconds + step_seconds, max(peak, step_peak)
        row.samples.append(Sample(seconds, peak))
    return row


def onnxruntime_row(model: Path, data: Path, repeat: int) -> Row:
    row = Row("run", "onnxruntime run", "ok")
    for _ in range(repeat):
        try:
            code, seconds, peak, stdout, stderr = run_child(
                [sys.executable, "-c", ONNXRUNTIME_CHILD, str(model), str(data)]
            )
        except TimeoutError:
            return Row("run", row.tool, "timeout", note=f"over {parse_print.TIMEOUT:.0f} s")
        if code != 0:
            return Row("run", row.tool, "failed", note=last_line(stderr))
        detail = json.loads(stdout.strip().splitlines()[-1])
        row.samples.append(Sample(seconds, peak, detail))
    run_seconds = sorted(s.detail["run_s"] for s in row.samples)[len(row.samples) // 2]
    row.note = f"session runs {run_seconds:.3f} s for {row.samples[0].detail['samples']:.0f} samples"
    return row


def check_row(tool: str, command: list[str], repeat: int, env: dict[str, str], ort_run: float | None) -> Row:
    """`qconvert check`: exit 0 or 1 both ran (1 is a verdict); the note carries the verdict line."""
    row = Row("check", tool, "ok")
    verdict = ""
    for _ in range(repeat):
        try:
            code, seconds, peak, stdout, stderr = run_child(command, env)
        except TimeoutError:
            return Row("check", tool, "timeout", note=f"over {parse_print.TIMEOUT:.0f} s")
        if code not in (0, 1):
            return Row("check", tool, "failed", note=last_line(stderr) or f"exit {code}")
        verdict = last_line(stdout) or last_line(stderr)
        if code == 1:
            row.status = "verdict 1"
        row.samples.append(Sample(seconds, peak))
    ratio = f"; {row.seconds / ort_run:.0f}x ort's run" if ort_run and row.seconds is not None else ""
    row.note = f"{verdict[:120]}{ratio}"
    return row


def benchmark_model(model: Path, data: Path, work: Path, repeat: int) -> list[Row]:
    env = child_env()
    qconvert = [sys.executable, "-m", "qconvert"]
    shapes = input_shape_flags(data)
    rows: list[Row] = []
    for form in FORMS:
        output = work / f"{model.stem}.{form}.mlir"
        command = [*qconvert, "convert", str(model), "--form", form, *shapes, "-o", str(output)]
        rows.append(
            measure_command("convert", f"qconvert convert --form {form}", command, output, repeat, env)
        )
    rows.append(torch_mlir_row(model, work, repeat))
    ort = onnxruntime_row(model, data, repeat)
    rows.append(ort)
    ort_run = None
    if ort.samples:
        ort_run = sorted(s.detail["run_s"] for s in ort.samples)[len(ort.samples) // 2]
    check = [*qconvert, "check", str(model), "--data", str(data), "--quiet"]
    rows.append(check_row("qconvert check (interpreter)", check, repeat, env, ort_run))
    rows.append(
        check_row(
            "qconvert check (stablehlo, xla)",
            [*check, "--backend", "stablehlo", "--engine", "xla"],
            repeat,
            env,
            ort_run,
        )
    )
    return rows


def corpus_models(folder: Path) -> list[tuple[Path, Path]]:
    """The corpus's MiniLM dynamic and QDQ entries, built into `folder` by models/corpus/build.py."""
    names = ("minilm.dynamic", "minilm.qdq")
    command = [
        sys.executable,
        str(REPO / "models" / "corpus" / "build.py"),
        "--out",
        str(folder),
        "--only",
        *names,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"building the corpus models failed:\n{done.stderr[-2000:]}")
    return [(folder / f"{name}.onnx", folder / "minilm.inputs.npz") for name in names]


def conv_decoder_model(
    folder: Path, layers: int = 87, channels: int = 544, frames: int = 256
) -> tuple[Path, Path]:
    """A TTS-decoder-sized 1-D conv stack (82 M parameters at the defaults: 87 Conv k=3 with residual Adds and
    Relus, 80 mel channels in and out), quantized by onnxruntime's `quantize_dynamic` (uint8 weights, as
    its ConvInteger requires): 87 ConvInteger with DynamicQuantizeLinear, the shape of the model in which
    issue 18 saw `check` take 406 s and 3.9 GB. Weights are seeded random: speed does not depend on them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    nodes, initializers = [], []
    previous, width = "mel", 80
    for index in range(layers):
        out_width = 80 if index == layers - 1 else channels
        weight = (rng.standard_normal((out_width, width, 3)) / np.sqrt(3 * width)).astype(np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{index}"),
            numpy_helper.from_array(np.zeros(out_width, np.float32), f"b{index}"),
        ]
        conv = f"conv{index}"
        nodes.append(
            helper.make_node("Conv", [previous, f"w{index}", f"b{index}"], [conv], pads=[1, 1], name=conv)
        )
        if 0 < index < layers - 1:  # residual blocks between the projections in and out
            nodes.append(helper.make_node("Relu", [conv], [f"relu{index}"], name=f"relu{index}"))
            nodes.append(
                helper.make_node("Add", [previous, f"relu{index}"], [f"add{index}"], name=f"add{index}")
            )
            conv = f"add{index}"
        previous, width = conv, out_width
    graph = helper.make_graph(
        nodes,
        "conv_decoder",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["batch", 80, "frames"])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["batch", 80, "frames"])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    float_path, quantized_path = folder / "conv_decoder.onnx", folder / "conv_decoder.dynamic.onnx"
    onnx.save(model, float_path)
    quantize_dynamic(str(float_path), str(quantized_path), weight_type=QuantType.QUInt8)
    data = folder / "conv_decoder.inputs.npz"
    np.savez(data, mel=rng.standard_normal((1, 80, frames)).astype(np.float32))
    return quantized_path, data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", default=[], help="an ONNX model (repeatable)")
    parser.add_argument("--data", type=Path, action="append", default=[], help="its inputs .npz (paired)")
    parser.add_argument("--keep", type=Path, help="build the corpus models into this folder and keep them")
    parser.add_argument(
        "--built",
        default="minilm,conv-decoder",
        help="models to build when no --model is given: minilm (the corpus's dynamic and QDQ MiniLM), "
        "conv-decoder (82 M parameters, 87 ConvInteger: issue 18's TTS case); comma-separated",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (median seconds, max peak)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    parser.add_argument("--json", type=Path, help="write every sample here")
    arguments = parser.parse_args(argv)
    if len(arguments.model) != len(arguments.data):
        parser.error("give one --data per --model")
    launcher = parse_print.start_launcher(arguments.timeout)
    scratch = tempfile.TemporaryDirectory(prefix="qconvert-bench-real-")
    results: dict[str, list[Row]] = {}
    try:
        work = Path(scratch.name)
        pairs = list(zip(arguments.model, arguments.data))
        built = set(arguments.built.split(",")) if not pairs else set()
        folder = arguments.keep.resolve() if arguments.keep else work / "models"
        folder.mkdir(parents=True, exist_ok=True)
        if "minilm" in built:
            print(f"building the corpus's MiniLM models in {folder} ...", file=sys.stderr)
            pairs += corpus_models(folder)
        if "conv-decoder" in built:
            print(f"building the 82 M-parameter ConvInteger decoder in {folder} ...", file=sys.stderr)
            pairs.append(conv_decoder_model(folder))
        _, _, floor_mb, _, _ = launcher.run(["/bin/true"])
        for model, data in pairs:
            print(f"benchmarking {model.name} ...", file=sys.stderr)
            results[model.name] = benchmark_model(model.resolve(), data.resolve(), work, arguments.repeat)
    finally:
        launcher.close()
        scratch.cleanup()

    print(f"machine: {platform.platform()}; launcher floor (peak RSS of `true`): {floor_mb:.1f} MB")
    for name, rows in results.items():
        print(f"\n{name}")
        print(f"  {'row':<34} {'status':<10} {'seconds':>8} {'peak MB':>8}  note")
        for row in rows:
            seconds = f"{row.seconds:.2f}" if row.seconds is not None else "-"
            peak = f"{row.peak_mb:.0f}" if row.peak_mb is not None else "-"
            print(f"  {row.tool:<34} {row.status:<10} {seconds:>8} {peak:>8}  {row.note}")
    if arguments.json is not None:
        payload = {
            "machine": platform.platform(),
            "floor_mb": floor_mb,
            "models": {name: [asdict(r) for r in rows] for name, rows in results.items()},
        }
        arguments.json.write_text(json.dumps(payload, indent=2))
    ours = [r for rows in results.values() for r in rows if r.tool.startswith("qconvert")]
    return 0 if all(r.status == "ok" for r in ours) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Speed of qconvert's interpreter on the ops it runs with its own kernels, beside onnx's reference
implementation (what it ran before) and onnxruntime; and on whole models.

Rows (in-process, the fastest of `--repeat` runs, after one warm-up run):

- `ops`: one-node models on seeded random inputs of realistic sizes (Conv 2-D and 1-D, ConvInteger,
  MatMulInteger, ConvTranspose, MaxPool, AveragePool, BatchNormalization, Resize). Columns: onnx's
  `ReferenceEvaluator` on the node, `qconvert.interpret.Interpreter.run` on the lifted node, onnxruntime
  (CPU, graph optimizations off, as `check` runs it), and how the interpreter's output agrees with
  onnxruntime's (`bit-exact` or the max |diff|).
- `--tts`: a speech-synthesis-like stack of `--layers` Conv1d (`--channels`, kernel 5, `--frames`) built
  with onnx.helper, quantized by onnxruntime's `quantize_dynamic` (ConvInteger + DynamicQuantizeLinear):
  the shape of the issue's 82M-parameter TTS model (87 ConvInteger) at a chosen size. Rows: the
  interpreter with its kernels, the interpreter with `ONNX_KERNELS` emptied (every generic op on onnx's
  reference: the interpreter before the kernels; skipped with `--no-reference`), onnxruntime.
- `--model PATH --inputs NPZ` (repeatable pairs): the same three rows for a given model.

Usage: python benchmarks/interpreter_ops.py [--repeat K] [--tts [--layers N --channels C --frames T]]
       [--model M.onnx --inputs M.npz ...] [--no-reference] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import ONNX_KERNELS, Interpreter


def fastest(function: Callable[[], object], repeat: int) -> tuple[float, object]:
    result = function()  # warm-up: imports, evaluator and session caches
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def agreement(ours: list[np.ndarray], theirs: list[np.ndarray]) -> str:
    if all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(ours, theirs)):
        return "bit-exact"
    worst = max(
        float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in zip(ours, theirs)
    )
    return f"max |diff| {worst:.3g}"


def one_node(
    op_type: str, feeds: dict[str, np.ndarray], attributes: dict, opset: int = 17
) -> onnx.ModelProto:
    node = helper.make_node(op_type, list(feeds), ["y"], **attributes)
    graph = helper.make_graph(
        [node],
        op_type,
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [onnx.ValueInfoProto(name="y")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def op_cases(rng: np.random.Generator) -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def u8(*shape: int) -> np.ndarray:
        return rng.integers(0, 256, shape).astype(np.uint8)

    image = f32(1, 32, 56, 56)
    bn = {
        "x": image,
        "s": f32(32),
        "b": f32(32),
        "m": f32(32),
        "v": rng.uniform(0.5, 2, 32).astype(np.float32),
    }
    cases = [
        ("Conv 3x3 32->64 @56x56", "Conv", {"x": image, "w": f32(64, 32, 3, 3)}, {"pads": [1, 1, 1, 1]}, 17),
        (
            "Conv depthwise 3x3 @56x56",
            "Conv",
            {"x": image, "w": f32(32, 1, 3, 3)},
            {"pads": [1] * 4, "group": 32},
            17,
        ),
        (
            "Conv1d k5 256->256 @400",
            "Conv",
            {"x": f32(1, 256, 400), "w": f32(256, 256, 5)},
            {"pads": [2, 2]},
            17,
        ),
        (
            "ConvInteger k5 256->256 @400",
            "ConvInteger",
            {"x": u8(1, 256, 400), "w": u8(256, 256, 5), "xz": u8(), "wz": u8()},
            {"pads": [2, 2]},
            17,
        ),
        (
            "MatMulInteger 48x384 @ 384x1536",
            "MatMulInteger",
            {"a": u8(3, 16, 384), "b": rng.integers(-128, 128, (384, 1536)).astype(np.int8), "az": u8()},
            {},
            17,
        ),
        (
            "ConvTranspose 1d x8 (vocoder)",
            "ConvTranspose",
            {"x": f32(1, 128, 100), "w": f32(128, 64, 16)},
            {"strides": [8], "pads": [4, 4]},
            17,
        ),
        (
            "MaxPool 3x3/2 @56x56",
            "MaxPool",
            {"x": image},
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4},
            17,
        ),
        (
            "AveragePool 3x3/1 @56x56",
            "AveragePool",
            {"x": image},
            {"kernel_shape": [3, 3], "pads": [1] * 4},
            17,
        ),
        ("BatchNormalization (momentum)", "BatchNormalization", bn, {"momentum": 0.9}, 9),
        (
            "Resize bilinear x2 @56x56",
            "Resize",
            {"x": image, "roi": np.array([], np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
            {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
            13,
        ),
    ]
    return [(name, one_node(op, feeds, attrs, opset), feeds) for name, op, feeds, attrs, opset in cases]


def run_ops(repeat: int) -> list[dict]:
    rows = []
    for name, model, feeds in op_cases(np.random.default_rng(0)):
        reference_seconds, old = fastest(lambda m=model, x=feeds: ReferenceEvaluator(m).run(None, x), repeat)
        interpreter = Interpreter(import_onnx(model))
        ours_seconds, ours = fastest(lambda i=interpreter, x=feeds: list(i.run(x).values()), repeat)
        runtime = session(model)
        ort_seconds, theirs = fastest(lambda s=runtime, x=feeds: s.run(None, x), repeat)
        rows.append(
            {
                "case": name,
                "onnx reference s": reference_seconds,
                "interpreter s": ours_seconds,
                "onnxruntime s": ort_seconds,
                "agreement": agreement(ours, theirs),  # type: ignore[arg-type]
                "reference agreement": agreement(old, theirs),  # type: ignore[arg-type]
            }
        )
    return rows


def tts_model(layers: int, channels: int, frames: int, directory: Path) -> tuple[str, dict[str, np.ndarray]]:
    """A Conv1d stack (tanh, residual) quantized by quantize_dynamic: ConvInteger per layer."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    nodes, weights = [], []
    previous = "mel"
    for layer in range(layers):
        w = (rng.standard_normal((channels, channels, 5)) / np.sqrt(channels * 5)).astype(np.float32)
        weights += [
            numpy_helper.from_array(w, f"w{layer}"),
            numpy_helper.from_array(np.zeros(channels, np.float32), f"b{layer}"),
        ]
        nodes += [
            helper.make_node("Conv", [previous, f"w{layer}", f"b{layer}"], [f"c{layer}"], pads=[2, 2]),
            helper.make_node("Tanh", [f"c{layer}"], [f"t{layer}"]),
            helper.make_node("Add", [f"t{layer}", previous], [f"h{layer}"]),
        ]
        previous = f"h{layer}"
    graph = helper.make_graph(
        nodes,
        "tts_like",
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, channels, "frames"])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    float_path, quantized_path = directory / "tts.float.onnx", directory / "tts.dynamic.onnx"
    onnx.save(model, float_path)
    quantize_dynamic(float_path, quantized_path, weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv"])
    return str(quantized_path), {"mel": rng.standard_normal((1, channels, frames)).astype(np.float32)}


def run_model(name: str, path: str, feeds: dict[str, np.ndarray], repeat: int, reference: bool) -> list[dict]:
    model = onnx.load(path)
    interpreter = Interpreter(import_onnx(model))
    ours_seconds, ours = fastest(lambda: list(interpreter.run(feeds).values()), repeat)
    runtime = session(path)
    ort_seconds, theirs = fastest(lambda: runtime.run(None, feeds), repeat)
    rows = [
        {"case": f"{name}: interpreter", "seconds": ours_seconds, "agreement": agreement(ours, theirs)},  # type: ignore[arg-type]
        {"case": f"{name}: onnxruntime", "seconds": ort_seconds},
    ]
    if reference:
        saved = dict(ONNX_KERNELS)
        ONNX_KERNELS.clear()  # every generic op on onnx's reference: the interpreter before its kernels
        try:
            old = Interpreter(import_onnx(model))
            old_seconds, old_outputs = fastest(lambda: list(old.run(feeds).values()), 1)
            rows.insert(
                1,
                {
                    "case": f"{name}: interpreter on onnx reference",
                    "seconds": old_seconds,
                    "agreement": agreement(old_outputs, theirs),
                },
            )  # type: ignore[arg-type]
        except Exception as error:  # the reference may fail outright (BatchNormalization_6, GatherElements)
            rows.insert(
                1,
                {
                    "case": f"{name}: interpreter on onnx reference",
                    "seconds": None,
                    "agreement": f"failed: {error}",
                },
            )
        finally:
            ONNX_KERNELS.update(saved)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tts", action="store_true")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--inputs", action="append", default=[])
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--skip-ops", action="store_true")
    parser.add_argument("--json")
    arguments = parser.parse_args()
    results: dict[str, list[dict]] = {}
    if not arguments.skip_ops:
        results["ops"] = run_ops(arguments.repeat)
        header = ("op", "onnx ref s", "interp s", "ort s", "ref/interp", "interp/ort")
        print(
            "{:36s} {:>11s} {:>10s} {:>9s} {:>10s} {:>10s}  interpreter vs ort | reference vs ort".format(
                *header
            )
        )
        for row in results["ops"]:
            reference, ours, theirs = row["onnx reference s"], row["interpreter s"], row["onnxruntime s"]
            print(
                f"{row['case']:36s} {reference:11.4f} {ours:10.4f} {theirs:9.5f} {reference / ours:10.1f}"
                f" {ours / theirs:10.1f}  {row['agreement']} | {row['reference agreement']}"
            )
    models: list[tuple[str, str, dict[str, np.ndarray]]] = []
    with tempfile.TemporaryDirectory() as directory:
        if arguments.tts:
            path, feeds = tts_model(arguments.layers, arguments.channels, arguments.frames, Path(directory))
            models.append((f"tts-like {arguments.layers}x ConvInteger {arguments.channels}ch", path, feeds))
        for path, inputs in zip(arguments.model, arguments.inputs):
            models.append((Path(path).name, path, dict(np.load(inputs))))
        results["models"] = []
        for name, path, feeds in models:
            results["models"] += run_model(name, path, feeds, arguments.repeat, not arguments.no_reference)
    for row in results["models"]:
        seconds = "not run" if row["seconds"] is None else f"{row['seconds']:.3f} s"
        print(f"{row['case']:60s} {seconds:>10s}  {row.get('agreement', '')}")
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

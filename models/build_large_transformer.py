"""Build a transformer-shaped model over protobuf's 2 GiB limit, its weights in external data (issue 23).

Never committed: tests/large/ and benchmarks/large_model.py build it once into a cache folder. Each of
`--layers` feed-forward blocks is x + MatMul(Relu(MatMul(x, W_up)), W_down), x of shape [1, SEQ, hidden],
W_up [hidden, 4 x hidden] and W_down [4 x hidden, hidden]: a few huge MatMul weights, as in a large
language model's MLPs. Two forms:

- float (`STEM.onnx`): float32 weights, for `calibrate`;
- QDQ (`STEM.qdq.onnx`): int8 weights (symmetric, one scale per output column) read by DequantizeLinear,
  every MatMul input quantized with a QuantizeLinear / DequantizeLinear pair of a fixed scale, as
  onnxruntime's quantizer writes a static int8 model.

The defaults (5 layers, hidden 4096 float / 8192 QDQ) give each form 10 weights of 256 MiB: 2.5 GiB
(2.68 GB), the smallest this shape makes over 2 GiB with the weights split evenly. Weights are written
straight to the data file in chunks (seeded), never gathered into one protobuf, so building takes little
memory. Writes STEM(.qdq).onnx, STEM(.qdq).onnx.data and STEM.inputs.npz (8 seeded samples).

    .venv/bin/python models/build_large_transformer.py --out DIR [--layers 5] [--hidden 4096] [--form both]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

SEED = 23
SEQ = 8
OPSET = 17
STEM = "large_transformer"
ACTIVATION_SCALE = 1.0 / 16  # the fixed scale of every activation's Q/DQ pair (int8, zero point 0)
CHUNK_ROWS = 256  # rows of a weight generated and written at a time


def _external(
    name: str, data_type: int, dims: list[int], location: str, offset: int, length: int
) -> TensorProto:
    """An initializer whose bytes are in `location` at `offset` (written separately)."""
    tensor = TensorProto(name=name, data_type=data_type, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


class _DataFile:
    """The external data file, appended weight by weight (each at a 64 KiB-aligned offset, as onnx does
    for memory mapping)."""

    ALIGN = 65536

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stream = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.offset = 0

    def weight(
        self, rows: int, columns: int, quantized: bool, rng: np.random.Generator
    ) -> tuple[int, int, np.ndarray]:
        """Write a [rows, columns] weight (int8 codes, or those codes times their scale as float32): its
        offset, length, and the per-column scales."""
        padding = -self.offset % self.ALIGN
        self.stream.write(b"\0" * padding)
        self.offset += padding
        start = self.offset
        scales = np.full(columns, 1.0 / (127 * np.sqrt(rows) / 4), dtype=np.float32)  # outputs ~ unit range
        for first in range(0, rows, CHUNK_ROWS):
            count = min(CHUNK_ROWS, rows - first)
            codes = np.frombuffer(rng.bytes(count * columns), np.int8).reshape(count, columns).copy()
            codes[codes == -128] = -127  # symmetric int8, as onnxruntime's weights
            chunk = codes if quantized else codes.astype(np.float32) * scales
            self.stream.write(chunk.tobytes())
            self.offset += chunk.nbytes
        return start, self.offset - start, scales

    def close(self) -> None:
        self.stream.close()


def build(folder: Path, layers: int, hidden: int, quantized: bool) -> Path:
    """Write one form of the model into `folder`; returns the model's path."""
    stem = f"{STEM}.qdq" if quantized else STEM
    model_path = folder / f"{stem}.onnx"
    location = f"{stem}.onnx.data"
    data = _DataFile(folder / location)
    rng = np.random.default_rng(SEED)
    ffn = 4 * hidden
    nodes: list[onnx.NodeProto] = []
    initializers: list[TensorProto] = []
    if quantized:
        initializers += [
            helper.make_tensor("act_scale", TensorProto.FLOAT, [], [ACTIVATION_SCALE]),
            helper.make_tensor("act_zero", TensorProto.INT8, [], [0]),
        ]

    def activation(name: str) -> str:
        """`name` through its Q/DQ pair (QDQ form), or as it is."""
        if not quantized:
            return name
        nodes.append(helper.make_node("QuantizeLinear", [name, "act_scale", "act_zero"], [f"{name}_q"]))
        nodes.append(
            helper.make_node("DequantizeLinear", [f"{name}_q", "act_scale", "act_zero"], [f"{name}_dq"])
        )
        return f"{name}_dq"

    def weight(name: str, rows: int, columns: int) -> str:
        offset, length, scales = data.weight(rows, columns, quantized, rng)
        kind = TensorProto.INT8 if quantized else TensorProto.FLOAT
        initializers.append(_external(name, kind, [rows, columns], location, offset, length))
        if not quantized:
            return name
        initializers.append(helper.make_tensor(f"{name}_scale", TensorProto.FLOAT, [columns], scales))
        initializers.append(
            helper.make_tensor(f"{name}_zero", TensorProto.INT8, [columns], np.zeros(columns))
        )
        inputs = [name, f"{name}_scale", f"{name}_zero"]
        nodes.append(helper.make_node("DequantizeLinear", inputs, [f"{name}_dq"], axis=1))
        return f"{name}_dq"

    current = "x"
    for layer in range(layers):
        up = weight(f"layer{layer}.up", hidden, ffn)
        nodes.append(helper.make_node("MatMul", [activation(current), up], [f"layer{layer}.up_out"]))
        nodes.append(helper.make_node("Relu", [f"layer{layer}.up_out"], [f"layer{layer}.relu"]))
        down = weight(f"layer{layer}.down", ffn, hidden)
        nodes.append(
            helper.make_node("MatMul", [activation(f"layer{layer}.relu"), down], [f"layer{layer}.down_out"])
        )
        nodes.append(helper.make_node("Add", [current, f"layer{layer}.down_out"], [f"layer{layer}.out"]))
        current = f"layer{layer}.out"
    nodes.append(helper.make_node("Identity", [activation(current)], ["y"]))
    data.close()
    graph = helper.make_graph(
        nodes,
        stem.replace(".", "_"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, hidden])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qconvert")
    model.ir_version = 8
    temporary = model_path.with_suffix(".onnx.tmp")
    onnx.save_model(model, temporary)  # the graph alone: the weights are already in the data file
    os.replace(temporary, model_path)
    return model_path


def write_inputs(folder: Path, hidden: int, stem: str) -> Path:
    """8 seeded samples for `x`, on axis 0 (the model's batch dim is fixed at 1: 8 runs)."""
    path = folder / f"{stem}.inputs.npz"
    np.savez(path, x=np.random.default_rng(SEED).standard_normal((8, SEQ, hidden)).astype(np.float32))
    return path


def default_cache() -> Path:
    """Where tests and the benchmark keep the models: $QCONVERT_LARGE_MODEL_CACHE, else the user's cache."""
    given = os.environ.get("QCONVERT_LARGE_MODEL_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "qconvert" / "large_transformer"


def bytes_needed(layers: int, hidden: int) -> int:
    """Disk the two forms take (each: 2 x layers weights of hidden x 4 hidden float32 / 2h x 8h int8)."""
    return 2 * (2 * layers * hidden * 4 * hidden * 4) + 2**26


def ensure_built(folder: Path, layers: int = 5, hidden: int = 4096) -> dict[str, Path] | str:
    """The models in `folder`, built once (a stamp names this script's content and the sizes; anything
    else there is rebuilt). Returns their paths, or why they cannot be built (not enough free disk)."""
    stamp_text = f"{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()} {layers} {hidden}\n"
    stamp = folder / "built.stamp"
    paths = {
        "float": folder / f"{STEM}.onnx",
        "float_data": folder / f"{STEM}.inputs.npz",
        "qdq": folder / f"{STEM}.qdq.onnx",
        "qdq_data": folder / f"{STEM}.qdq.inputs.npz",
    }
    if stamp.exists() and stamp.read_text() == stamp_text and all(p.exists() for p in paths.values()):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    for old in folder.glob(f"{STEM}*"):
        old.unlink()
    free, needed = shutil.disk_usage(folder).free, bytes_needed(layers, hidden)
    if free < needed + 2**30:  # and 1 GiB to spare for the outputs' folder
        return f"{folder}: {free / 2**30:.1f} GiB free, the models need {needed / 2**30:.1f} GiB"
    build(folder, layers, hidden, quantized=False)
    write_inputs(folder, hidden, STEM)
    build(folder, layers, 2 * hidden, quantized=True)
    write_inputs(folder, 2 * hidden, f"{STEM}.qdq")
    stamp.write_text(stamp_text)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write into")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=4096, help="float form's hidden size (QDQ: twice it)")
    parser.add_argument("--form", choices=("float", "qdq", "both"), default="both")
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    if arguments.form in ("float", "both"):
        print(build(arguments.out, arguments.layers, arguments.hidden, quantized=False))
        print(write_inputs(arguments.out, arguments.hidden, STEM))
    if arguments.form in ("qdq", "both"):
        print(build(arguments.out, arguments.layers, 2 * arguments.hidden, quantized=True))
        print(write_inputs(arguments.out, 2 * arguments.hidden, f"{STEM}.qdq"))


if __name__ == "__main__":
    main()

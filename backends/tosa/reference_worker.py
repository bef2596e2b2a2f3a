"""Run TOSA graphs on the TOSA reference model: the script `run.py` starts with tosa-tools' own Python.

NOTE: this file runs inside the tosa-tools virtual environment (numpy<2.2, its own ml_dtypes), never inside
qconvert's: it imports nothing from qconvert. Protocol: an npz on stdin, an npz on stdout (no pickles).

Request: `request` holds JSON `{"jobs": [{"mlir": TEXT | null, "inputs": N}, ...]}`; job i's inputs are
arrays `job{i}_input{j}`; a job without MLIR text brings its flatbuffer as uint8 array `job{i}_flatbuffer`.
MLIR text is serialized with `tosa-opt --tosa-serialize` (beside this Python). Response: `response` holds
JSON `{"jobs": [{"status": S, "outputs": K, "messages": TEXT}]}` and arrays `job{i}_output{k}` (none unless
S is TOSA_VALID); S is TOSA_VALID, TOSA_ERROR, TOSA_UNPREDICTABLE, SERIALIZE_FAILED or RUN_FAILED (the
binding refused the inputs). `messages` is what tosa-opt or the reference model printed for that job (the
model's REQUIRE / ERROR_IF reasons). Graphs with i48 inputs or outputs run on the model's command-line runner
instead of its binding, which refuses i48 inputs and returns i48 outputs as empty float64 arrays. A job with
`"describe": true` is not run but decoded: its status is DESCRIBED, `graph` gives the first block's
operators, attribute fields and tensors; its outputs are the constants.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import tosa_reference_model

TOSA_OPT = os.path.join(os.path.dirname(sys.executable), "tosa-opt")


def serialize(text: str) -> tuple[bytes | None, str]:
    """The flatbuffer of TOSA MLIR text, or None and tosa-opt's diagnostics."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "graph.tosa")
        completed = subprocess.run(
            [TOSA_OPT, f"--tosa-serialize=tosa-flatbuffer-filename={path}", "-", "-o", os.devnull],
            input=text,
            capture_output=True,
            text=True,
        )
        if completed.returncode != 0:
            return None, completed.stderr
        with open(path, "rb") as file:
            return file.read(), completed.stderr


def run_capturing_output(flatbuffer: bytes, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], str, str]:
    """Run one graph with file descriptors 1 and 2 sent to a temporary file: the model prints its reasons
    there, and stdout must carry only the response."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as capture:
        for fd in saved:
            os.dup2(capture.fileno(), fd)
        try:
            outputs, status = tosa_reference_model.run(flatbuffer, inputs)
            name = status.name
        except ValueError as error:  # the binding refuses inputs of the wrong type or shape
            outputs, name = [], "RUN_FAILED"
            os.write(2, f"tosa_reference_model.run: {error}\n".encode())
        finally:
            for fd, original in saved.items():
                os.dup2(original, fd)
                os.close(original)
        capture.seek(0)
        messages = capture.read().decode(errors="replace")
    return list(outputs), name, messages


# Flatbuffer element types -> numpy dtype of their little-endian bytes (INT48: 6 bytes each, read as int64).
ELEMENT_TYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT48": np.int64,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
}


def enum_names(enum_class: type) -> dict[int, str]:
    return {value: name for name, value in vars(enum_class).items() if not name.startswith("_")}


def tensor_data(raw: bytes, type_name: str, count: int) -> np.ndarray | None:
    """The `count` values of a constant's bytes (serializers may pad the data), or None for element types
    this decoder does not read."""
    if type_name not in ELEMENT_TYPES:
        return None
    dtype = np.dtype(ELEMENT_TYPES[type_name])
    if type_name != "INT48":
        return np.frombuffer(raw[: count * dtype.itemsize], dtype=dtype.newbyteorder("<")).astype(dtype)
    grouped = np.frombuffer(raw[: count * 6], np.uint8).reshape(-1, 6).astype(np.int64)
    unsigned = sum(grouped[:, k] << (8 * k) for k in range(6))
    return np.where(unsigned >= 1 << 47, unsigned - (1 << 48), unsigned)


def attribute_fields(operator: object, attribute_name: str) -> dict[str, object]:
    """Every scalar field of an operator's attribute table (RescaleAttribute: Scale32, RoundingMode, ...)."""
    import importlib

    table = operator.Attribute()  # type: ignore[attr-defined]
    if table is None or attribute_name == "NONE":
        return {}
    module = importlib.import_module(f"tosa.{attribute_name}")
    attribute = getattr(module, attribute_name)()
    attribute.Init(table.Bytes, table.Pos)
    fields: dict[str, object] = {}
    for name in dir(attribute):
        if not name[:1].isupper() or name.startswith("GetRootAs") or name.endswith(("IsNone", "Length")):
            continue
        try:
            value = getattr(attribute, name)()
        except TypeError:  # a vector accessor (takes an index)
            continue
        if isinstance(value, (bool, int, float)):
            fields[name] = value
    return fields


def describe(flatbuffer: bytes) -> tuple[dict[str, object], list[np.ndarray]]:
    """The first block of a TOSA flatbuffer: operators (name, inputs, outputs, attribute fields) and tensors
    (shape, element type); the constants' values are the returned arrays, in `constants` order."""
    from tosa import Attribute, DType, Op, TosaGraph

    ops, types, attributes = enum_names(Op.Op), enum_names(DType.DType), enum_names(Attribute.Attribute)
    block = TosaGraph.TosaGraph.GetRootAs(flatbuffer, 0).Regions(0).Blocks(0)
    operators = []
    for i in range(block.OperatorsLength()):
        operator = block.Operators(i)
        attribute_name = attributes.get(operator.AttributeType(), "NONE")
        operators.append(
            {
                "op": ops[operator.Op()],
                "inputs": [operator.Inputs(j).decode() for j in range(operator.InputsLength())],
                "outputs": [operator.Outputs(j).decode() for j in range(operator.OutputsLength())],
                "attribute": attribute_name,
                "fields": attribute_fields(operator, attribute_name),
            }
        )
    tensors, constants, arrays = {}, [], []
    for i in range(block.TensorsLength()):
        tensor = block.Tensors(i)
        name, type_name = tensor.Name().decode(), types[tensor.Type()]
        shape = [] if tensor.ShapeIsNone() else [int(d) for d in tensor.ShapeAsNumpy()]
        tensors[name] = {"shape": shape, "type": type_name}
        if tensor.DataLength() > 0:
            data = tensor_data(tensor.DataAsNumpy().tobytes(), type_name, int(np.prod(shape, dtype=np.int64)))
            if data is not None:
                constants.append(name)
                arrays.append(data.reshape(shape))
    graph = {
        "operators": operators,
        "tensors": tensors,
        "constants": constants,
        "inputs": [block.Inputs(j).decode() for j in range(block.InputsLength())],
        "outputs": [block.Outputs(j).decode() for j in range(block.OutputsLength())],
    }
    return graph, arrays


def run_by_command_line(flatbuffer: bytes, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], str, str]:
    """Run one graph with the model's command-line runner, which reads and writes i48 tensors (.npy int64)
    where the Python binding refuses i48 inputs and returns i48 outputs as empty float64 arrays."""
    graph, _ = describe(flatbuffer)
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "graph.tosa"), "wb") as file:
            file.write(flatbuffer)
        input_files = [f"input{j}.npy" for j in range(len(inputs))]
        output_files = [f"output{k}.npy" for k in range(len(graph["outputs"]))]
        for name, array in zip(input_files, inputs):
            np.save(os.path.join(folder, name), array)
        description = {
            "tosa_file": "graph.tosa",
            "ifm_name": graph["inputs"],
            "ifm_file": input_files,
            "ofm_name": graph["outputs"],
            "ofm_file": output_files,
        }
        with open(os.path.join(folder, "desc.json"), "w") as file:
            json.dump(description, file)  # a test descriptor also runs graphs without placeholders
        command = [
            os.path.join(os.path.dirname(sys.executable), "tosa_reference_model"),
            "--test_desc", os.path.join(folder, "desc.json"), "--output_dir", folder,
        ]  # fmt: skip
        completed = subprocess.run(command, capture_output=True, text=True)
        messages = completed.stdout + completed.stderr
        if completed.returncode == 0:
            return [np.load(os.path.join(folder, name)) for name in output_files], "TOSA_VALID", messages
    verdict = re.search(r"Graph result: (\w+)", messages)
    return [], f"TOSA_{verdict.group(1)}" if verdict else "RUN_FAILED", messages


def is_wide(outputs: list[np.ndarray], inputs: list[np.ndarray], status: str) -> bool:
    """Whether the binding could not carry an i48 tensor: it refused an int64 input, or returned an output
    as an empty float64 array (its rendering of i48)."""
    if status == "RUN_FAILED":
        return any(np.asarray(a).dtype == np.int64 for a in inputs)
    return any(np.asarray(o).dtype == np.float64 and np.asarray(o).size == 0 for o in outputs)


def main() -> None:
    request = np.load(io.BytesIO(sys.stdin.buffer.read()), allow_pickle=False)
    jobs = json.loads(str(request["request"]))["jobs"]
    arrays: dict[str, np.ndarray] = {}
    results = []
    for index, job in enumerate(jobs):
        inputs = [request[f"job{index}_input{j}"] for j in range(job["inputs"])]
        if job.get("mlir") is not None:
            flatbuffer, messages = serialize(job["mlir"])
            if flatbuffer is None:
                results.append({"status": "SERIALIZE_FAILED", "outputs": 0, "messages": messages})
                continue
        else:
            flatbuffer = request[f"job{index}_flatbuffer"].tobytes()
        if job.get("describe"):
            graph, constants = describe(flatbuffer)
            for k, constant in enumerate(constants):
                arrays[f"job{index}_output{k}"] = constant
            results.append({"status": "DESCRIBED", "outputs": len(constants), "messages": "", "graph": graph})
            continue
        outputs, status, messages = run_capturing_output(flatbuffer, inputs)
        if is_wide(outputs, inputs, status):
            outputs, status, messages = run_by_command_line(flatbuffer, inputs)
        if status != "TOSA_VALID":
            outputs = []  # what an invalid graph leaves in its outputs means nothing (and may be None)
        for k, output in enumerate(outputs):
            arrays[f"job{index}_output{k}"] = np.asarray(output)
        results.append({"status": status, "outputs": len(outputs), "messages": messages})
    arrays["response"] = np.array(json.dumps({"jobs": results}))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    sys.stdout.buffer.write(buffer.getvalue())
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()

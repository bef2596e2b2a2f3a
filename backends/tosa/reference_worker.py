"""Run TOSA graphs on the TOSA reference model: the script `run.py` starts with tosa-tools' own Python.

NOTE: this file runs inside the tosa-tools virtual environment (numpy<2.2, its own ml_dtypes), never inside
qconvert's: it imports nothing from qconvert. Protocol: an npz on stdin, an npz on stdout (no pickles).

Request: `request` holds JSON `{"jobs": [{"mlir": TEXT | null, "inputs": N}, ...]}`; job i's inputs are
arrays `job{i}_input{j}`; a job without MLIR text brings its flatbuffer as uint8 array `job{i}_flatbuffer`.
MLIR text is serialized with `tosa-opt --tosa-serialize` (beside this Python). Response: `response` holds
JSON `{"jobs": [{"status": S, "outputs": K, "messages": TEXT}]}` and arrays `job{i}_output{k}` (none unless
S is TOSA_VALID); S is TOSA_VALID, TOSA_ERROR, TOSA_UNPREDICTABLE, SERIALIZE_FAILED or RUN_FAILED (the binding
refused the inputs). `messages` is what tosa-opt or the reference model printed for that job (the model's
REQUIRE / ERROR_IF reasons).
"""

from __future__ import annotations

import io
import json
import os
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
        outputs, status, messages = run_capturing_output(flatbuffer, inputs)
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

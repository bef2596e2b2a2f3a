"""Run TOSA on its engines from qconvert's environment: the TOSA reference model and `tosa-opt`, which live in
tosa-tools' own virtual environment (tosa-tools 2026.8.0 pins numpy<2.2 and ml-dtypes 0.5.3, and installs
top-level packages named `tests`, `runner`, `serializer`), driven as subprocesses.

    from qconvert.backends.tosa import ReferenceJob, run_reference, run_reference_jobs, validate
    (y,) = run_reference(mlir_text, [x])              # EngineError unless the graph ran (TOSA_VALID)
    results = run_reference_jobs([ReferenceJob(mlir=text, inputs=(x,)), ...])   # one process, statuses kept
    validate(mlir_text, profiles=("pro_int",), extensions=("doubleround",))      # '' or tosa-opt's errors

The environment's Python is `$QCONVERT_TOSA_PYTHON`, else `<checkout>/.venv-tosa/bin/python` (.ci/run makes
it: `python3.11 -m venv .venv-tosa && .venv-tosa/bin/pip install tosa-tools==2026.8.0`); `tosa-opt` and
TOSA's test generators are the scripts beside it. `reference_worker.py` is the script that Python runs.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import qconvert
from qconvert.errors import InputError, QConvertError

TOSA_PYTHON_ENV = "QCONVERT_TOSA_PYTHON"
TOSA_TOOLS_VERSION = "2026.8.0"
WORKER = Path(__file__).with_name("reference_worker.py")
VALID = "TOSA_VALID"


class EngineError(QConvertError):
    """A TOSA engine failed on a graph qconvert gave it (exit code 1: the check failed)."""

    exit_code = 1


@dataclass(frozen=True)
class ReferenceJob:
    """One graph for the reference model: TOSA MLIR text (serialized by tosa-opt) or a flatbuffer."""

    inputs: tuple[np.ndarray, ...]
    mlir: str | None = None
    flatbuffer: bytes | None = None
    describe: bool = False  # decode the graph (operators, attributes, constants) instead of running it

    def __post_init__(self) -> None:
        assert (self.mlir is None) != (self.flatbuffer is None), "a job is MLIR text or a flatbuffer"


@dataclass(frozen=True)
class ReferenceResult:
    """The reference model's verdict on one job: `status` is TOSA_VALID, TOSA_ERROR (an ERROR_IF failed),
    TOSA_UNPREDICTABLE (a REQUIRE failed), SERIALIZE_FAILED (tosa-opt refused the text) or RUN_FAILED (the
    model's binding refused the inputs: wrong type or shape)."""

    status: str
    outputs: tuple[np.ndarray, ...] = ()
    messages: str = field(default="", repr=False)
    graph: dict[str, Any] | None = field(default=None, repr=False)  # a described job's block


@dataclass(frozen=True)
class GraphDescription:
    """A TOSA flatbuffer's first block, decoded by tosa-tools' own schema classes."""

    operators: tuple[
        dict[str, Any], ...
    ]  # {"op": "RESCALE", "inputs": [...], "outputs": [...], "fields": {...}}
    tensors: dict[str, dict[str, Any]]  # name -> {"shape": [...], "type": "INT8"}
    constants: dict[str, np.ndarray]  # name -> values (i48 as int64)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def default_tosa_python() -> Path:
    """`<checkout>/.venv-tosa/bin/python`, the checkout being the folder that holds the qconvert package."""
    return Path(qconvert.__file__).resolve().parents[1] / ".venv-tosa" / "bin" / "python"


def tosa_python() -> Path | None:
    """The Python of the tosa-tools environment, or None when there is none (engines not installed)."""
    configured = os.environ.get(TOSA_PYTHON_ENV)
    path = Path(configured) if configured else default_tosa_python()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing_message() -> str:
    """Why the TOSA engines cannot run, and how to install them."""
    where = os.environ.get(TOSA_PYTHON_ENV) or str(default_tosa_python())
    return (
        f"the TOSA reference model needs tosa-tools=={TOSA_TOOLS_VERSION} in a virtual environment of its "
        f"own (no Python at {where}); create it with `python3.11 -m venv .venv-tosa && .venv-tosa/bin/pip "
        f"install tosa-tools=={TOSA_TOOLS_VERSION}` or point ${TOSA_PYTHON_ENV} at its python"
    )


def require_tosa_python() -> Path:
    """The tosa-tools Python; InputError saying how to install it when there is none."""
    python = tosa_python()
    if python is None:
        raise InputError(missing_message())
    return python


def tosa_tool(name: str) -> Path:
    """A tosa-tools executable (`tosa-opt`, `tosa_verif_build_tests`, ...) beside the environment's Python.

    The venv's `bin/python` is a symlink: the scripts are beside the link, not beside its target."""
    return require_tosa_python().parent / name


def run_reference_jobs(jobs: Sequence[ReferenceJob], timeout: float = 600.0) -> list[ReferenceResult]:
    """Run every job in one reference-model process; a graph the model refuses is a status, not an error.

    EngineError when the worker process itself fails (a crash of the model, a broken environment).
    """
    python = require_tosa_python()
    arrays: dict[str, np.ndarray] = {}
    described = []
    for index, job in enumerate(jobs):
        for j, array in enumerate(job.inputs):
            arrays[f"job{index}_input{j}"] = np.ascontiguousarray(array)
        if job.flatbuffer is not None:
            arrays[f"job{index}_flatbuffer"] = np.frombuffer(job.flatbuffer, np.uint8)
        described.append({"mlir": job.mlir, "inputs": len(job.inputs), "describe": job.describe})
    arrays["request"] = np.array(json.dumps({"jobs": described}))
    request = io.BytesIO()
    np.savez(request, **arrays)
    completed = subprocess.run(
        [str(python), str(WORKER)], input=request.getvalue(), capture_output=True, timeout=timeout
    )
    if completed.returncode != 0:
        raise EngineError(
            f"the TOSA reference model worker failed (exit {completed.returncode}):\n"
            f"{completed.stderr.decode(errors='replace')[-4000:]}"
        )
    response = np.load(io.BytesIO(completed.stdout), allow_pickle=False)
    results = json.loads(str(response["response"]))["jobs"]
    return [
        ReferenceResult(
            status=result["status"],
            outputs=tuple(response[f"job{index}_output{k}"] for k in range(result["outputs"])),
            messages=result["messages"],
            graph=result.get("graph"),
        )
        for index, result in enumerate(results)
    ]


def describe_flatbuffers(flatbuffers: Sequence[bytes]) -> list[GraphDescription]:
    """Decode TOSA flatbuffers (one worker process): operators with their attribute fields, constants."""
    results = run_reference_jobs([ReferenceJob(inputs=(), flatbuffer=f, describe=True) for f in flatbuffers])
    descriptions = []
    for result in results:
        assert result.graph is not None, result.status
        graph = result.graph
        descriptions.append(
            GraphDescription(
                operators=tuple(graph["operators"]),
                tensors=graph["tensors"],
                constants=dict(zip(graph["constants"], result.outputs, strict=True)),
                inputs=tuple(graph["inputs"]),
                outputs=tuple(graph["outputs"]),
            )
        )
    return descriptions


def run_reference(mlir: str, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The outputs of TOSA MLIR text's function on the reference model; EngineError unless TOSA_VALID."""
    (result,) = run_reference_jobs([ReferenceJob(inputs=tuple(inputs), mlir=mlir)])
    if result.status != VALID:
        raise EngineError(f"the TOSA reference model returned {result.status}:\n{result.messages.strip()}")
    return result.outputs


def serialize(mlir: str) -> bytes:
    """TOSA MLIR text as the TOSA flatbuffer (`tosa-opt --tosa-serialize`, as the reference model's worker
    does); EngineError with tosa-opt's diagnostics when it refuses an op or type."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "graph.tosa"
        completed = subprocess.run(
            [str(tosa_tool("tosa-opt")), f"--tosa-serialize=tosa-flatbuffer-filename={path}", "-",
             "-o", os.devnull],
            input=mlir, capture_output=True, text=True,
        )  # fmt: skip
        if completed.returncode != 0 or not path.exists():
            raise EngineError(f"tosa-opt --tosa-serialize failed:\n{completed.stderr.strip()}")
        return path.read_bytes()


def deserialize(flatbuffer: bytes) -> str:
    """A TOSA flatbuffer as generic MLIR text (`tosa-opt --tosa-deserialize`); EngineError if tosa-opt fails.

    tosa-opt prints a version WARNING on stdout for flatbuffers of an older spec version: dropped."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "graph.tosa"
        path.write_bytes(flatbuffer)
        completed = subprocess.run(
            [str(tosa_tool("tosa-opt")), f"--tosa-deserialize=tosa-flatbuffer-filename={path}",
             "--mlir-print-op-generic", "-"],
            input="", capture_output=True, text=True,
        )  # fmt: skip
    if completed.returncode != 0:
        raise EngineError(f"tosa-opt --tosa-deserialize failed:\n{completed.stderr.strip()}")
    return "\n".join(line for line in completed.stdout.splitlines() if not line.startswith("WARNING"))


def validate(
    mlir: str, profiles: Sequence[str] = ("pro_int",), extensions: Sequence[str] = (), *, strict: bool = False
) -> str:
    """'' when `tosa-opt --tosa-validate` accepts the text for the target (profiles, extensions), else its
    diagnostics. DOUBLE_ROUND needs extension `doubleround`, i16 activations `int16`. Only `strict`
    (`strict-op-spec-alignment`) checks each op against the profiles: without it a float `tosa.exp` passes
    `pro_int` (tosa-tools 2026.8.0)."""
    target = f"profiles={','.join(profiles)}" + (f" extensions={','.join(extensions)}" if extensions else "")
    completed = subprocess.run(
        [
            str(tosa_tool("tosa-opt")),
            f"--tosa-attach-target={target}",
            "--tosa-validate=strict-op-spec-alignment" if strict else "--tosa-validate",
            "-",
            "-o",
            os.devnull,
        ],
        input=mlir,
        capture_output=True,
        text=True,
    )
    return completed.stderr.strip() if completed.returncode != 0 else ""

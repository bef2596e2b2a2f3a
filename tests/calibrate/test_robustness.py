"""`qconvert calibrate` when things go wrong around it: SIGTERM, dying workers, empty samples, small
`--data` mistakes. Each case was found by a tester (the repro named in each test's docstring)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.calibrate.dataset import DEFAULT_BATCH_SIZE, DatasetStats, open_dataset
from qconvert.calibrate.ranges import CalibrationRanges
from qconvert.cli import main
from qconvert.errors import InputError


def matmul_relu_model(path: Path | None = None, extra_input: bool = False) -> onnx.ModelProto:
    """y = Relu(x @ W), x f32[B,S,16]; with `extra_input`, also z = Relu(kv), kv f32[B,P,16]."""
    weight = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Relu", ["mm"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 16])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8])]
    if extra_input:
        nodes.append(helper.make_node("Relu", ["kv"], ["z"]))
        inputs.append(helper.make_tensor_value_info("kv", TensorProto.FLOAT, ["B", "P", 16]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["B", "P", 16]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if path is not None:
        onnx.save(model, str(path))
    return model


def samples(count: int, length: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, length, 16)).astype(np.float32)


# SIGTERM: the same clean path as Ctrl-C (r02_sigterm_orphans.sh) -------------------------------------------
def processes_with(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process whose environment holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(entry.name), command))
        except OSError:  # gone, or not ours to read
            continue
    return found


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def terminate_calibration(tmp_path: Path, engine: str, worker_title: str) -> None:
    """Start `qconvert calibrate --workers 2` on a slow data function, SIGTERM it once both workers run,
    and check: exit 143 soon (not after the data is read), no process of it left, no temporary folder."""
    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to find the processes of the run")
    matmul_relu_model(tmp_path / "mm.onnx")
    (tmp_path / "slowdata.py").write_text(
        "import time, numpy as np\n"
        "def slow():\n"
        "    for i in range(400):  # 20 s of reading for each worker\n"
        "        time.sleep(0.05)\n"
        "        yield {'x': np.random.default_rng(i).standard_normal((2, 4, 16)).astype(np.float32)}\n"
    )
    # This run's own TMPDIR, so that other runs' folders cannot confuse the check (not for Ray: its
    # sockets live there, and a pytest folder is too long a path for a socket).
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    marker = f"QCONVERT_TEST_RUN={uuid.uuid4().hex}"
    environment = {**os.environ, "QCONVERT_TEST_RUN": marker.partition("=")[2]}
    if engine == "local":
        environment["TMPDIR"] = str(temporary)
    command = [sys.executable, "-m", "qconvert", "calibrate", "mm.onnx", "--data", "./slowdata.py:slow"]
    command += ["--workers", "2", "--engine", engine, "--out", "q.onnx", "--quiet"]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        workers = lambda: [p for p in processes_with(marker) if worker_title in p[1]]  # noqa: E731
        assert wait_for(lambda: len(workers()) >= 2 or process.poll() is not None, 90)
        assert process.poll() is None, process.communicate()
        time.sleep(1.0)  # the workers are reading data now
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "qconvert: terminated (SIGTERM)"
    assert seconds < 15, f"took {seconds:.1f} s: the workers were waited for, not ended"
    # The resource tracker (or Ray's daemons) go once their last user has: give them a few seconds.
    assert wait_for(lambda: not processes_with(marker), 20), processes_with(marker)
    assert [p.name for p in temporary.iterdir() if p.name.startswith("qconvert-calibrate-")] == []
    assert not (tmp_path / "q.onnx").exists()


def test_sigterm_ends_the_worker_processes_and_removes_the_temporary_folder(tmp_path: Path) -> None:
    terminate_calibration(tmp_path, "local", "spawn_main")


def test_sigterm_shuts_ray_down_and_exits_143(tmp_path: Path) -> None:
    """ray.init installs its own SIGTERM handler (sys.exit(15)), and a handler raising inside ray.wait
    reached us as a SystemError (exit 3): both are undone."""
    require_module("ray")
    terminate_calibration(tmp_path, "ray", "ray::_RayWorker")


def test_main_restores_the_sigterm_handler_it_replaced(capsys: pytest.CaptureFixture) -> None:
    def mine(signal_number: int, frame: object) -> None:
        raise AssertionError("not called")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["calibrate", "--help"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
    # The help line of --batch-size gives the default for a dynamic batch dim (r13's neighbour).
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    default = f"(default: the model's fixed batch dim, else {DEFAULT_BATCH_SIZE})"
    assert f"--batch-size N|given samples per run {default}" in text


# A worker process that dies (r14_worker_death_exit3.sh) ------------------------------------------------
DYING_DATA = """\
import os, signal, numpy as np
def exits():
    yield {"x": np.zeros((2, 4, 16), np.float32)}
    os._exit(9)
def killed():
    yield {"x": np.zeros((2, 4, 16), np.float32)}
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    ("function", "how"),
    [("exits", r"exit code 9"), ("killed", r"killed by signal 9 \(SIGKILL: out of memory\?\)")],
)
def test_a_dying_worker_process_is_one_line_naming_it_and_how_it_ended(
    function: str, how: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    matmul_relu_model(tmp_path / "mm.onnx")
    (tmp_path / "dies.py").write_text(DYING_DATA)
    data = f"{tmp_path / 'dies.py'}:{function}"
    out = str(tmp_path / "q.onnx")
    code = main(
        ["calibrate", str(tmp_path / "mm.onnx"), "--data", data, "--workers", "2", "--quiet", "-o", out]
    )
    stderr = capsys.readouterr().err
    assert code == 2, stderr  # not 3 (a bug of ours), not 1 (a check that failed)
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert re.fullmatch(
        rf"qconvert: error: calibration worker process [12] of 2 \(pid \d+\) died \({how}\) while reading "
        r"data or running the model",
        stderr.strip(),
    ), stderr
    assert "please report" not in stderr and "__main__" not in stderr
    assert not (tmp_path / "q.onnx").exists()


def test_a_dying_ray_actor_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_module("ray")
    monkeypatch.setenv("QCONVERT_RAY_RETRIES", "0")  # no retry: retries are test_ray_cluster.py's
    matmul_relu_model(tmp_path / "mm.onnx")
    (tmp_path / "dies.py").write_text(DYING_DATA)
    data = f"{tmp_path / 'dies.py'}:exits"
    code = main(["calibrate", str(tmp_path / "mm.onnx"), "--data", data, "--workers", "2", "--engine", "ray"])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("qconvert:")]
    assert code == 2, errors
    assert captured.out == ""  # Ray's own report of the death ("(raylet) A worker died ...") is on stderr
    assert len(errors) == 1 and re.match(
        r"qconvert: error: calibration worker [12] of 2 \(a Ray actor, pid \d+\) died while reading data",
        errors[0],
    ), errors


# Samples with a zero-size dim (r01_zero_length_sample.sh) --------------------------------------------------
def test_samples_with_no_elements_are_left_out_and_counted(tmp_path: Path) -> None:
    """As NaN samples are: nothing in them to observe. The other file's samples make the batch."""
    np.savez(tmp_path / "a.npz", x=np.zeros((2, 0, 16), np.float32))
    np.savez(tmp_path / "b.npz", x=samples(3))
    dataset = open_dataset(tmp_path, matmul_relu_model())
    stats = DatasetStats()
    batches = list(dataset.batches(stats))
    assert [batch.arrays["x"].shape for batch in batches] == [(3, 4, 16)]
    assert (stats.samples_read, stats.samples_used, stats.empty) == (5, 3, 2)
    assert stats.warnings(dataset.batch_size) == [
        f"2 of 5 samples have no elements in any input and were left out (the first in {tmp_path / 'a.npz'}: "
        "sample shape 'x' [0, 16])"
    ]


def test_only_samples_with_no_elements_is_an_input_error_naming_file_input_and_shape(tmp_path: Path) -> None:
    np.savez(tmp_path / "empty.npz", x=np.zeros((2, 0, 16), np.float32))
    with pytest.raises(InputError) as raised:
        list(open_dataset(tmp_path / "empty.npz", matmul_relu_model()).batches())
    assert str(raised.value) == (
        f"error: {tmp_path / 'empty.npz'}: none of the 2 samples is usable: 2 have no elements (a zero-size "
        f"dim in every input; the first in {tmp_path / 'empty.npz'}: sample shape 'x' [0, 16]); nothing to "
        "calibrate on"
    )


def test_an_empty_input_beside_a_filled_one_is_fed_as_it_is() -> None:
    """A decoder's first step has a past key/value cache of length 0: such samples are real data."""
    data = [{"x": samples(2), "kv": np.zeros((2, 0, 16), np.float32)}]
    stats = DatasetStats()
    (batch,) = open_dataset(data, matmul_relu_model(extra_input=True)).batches(stats)
    assert batch.arrays["kv"].shape == (2, 0, 16) and stats.empty == 0
    np.testing.assert_array_equal(batch.arrays["x"], data[0]["x"])


def test_calibrate_skips_the_empty_file_and_its_ranges_are_those_of_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = matmul_relu_model(tmp_path / "mm.onnx")
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "a.npz", x=np.zeros((2, 0, 16), np.float32))
    np.savez(tmp_path / "data" / "b.npz", x=samples(4, seed=3))
    ranges = tmp_path / "ranges.json"
    data = str(tmp_path / "data")
    code = main(["calibrate", str(tmp_path / "mm.onnx"), "--data", data, "--ranges", str(ranges), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "2 of 6 samples have no elements in any input and were left out" in captured.err
    saved = CalibrationRanges.load(ranges)["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(["y"], {"x": samples(4, seed=3)})
    assert (float(saved.min), float(saved.max)) == (float(expected.min()), float(expected.max()))
    assert main(["calibrate", str(tmp_path / "mm.onnx"), "--data", str(tmp_path / "data" / "a.npz")]) == 2
    assert "a.npz: none of the 2 samples is usable" in capsys.readouterr().err


# Small --data mistakes (r13_small_data_ux.sh) ------------------------------------------------------------
SMALL_DATA = """\
import numpy as np
def one_dict():
    return {"x": np.zeros((2, 4, 16), np.float32)}
def good():
    return [{"x": np.zeros((2, 4, 16), np.float32)}]
def lists():
    return [{"x": np.zeros((2, 4, 16)).tolist()}]
"""


def calibrate_on(tmp_path: Path, data: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    if not (tmp_path / "mm.onnx").exists():
        matmul_relu_model(tmp_path / "mm.onnx")
    code = main(["calibrate", str(tmp_path / "mm.onnx"), "--data", data, "--quiet", "--evaluate", "0"])
    return code, capsys.readouterr().err.strip()


def test_a_function_returning_one_dict_is_told_to_return_a_list(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "small.py").write_text(SMALL_DATA)
    code, error = calibrate_on(tmp_path, f"{tmp_path / 'small.py'}:one_dict", capsys)
    assert code == 2
    assert error == (
        f"qconvert: error: {tmp_path / 'small.py'}:one_dict: returned one dict ('x'); expected an iterable "
        "of such dicts (input name -> array, one per batch): return [data], or yield each"
    )


def test_module_function_finds_the_module_in_the_current_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `python -m`, uvicorn and gunicorn do; the console script's sys.path lacks the folder."""
    module = f"small_{uuid.uuid4().hex[:8]}"  # not imported by any earlier test
    (tmp_path / f"{module}.py").write_text(SMALL_DATA)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    code, error = calibrate_on(tmp_path, f"{module}:good", capsys)
    sys.modules.pop(module, None)
    assert code == 0, error
    code, error = calibrate_on(tmp_path, "absent_module_here:good", capsys)
    assert code == 2
    assert error.endswith(
        f"No module named 'absent_module_here', on sys.path nor in the current folder {tmp_path}"
    )


def test_python_lists_are_named_as_lists_with_the_dtype_the_model_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "small.py").write_text(SMALL_DATA)
    code, error = calibrate_on(tmp_path, f"{tmp_path / 'small.py'}:lists", capsys)
    assert code == 2
    assert error.endswith(
        "item 0['x']: input 'x' is a Python list, which numpy reads as float64; the model takes "
        "float32[?,?,16]: give np.asarray(..., dtype=np.float32)"
    )


EXITING_DATA = """\
import sys, numpy as np
def at_once():
    sys.exit(0)
def midway():
    yield {"x": np.zeros((2, 4, 16), np.float32)}
    sys.exit(0)
"""


@pytest.mark.parametrize(("function", "workers"), [("at_once", "1"), ("midway", "1"), ("midway", "2")])
def test_a_data_function_calling_sys_exit_is_bad_input_not_a_silent_success(
    function: str, workers: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """sys.exit(0) in the data function once ended calibrate with exit 0 and no model (exit 3 in a worker)."""
    matmul_relu_model(tmp_path / "mm.onnx")
    (tmp_path / "exiting.py").write_text(EXITING_DATA)
    data, out = f"{tmp_path / 'exiting.py'}:{function}", tmp_path / "q.onnx"
    code = main(
        ["calibrate", str(tmp_path / "mm.onnx"), "--data", data, "--workers", workers, "-o", str(out)]
    )
    error = capsys.readouterr().err.strip()
    assert code == 2 and "sys.exit(0)" in error and len(error.splitlines()) == 1, error
    assert not out.exists()


def test_an_inherited_ignored_sigterm_stays_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As Python keeps an inherited "ignore" for SIGINT, main() keeps one for SIGTERM: the data function,
    called inside main(), sees it (and sees main's own handler when SIGTERM was not ignored)."""
    matmul_relu_model(tmp_path / "mm.onnx")
    (tmp_path / "probe.py").write_text(
        "import os, signal, numpy as np\n"
        "def data():\n"
        "    with open(os.environ['QCONVERT_PROBE'], 'a') as seen:\n"
        "        seen.write(str(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN) + '\\n')\n"
        "    return [{'x': np.zeros((2, 4, 16), np.float32)}]\n"
    )
    record = tmp_path / "seen.txt"
    monkeypatch.setenv("QCONVERT_PROBE", str(record))
    command = ["calibrate", str(tmp_path / "mm.onnx"), "--data", f"{tmp_path / 'probe.py'}:data", "--quiet"]
    command += ["--outlier-channels", "off"]  # the data read once per main() (that run reads it again)
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert main(command) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert main(command) == 0
    assert record.read_text().split() == ["True", "False"]

"""Every output option writes through what its path points at (issue 23): a symlink's target replaced with the
link kept, a FIFO and a character device written as they are, `-` as stdout, /dev/stdout never replaced.

Each verb's writers are run on each kind of path: import and convert `-o`, check `--json`, calibrate
`--out`, `--ranges` and `--json`, opt `-o`. A regular file is still replaced atomically
(tests/unit/test_atomic_file.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from qconvert.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS_QDQ = MODELS / "digits_cnn.qdq.onnx"
DIGITS_FLOAT = MODELS / "digits_cnn.onnx"
DIGITS_DATA = MODELS / "digits_cnn.inputs.npz"


def _import(out: str) -> list[str]:
    return ["import", str(DIGITS_QDQ), "--elide-weights", "-o", out]


def _convert(out: str) -> list[str]:
    return ["convert", str(DIGITS_QDQ), "--to", "stablehlo", "--elide-weights", "-o", out]


def _convert_onnx(out: str) -> list[str]:
    return ["convert", str(DIGITS_QDQ), "--to", "onnx", "-o", out]


def _inspect(out: str) -> list[str]:
    return ["inspect", str(DIGITS_QDQ), "--json", out]


def _check(out: str) -> list[str]:
    return ["check", str(DIGITS_QDQ), "--quiet", "--max-samples", "8", "--json", out]


def _calibrate_flags(option: str) -> Callable[[str], list[str]]:
    def flags(out: str) -> list[str]:
        command = ["calibrate", str(DIGITS_FLOAT), "--data", str(DIGITS_DATA), "--quiet"]
        return [*command, "--evaluate", "0", option, out]

    return flags


def _is_mlir(data: bytes) -> bool:
    return b"func.func" in data


def _is_json(data: bytes) -> bool:
    return isinstance(json.loads(data), dict)


def _is_onnx(data: bytes) -> bool:
    return len(onnx.load_from_string(data).graph.node) > 0


VERBS: dict[str, tuple[Callable[[str], list[str]], Callable[[bytes], bool]]] = {
    "import -o": (_import, _is_mlir),
    "convert -o": (_convert, _is_mlir),
    "convert --to onnx -o": (_convert_onnx, _is_onnx),
    "inspect --json": (_inspect, _is_json),
    "check --json": (_check, _is_json),
    "calibrate --out": (_calibrate_flags("--out"), _is_onnx),
    "calibrate --ranges": (_calibrate_flags("--ranges"), _is_json),
    "calibrate --json": (_calibrate_flags("--json"), _is_json),
}


def _opt_flags(tmp_path: Path) -> Callable[[str], list[str]]:
    source = tmp_path / "in.mlir"
    source.write_text("!q = !quant.uniform<i8:f32, 0.5:3>\nfunc.func private @f(tensor<4x!q>)\n")
    return lambda out: ["opt", str(source), "-o", out]


def _run(arguments: list[str]) -> int:
    code = main(arguments)
    assert code == 0, arguments
    return code


@pytest.mark.parametrize("verb", [*VERBS, "opt -o"])
def test_a_symlink_keeps_its_link_and_its_target_gets_the_output(verb: str, tmp_path: Path) -> None:
    flags, valid = VERBS.get(verb, (_opt_flags(tmp_path), _is_mlir))
    target = tmp_path / "real" / "target.out"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.out"
    link.symlink_to(target)
    _run(flags(str(link)))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert valid(target.read_bytes())
    assert sorted(p.name for p in target.parent.iterdir()) == ["target.out"]  # no temporary left
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "in.mlir") == ["link.out", "real"]


@pytest.mark.parametrize("verb", ["import -o", "check --json", "calibrate --ranges"])
def test_a_dangling_symlink_gets_its_target_created(verb: str, tmp_path: Path) -> None:
    flags, valid = VERBS[verb]
    target = tmp_path / "new.out"
    link = tmp_path / "link.out"
    link.symlink_to(target)
    _run(flags(str(link)))
    assert link.is_symlink() and valid(target.read_bytes())


@pytest.mark.parametrize("verb", [*VERBS, "opt -o"])
def test_a_fifo_is_written_through_to_its_reader(verb: str, tmp_path: Path) -> None:
    flags, valid = VERBS.get(verb, (_opt_flags(tmp_path), _is_mlir))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as stream:  # blocks until the writer opens it
            received.append(stream.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _run(flags(str(fifo)))
    finally:
        # If the command never opened the FIFO, the reader still waits in open(): pair it with a writer. A
        # non-blocking open fails (ENXIO) when no reader is waiting any more, where a blocking one would hang.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=30)
    assert fifo.is_fifo()  # still a FIFO, not replaced by a regular file
    assert received and valid(received[0])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "in.mlir") == ["pipe"]


@pytest.mark.parametrize("verb", [*VERBS, "opt -o"])
def test_dev_null_is_written_through(verb: str, tmp_path: Path) -> None:
    flags, _ = VERBS.get(verb, (_opt_flags(tmp_path), _is_mlir))
    before = os.stat("/dev/null")
    _run(flags("/dev/null"))
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)


@pytest.mark.parametrize("verb", [*VERBS, "opt -o"])
def test_dash_is_stdout(verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags, valid = VERBS.get(verb, (_opt_flags(tmp_path), _is_mlir))
    monkeypatch.chdir(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "qconvert", *flags("-")], capture_output=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    assert valid(result.stdout), result.stdout[:200]
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("verb", [*VERBS, "opt -o"])
def test_dev_stdout_stays_a_link_and_gets_the_output(verb: str, tmp_path: Path) -> None:
    """The bug reported: as root, `check --json /dev/stdout` replaced the /dev/stdout symlink with a file.
    Stdout goes to a pipe here, and to a regular file (a shell's `> file`), which keeps its inode."""
    flags, valid = VERBS.get(verb, (_opt_flags(tmp_path), _is_mlir))
    assert os.path.islink("/dev/stdout")
    command = [sys.executable, "-m", "qconvert", *flags("/dev/stdout")]
    result = subprocess.run(command, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert os.path.islink("/dev/stdout")
    if verb not in ("check --json", "inspect --json", "calibrate --ranges", "calibrate --json"):
        assert valid(result.stdout)
    else:  # the report's table shares stdout: the JSON object comes first
        assert result.stdout.lstrip().startswith(b"{")
    redirected = tmp_path / "redirected"
    with open(redirected, "wb") as stream:
        inode = os.fstat(stream.fileno()).st_ino
        subprocess.run(command, stdout=stream, stderr=subprocess.DEVNULL, timeout=300, check=True)
    assert redirected.stat().st_ino == inode and redirected.stat().st_size > 0
    assert os.path.islink("/dev/stdout")


def test_two_outputs_on_stdout_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = _calibrate_flags("--ranges")("-")
    assert main([*flags, "--json", "-"]) == 2
    error = capsys.readouterr().err
    assert "--json -: --ranges - writes to stdout already" in error


def test_an_onnx_model_with_external_data_is_refused_on_a_fifo(tmp_path: Path) -> None:
    """The data file would go beside a FIFO or a device: refused with a clear error, nothing written."""
    from qconvert.backends.onnx import save_onnx
    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx

    module = import_onnx(str(DIGITS_QDQ))
    with pytest.raises(InputError, match="external data"):
        save_onnx(module, "/dev/null", external_data=True)


def test_opt_into_a_missing_folder_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(_opt_flags(tmp_path)(str(tmp_path / "missing" / "out.mlir")))
    error = capsys.readouterr().err
    assert code == 2 and "missing" in error and "internal error" not in error


def test_a_storage_model_through_a_symlink_gets_its_sidecar_beside_the_target(tmp_path: Path) -> None:
    target = tmp_path / "real" / "target.onnx"
    target.parent.mkdir()
    link = tmp_path / "link.onnx"
    link.symlink_to(target)
    _run(["convert", str(DIGITS_QDQ), "--to", "onnx-storage", "-o", str(link)])
    assert link.is_symlink() and _is_onnx(target.read_bytes())
    assert sorted(p.name for p in target.parent.iterdir()) == ["target.onnx", "target.quant.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.onnx", "real"]


def test_a_storage_model_is_refused_on_a_device(capsys: pytest.CaptureFixture[str]) -> None:
    """Its sidecar has no place beside /dev/null: exit 2 naming why, nothing written."""
    assert main(["convert", str(DIGITS_QDQ), "--to", "onnx-storage", "-o", "/dev/null"]) == 2
    error = capsys.readouterr().err
    assert "/dev/null" in error and "quant.json" in error and "give a regular file path" in error


def test_inspect_json_says_what_the_text_says(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(DIGITS_QDQ)]) == 0
    text = capsys.readouterr().out
    assert main(["inspect", str(DIGITS_QDQ), "--json", "-"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ops"] and all(f"  {op}: {count}\n" in text for op, count in summary["ops"].items())
    assert summary["quantization_styles"][0]["name"] in text and summary["inputs"] == ["image"]

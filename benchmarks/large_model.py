#!/usr/bin/env python3
"""Peak memory and time of each verb on a model over 2 GiB (issue 23), against the model's size.

The models: models/build_large_transformer.py (5 feed-forward blocks, 10 MatMul weights of 256 MiB in
external data: 2.5 GiB float32, and 2.5 GiB int8 in the QDQ form), built once into the cache folder
(`--cache`, default $QCONVERT_LARGE_MODEL_CACHE or ~/.cache/qconvert/large_transformer).

Rows, each the whole command in a fresh process, its peak RSS read with `os.wait4`:

- `inspect` QDQ model; `import` and `convert --to stablehlo` QDQ model -o FILE (weights as dense_resource
  blobs, streamed from the memory-mapped data file into the text);
- `calibrate` float model on 8 samples (`--ranges`, `--evaluate 0`: onnxruntime maps the external data);
- `check` QDQ model and float model, 2 samples (`--max-samples 2`): the weights fed from one mapping of the
  data file, the QDQ weights' float dequantizes computed one at a time (qconvert/check/oracle.py).

`ratio` is peak RSS / the model's size (graph + data file). Aims (issue 23): import and convert <= 1.2,
calibrate flat (its peak does not grow with the data), check <= 2.5. A run over `--timeout` is `timeout`, a
failing one `failed` with its last stderr line; neither shows a number.

Usage: python benchmarks/large_model.py [--cache DIR] [--only VERB ...] [--timeout S] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "models"))
from build_large_transformer import default_cache, ensure_built  # noqa: E402


@dataclass
class Result:
    verb: str
    model: str
    status: str  # "ok", "failed", "timeout"
    seconds: float | None = None
    peak_gib: float | None = None
    model_gib: float | None = None
    ratio: float | None = None
    note: str = ""


def model_size(path: Path) -> int:
    """The graph's file and its external data files (every file beside it named after it)."""
    return sum(p.stat().st_size for p in path.parent.glob(f"{path.name}*") if p.is_file())


def measure(verb: str, model: Path, arguments: list[str], timeout: float) -> Result:
    command = [sys.executable, "-m", "qconvert", *arguments]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, cwd=REPO)
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                process.kill()
                os.wait4(process.pid, 0)
                return Result(verb, model.name, "timeout", note=f"over {timeout:.0f} s")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        errors.seek(0)
        stderr = errors.read().decode(errors="replace").strip().splitlines()
    code = os.waitstatus_to_exitcode(status)
    process.returncode = code
    size = model_size(model)
    peak = usage.ru_maxrss * 1024  # kilobytes on Linux
    if code != 0:
        note = stderr[-1][:200] if stderr else f"exit {code}"
        return Result(verb, model.name, "failed", note=f"exit {code}: {note}", peak_gib=peak / 2**30)
    return Result(verb, model.name, "ok", seconds, peak / 2**30, size / 2**30, peak / size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--only", nargs="*", default=None, help="verbs to run (default: all)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    built = ensure_built(options.cache)
    if isinstance(built, str):
        raise SystemExit(f"cannot build the models: {built}")
    qdq, floating = built["qdq"], built["float"]
    with tempfile.TemporaryDirectory(dir=options.cache, prefix="out.") as scratch:
        out = Path(scratch)
        runs = {
            "inspect": (qdq, ["inspect", str(qdq)]),
            "import": (qdq, ["import", str(qdq), "-o", str(out / "import.mlir")]),
            "convert": (qdq, ["convert", str(qdq), "--to", "stablehlo", "-o", str(out / "convert.mlir")]),
            "calibrate": (
                floating,
                [
                    "calibrate",
                    str(floating),
                    "--data",
                    str(built["float_data"]),
                    "--quiet",
                    "--evaluate",
                    "0",
                    "--ranges",
                    str(out / "ranges.json"),
                ],
            ),
            "check float": (
                floating,
                ["check", str(floating), "--data", str(built["float_data"]), "--max-samples", "2", "--quiet"],
            ),
            "check qdq": (
                qdq,
                ["check", str(qdq), "--data", str(built["qdq_data"]), "--max-samples", "2", "--quiet"],
            ),
        }
        results = []
        for verb, (model, arguments) in runs.items():
            if options.only and verb not in options.only:
                continue
            result = measure(verb, model, arguments, options.timeout)
            results.append(result)
            for written in out.iterdir():
                written.unlink()  # 5 GB of text each: one at a time
            numbers = (
                f"{result.seconds:7.1f} s  peak {result.peak_gib:5.2f} GiB  "
                f"model {result.model_gib:4.2f} GiB  ratio {result.ratio:4.2f}"
                if result.status == "ok"
                else f"{result.status}: {result.note}"
            )
            print(f"{verb:12s} {model.name:26s} {numbers}", flush=True)
    if options.json is not None:
        options.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")


if __name__ == "__main__":
    main()

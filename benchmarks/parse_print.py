#!/usr/bin/env python3
"""Parse + print speed and peak memory of qconvert's IR text syntax, beside xDSL and MLIR's C++ (iree-opt).

Workloads (generated into a temporary directory, never committed):

- `mixed`    N ops mixing `quant.qcast` / `quant.scast` / `quant.dcast` on tensors with per-tensor and
             per-axis types and `arith.constant` / `arith.addf` / `arith.mulf`;
- `arith`    N `arith.addf` ops on `f32` (the apples-to-apples comparison with xDSL, which has no quant
             dialect);
- `per-axis` one function argument of type `tensor<65536x!quant.uniform<i8:f32:0, {65536 scales}>>` and a
             `quant.dcast` of it.

Every measurement runs in a process of its own, so each peak RSS belongs to one run (`os.wait4` gives the
rusage of that one child). Rows:

- `qconvert (in-process)`: `parse_module` + `print_module` timed inside a Python process, after import
  (verify is timed too, but not included in the seconds);
- `qconvert opt (process)`: the whole `python -m qconvert opt FILE -o OUT` command (start-up, import,
  parse, verify, print, write);
- `xdsl-opt (process)`: the whole `xdsl-opt FILE -o OUT` command (start-up, parse, verify, print, write);
- `iree-opt (process)`: MLIR's C++ parser/verifier/printer, the native binary of `iree-base-compiler`.

A tool that is missing is reported as `not found`, a workload a tool cannot read as `not run` (with the
reason); neither is ever shown with a time. `--json PATH` writes every sample.

Usage: python benchmarks/parse_print.py [--ops N] [--scales N] [--repeat K] [--timeout S] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 60.0  # seconds per run (--timeout); a run that takes longer is reported as `timeout`
TIMEOUT = DEFAULT_TIMEOUT

PER_TENSOR = "!quant.uniform<i8:f32, 6.250000e-02:-3>"


def scale_text(index: int) -> str:
    """A scale with a short exact decimal form (k/16), so the text round-trips through every printer."""
    scale = f"{(1 + index % 997) / 16:.6e}"
    zero_point = index % 11 - 5
    return f"{scale}:{zero_point}" if zero_point else scale


def per_axis_type(count: int) -> str:
    return f"!quant.uniform<i8:f32:0, {{{','.join(scale_text(i) for i in range(count))}}}>"


# Workload generators --------------------------------------------------------------------------------
def generate_mixed(num_ops: int) -> str:
    """`num_ops` ops in one function, cycling through a chain of arith and quant ops on tensor<4x16xf32>."""
    float_tensor = "tensor<4x16xf32>"
    per_tensor = f"tensor<4x16x{PER_TENSOR}>"
    per_axis = f"tensor<4x16x{per_axis_type(4)}>"
    storage = "tensor<4x16xi8>"
    lines = [
        "module {",
        f"  func.func @main(%arg0: {float_tensor}) -> {float_tensor} {{",
    ]
    state = {"value": 0, "constant": 0}
    current = "%arg0"

    def new_value() -> str:
        name = f"%{state['value']}"
        state["value"] += 1
        return name

    def new_constant() -> str:
        index = state["constant"]
        state["constant"] += 1
        return "%cst" if index == 0 else f"%cst_{index - 1}"

    emitted = 0
    group = 0
    while emitted < num_ops:
        constant = new_constant()
        value = f"{(1 + group % 64) / 4:.6e}"
        added, multiplied, quantized, stored, requantized, dequantized, result = (None,) * 7
        body: list[str] = []
        body.append(f"    {constant} = arith.constant dense<{value}> : {float_tensor}")
        added = new_value()
        body.append(f"    {added} = arith.addf {current}, %arg0 : {float_tensor}")
        multiplied = new_value()
        body.append(f"    {multiplied} = arith.mulf {added}, {constant} : {float_tensor}")
        quantized = new_value()
        body.append(f"    {quantized} = quant.qcast {multiplied} : {float_tensor} to {per_tensor}")
        stored = new_value()
        body.append(f"    {stored} = quant.scast {quantized} : {per_tensor} to {storage}")
        requantized = new_value()
        body.append(f"    {requantized} = quant.scast {stored} : {storage} to {per_axis}")
        dequantized = new_value()
        body.append(f"    {dequantized} = quant.dcast {requantized} : {per_axis} to {float_tensor}")
        result = new_value()
        body.append(f"    {result} = arith.addf {dequantized}, {multiplied} : {float_tensor}")
        take = min(len(body), num_ops - emitted)
        lines += body[:take]
        emitted += take
        if take == len(body):
            current = result
        group += 1
    # A truncated last group still returns a float tensor: the chain's last complete result.
    lines += [f"    return {current} : {float_tensor}", "  }", "}", ""]
    return "\n".join(lines)


def generate_arith(num_ops: int) -> str:
    """`num_ops` `arith.addf` ops on f32 scalars, each using the previous result."""
    lines = ["module {", "  func.func @main(%arg0: f32, %arg1: f32) -> f32 {"]
    previous = "%arg0"
    for index in range(num_ops):
        lines.append(f"    %{index} = arith.addf {previous}, %arg1 : f32")
        previous = f"%{index}"
    lines += [f"    return {previous} : f32", "  }", "}", ""]
    return "\n".join(lines)


def generate_per_axis(num_scales: int) -> str:
    """One function argument of a per-axis type with `num_scales` scales, and its `quant.dcast`."""
    quantized = f"tensor<{num_scales}x{per_axis_type(num_scales)}>"
    float_tensor = f"tensor<{num_scales}xf32>"
    return "\n".join(
        [
            "module {",
            f"  func.func @main(%arg0: {quantized}) -> {float_tensor} {{",
            f"    %0 = quant.dcast %arg0 : {quantized} to {float_tensor}",
            f"    return %0 : {float_tensor}",
            "  }",
            "}",
            "",
        ]
    )


# Measurement ----------------------------------------------------------------------------------------
# Runs in a fresh interpreter: times import, parse, verify and print separately; reports its own peak RSS.
IN_PROCESS = r"""
import json, resource, sys, time
started = time.perf_counter()
from qconvert.ir import parse_module, print_module, verify
imported = time.perf_counter()
rss_after_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
source, output = sys.argv[1], sys.argv[2]
with open(source, encoding="utf-8") as handle:
    text = handle.read()
t0 = time.perf_counter()
module = parse_module(text, source)
t1 = time.perf_counter()
verify(module)
t2 = time.perf_counter()
printed = print_module(module)
t3 = time.perf_counter()
with open(output, "w", encoding="utf-8") as handle:
    handle.write(printed)
print(json.dumps({
    "import_s": imported - started, "parse_s": t1 - t0, "verify_s": t2 - t1, "print_s": t3 - t2,
    "rss_after_import_kb": rss_after_import,
    "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


@dataclass
class Sample:
    seconds: float
    peak_mb: float
    detail: dict[str, float] = field(default_factory=dict)


@dataclass
class Row:
    workload: str
    tool: str
    status: str  # "ok", "not found", "not run", "failed", "timeout"
    samples: list[Sample] = field(default_factory=list)
    note: str = ""

    @property
    def seconds(self) -> float | None:
        return statistics.median(s.seconds for s in self.samples) if self.samples else None

    @property
    def peak_mb(self) -> float | None:
        return max(s.peak_mb for s in self.samples) if self.samples else None


# A tiny process, started before the benchmark builds anything, that spawns every measured command and
# reports `os.wait4`'s rusage for it. A child's ru_maxrss counts the memory its parent had mapped when it
# was spawned (Linux carries the old image's high-water mark across exec), so spawning from this bare
# interpreter keeps that floor at its ~10 MB instead of the benchmark's own size. The floor is measured
# (`true`) and printed with the table.
LAUNCHER = r"""
import json, os, sys, time
for line in sys.stdin:
    request = json.loads(line)
    with open(request["stdout"], "wb") as out, open(request["stderr"], "wb") as err, \
            open(os.devnull, "rb") as null:
        actions = [(os.POSIX_SPAWN_DUP2, null.fileno(), 0), (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                   (os.POSIX_SPAWN_DUP2, err.fileno(), 2)]
        started = time.perf_counter()
        pid = os.posix_spawn(request["argv"][0], request["argv"], request["env"], file_actions=actions)
        deadline = started + request["timeout"]
        timed_out = False
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.perf_counter() > deadline:
                os.kill(pid, 9)
                done, status, usage = os.wait4(pid, 0)
                timed_out = True
                break
            time.sleep(0.002)
        elapsed = time.perf_counter() - started
    print(json.dumps({"code": os.waitstatus_to_exitcode(status), "seconds": elapsed,
                      "maxrss_kb": usage.ru_maxrss, "timed_out": timed_out}), flush=True)
"""


class Launcher:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.directory = tempfile.TemporaryDirectory(prefix="qconvert-bench-io-")

    def run(
        self, command: list[str], env: dict[str, str] | None = None
    ) -> tuple[int, float, float, str, str]:
        """Run one command; return (exit code, wall seconds, peak RSS in MB of that child, stdout, stderr)."""
        out, err = Path(self.directory.name) / "stdout", Path(self.directory.name) / "stderr"
        request = {
            "argv": command,
            "env": env if env is not None else dict(os.environ),
            "timeout": TIMEOUT,
            "stdout": str(out),
            "stderr": str(err),
        }
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        stdout = out.read_text(encoding="utf-8", errors="replace")
        stderr = err.read_text(encoding="utf-8", errors="replace")
        if reply["timed_out"]:
            raise TimeoutError(" ".join(command))
        # Linux reports ru_maxrss in KiB.
        return reply["code"], reply["seconds"], reply["maxrss_kb"] / 1024, stdout, stderr

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()
        self.directory.cleanup()


LAUNCH: Launcher | None = None


def start_launcher(timeout: float) -> Launcher:
    """Start the launcher `run_child` spawns through (first, while this process is small), `timeout` a run."""
    global LAUNCH, TIMEOUT
    TIMEOUT = timeout
    LAUNCH = Launcher()
    return LAUNCH


def run_child(command: list[str], env: dict[str, str] | None = None) -> tuple[int, float, float, str, str]:
    assert LAUNCH is not None
    return LAUNCH.run(command, env)


def last_line(text: str) -> str:
    """The last non-empty line of a tool's stderr (the error message, after any traceback)."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:200]
    return ""


def child_env() -> dict[str, str]:
    """The environment of the qconvert children: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def measure_in_process(workload: str, source: Path, output: Path, repeat: int) -> Row:
    row = Row(workload, "qconvert (in-process)", "ok")
    for _ in range(repeat):
        try:
            code, _, peak_mb, stdout, stderr = run_child(
                [sys.executable, "-c", IN_PROCESS, str(source), str(output)], child_env()
            )
        except TimeoutError:
            return Row(workload, row.tool, "timeout", note=f"over {TIMEOUT:.0f} s")
        if code != 0:
            return Row(workload, row.tool, "failed", note=last_line(stderr) or f"exit {code}")
        detail = json.loads(stdout.strip().splitlines()[-1])
        row.samples.append(Sample(detail["parse_s"] + detail["print_s"], peak_mb, detail))
    sample = row.samples[-1].detail
    row.note = (
        f"parse {statistics.median(s.detail['parse_s'] for s in row.samples):.2f} s + print "
        f"{statistics.median(s.detail['print_s'] for s in row.samples):.2f} s (verify "
        f"{statistics.median(s.detail['verify_s'] for s in row.samples):.2f} s not counted); "
        f"{sample['rss_after_import_kb'] / 1024:.0f} MB after import"
    )
    return row


def measure_command(
    workload: str, tool: str, command: list[str], output: Path, repeat: int, env: dict[str, str] | None = None
) -> Row:
    """Run `command` `repeat` times; it must exit 0 and write `output` (removed before each run, so a
    stale file never passes for a run that wrote nothing)."""
    row = Row(workload, tool, "ok")
    for _ in range(repeat):
        output.unlink(missing_ok=True)
        try:
            code, seconds, peak_mb, _, stderr = run_child(command, env)
        except TimeoutError:
            return Row(workload, tool, "timeout", note=f"over {TIMEOUT:.0f} s")
        if code != 0 or not output.exists():
            return Row(workload, tool, "failed", note=last_line(stderr) or f"exit {code}")
        row.samples.append(Sample(seconds, peak_mb))
    row.note = f"output {output.stat().st_size / 1e6:.1f} MB"
    return row


def find_xdsl_opt() -> str | None:
    beside = Path(sys.executable).parent / "xdsl-opt"
    return str(beside) if beside.exists() else shutil.which("xdsl-opt")


def find_iree_opt() -> tuple[str | None, str]:
    """The native iree-opt binary of iree-base-compiler (not its Python wrapper, which adds a start-up)."""
    try:
        from iree.compiler.tools import binaries  # type: ignore[import-not-found]

        path = binaries.find_tool("iree-opt")
        if path and Path(path).exists():
            return str(path), "iree-base-compiler"
    except Exception:
        pass
    found = shutil.which("iree-opt")
    return (found, "PATH") if found else (None, "")


def same_output(a: Path, b: Path) -> bool:
    return a.read_text(encoding="utf-8").rstrip("\n") == b.read_text(encoding="utf-8").rstrip("\n")


def xdsl_can_read(xdsl: str, text: str, directory: Path) -> tuple[bool, str]:
    """Try xdsl-opt on a small module of the same kind; a workload it rejects is `not run`."""
    probe = directory / "xdsl-probe.mlir"
    probe.write_text(text, encoding="utf-8")
    code, _, _, _, stderr = run_child([xdsl, str(probe), "-o", str(directory / "xdsl-probe.out.mlir")])
    return code == 0, last_line(stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ops", type=int, default=100_000, help="ops in the mixed and arith modules")
    parser.add_argument("--scales", type=int, default=65_536, help="scales of the per-axis type")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (the median is shown)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds allowed per run")
    parser.add_argument("--json", type=Path, help="write every sample to this file")
    parser.add_argument("--skip-xdsl", action="store_true", help="do not run xdsl-opt (it is the slowest)")
    arguments = parser.parse_args(argv)
    if arguments.ops < 1 or arguments.scales < 1 or arguments.repeat < 1 or arguments.timeout <= 0:
        parser.error("--ops, --scales, --repeat and --timeout must be positive")

    launcher = start_launcher(arguments.timeout)
    try:
        return run_benchmark(arguments)
    finally:
        launcher.close()


def run_benchmark(arguments: argparse.Namespace) -> int:
    rows: list[Row] = []
    checks: list[str] = []
    true = shutil.which("true")
    floor_mb = run_child([true])[2] if true else None
    xdsl = None if arguments.skip_xdsl else find_xdsl_opt()
    iree, iree_origin = find_iree_opt()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qconvert-bench-") as temp:
        directory = Path(temp)
        workloads = {
            "mixed": (generate_mixed(arguments.ops), f"{arguments.ops} ops, quant casts + arith"),
            "arith": (generate_arith(arguments.ops), f"{arguments.ops} arith.addf"),
            "per-axis": (generate_per_axis(arguments.scales), f"1 type with {arguments.scales} scales"),
        }
        xdsl_probe = {
            "mixed": generate_mixed(8),
            "arith": generate_arith(8),
            "per-axis": generate_per_axis(4),
        }
        for name, (text, description) in workloads.items():
            source = directory / f"{name}.mlir"
            source.write_text(text, encoding="utf-8")
            label = f"{name} ({description}; {len(text) / 1e6:.1f} MB)"
            print(f"[{time.perf_counter() - started:6.1f} s] {label}", file=sys.stderr, flush=True)

            ours = directory / f"{name}.qconvert.mlir"
            rows.append(measure_in_process(label, source, ours, arguments.repeat))
            cli_out = directory / f"{name}.qconvert-opt.mlir"
            rows.append(
                measure_command(
                    label,
                    "qconvert opt (process)",
                    [sys.executable, "-m", "qconvert", "opt", str(source), "-o", str(cli_out)],
                    cli_out,
                    arguments.repeat,
                    child_env(),
                )
            )

            if arguments.skip_xdsl:
                rows.append(Row(label, "xdsl-opt (process)", "not run", note="--skip-xdsl"))
            elif xdsl is None:
                rows.append(Row(label, "xdsl-opt (process)", "not found", note="pip install xdsl"))
            else:
                readable, reason = xdsl_can_read(xdsl, xdsl_probe[name], directory)
                if not readable:
                    rows.append(
                        Row(
                            label,
                            "xdsl-opt (process)",
                            "not run",
                            note=f"xdsl-opt rejects a small module of this kind: {reason}",
                        )
                    )
                else:
                    xdsl_out = directory / f"{name}.xdsl.mlir"
                    rows.append(
                        measure_command(
                            label,
                            "xdsl-opt (process)",
                            [xdsl, str(source), "-o", str(xdsl_out)],
                            xdsl_out,
                            arguments.repeat,
                        )
                    )

            if iree is None:
                rows.append(
                    Row(label, "iree-opt (process)", "not found", note="pip install iree-base-compiler")
                )
            else:
                iree_out = directory / f"{name}.iree.mlir"
                rows.append(
                    measure_command(
                        label,
                        "iree-opt (process)",
                        [iree, str(source), "-o", str(iree_out)],
                        iree_out,
                        arguments.repeat,
                    )
                )
                if rows[-1].status == "ok" and ours.exists():
                    verdict = "identical" if same_output(ours, iree_out) else "DIFFERENT"
                    checks.append(f"{name}: qconvert output vs iree-opt output: {verdict}")
            if ours.exists():
                verdict = "identical" if same_output(ours, source) else "DIFFERENT"
                checks.append(f"{name}: qconvert output vs its input: {verdict}")
            for leftover in directory.glob(f"{name}.*"):
                leftover.unlink()
    total = time.perf_counter() - started

    print_table(rows)
    print()
    if floor_mb is not None:
        print(f"peak MB is each process's ru_maxrss (os.wait4); floor (`true`): {floor_mb:.0f} MB")
    for check in checks:
        print(check)
    print(
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"iree-opt: {iree or 'not found'}{f' ({iree_origin})' if iree else ''}; "
        f"xdsl-opt: {xdsl or ('skipped' if arguments.skip_xdsl else 'not found')}; total {total:.1f} s"
    )
    if arguments.json:
        arguments.json.write_text(
            json.dumps(
                {
                    "ops": arguments.ops,
                    "rss_floor_mb": floor_mb,
                    "scales": arguments.scales,
                    "repeat": arguments.repeat,
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "rows": [
                        asdict(row) | {"median_seconds": row.seconds, "max_peak_mb": row.peak_mb}
                        for row in rows
                    ],
                    "checks": checks,
                },
                indent=2,
            ),
            encoding="utf-8",
        )
    failed = [row for row in rows if row.status in ("failed", "timeout") and row.tool.startswith("qconvert")]
    return 1 if failed else 0


def print_table(rows: list[Row]) -> None:
    header = ("workload", "tool", "seconds", "peak MB", "notes")
    cells = [
        (
            row.workload,
            row.tool,
            f"{row.seconds:.2f}" if row.seconds is not None else row.status,
            f"{row.peak_mb:.0f}" if row.peak_mb is not None else "-",
            row.note,
        )
        for row in rows
    ]
    widths = [max(len(header[i]), *(len(c[i]) for c in cells)) for i in range(4)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " | notes"
    print(line)
    print("-" * len(line))
    previous = None
    for cell in cells:
        workload = cell[0] if cell[0] != previous else ""
        previous = cell[0]
        print(" | ".join(v.ljust(w) for v, w in zip((workload, *cell[1:4]), widths)) + " | " + cell[4])


if __name__ == "__main__":
    sys.exit(main())

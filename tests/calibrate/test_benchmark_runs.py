"""benchmarks/calibrate.py still runs: both tools, a fresh process per row, figures that add up; and
benchmarks/pool_speedups.py pairs the rounds of its JSON files.

This checks the script, not the figures (speed targets are the benchmark's to show, not a unit test's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import require_module

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate.py"


def test_the_quick_benchmark_runs_both_tools(tmp_path: Path) -> None:
    require_module("torch")  # the benchmark builds its encoder with models/build_bert_mask.py
    rows_path = tmp_path / "rows.json"
    command = [sys.executable, str(BENCHMARK), "--quick", "--methods", "minmax,entropy", "--repeat", "2"]
    done = subprocess.run(
        [*command, "--keep", str(tmp_path / "work"), "--json", str(rows_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(rows_path.read_text())
    assert sorted((row["tool"], row["method"].lower()) for row in rows) == [
        ("onnxruntime", "entropy"),
        ("onnxruntime", "minmax"),
        ("qconvert", "entropy"),
        ("qconvert", "minmax"),
    ]
    for row in rows:
        assert row["status"] == "ok" and row["samples"] == 32, row
        assert 0 < row["calibrate_seconds"] < row["seconds"] and row["peak_mb"] > 50, row
        assert len(row["runs"]) == 2 and row["peak_mb"] == max(run[3] for run in row["runs"]), row
    peers = {row["method"].lower(): row for row in rows if row["tool"] == "onnxruntime"}
    for row in rows:
        expected = None if row["tool"] == "onnxruntime" else peers[row["method"]]["seconds"] / row["seconds"]
        assert row["speedup"] == expected, row
    assert "samples  method" in done.stdout  # the table


POOL = BENCHMARK.with_name("pool_speedups.py")


def test_pooled_speedups_pair_each_round_of_every_file(tmp_path: Path) -> None:
    def row(tool: str, method: str, seconds: list[float]) -> dict[str, object]:
        runs = [[value, value - 0.2, value, 400.0] for value in seconds]
        return {"tool": tool, "method": method, "samples": 32, "runs": runs}

    first = [
        row("onnxruntime", "Entropy", [4.0, 3.0]),
        row("qconvert", "entropy", [1.0, 1.5]),
        row("onnxruntime", "Percentile", []),  # failed in its first round: nothing to pair
        row("qconvert", "percentile", [1.0]),
    ]
    second = [row("onnxruntime", "Entropy", [6.0, 5.0]), row("qconvert", "entropy", [2.0])]  # qconvert failed
    paths = [tmp_path / "first.json", tmp_path / "second.json"]
    for path, rows in zip(paths, (first, second), strict=True):
        path.write_text(json.dumps(rows))

    def pool(*paths: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(POOL), *map(str, paths)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    done = pool(*paths, paths[0])  # the first file twice: counted once
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "percentile" not in done.stdout, done.stdout
    # Rounds 4/1, 3/1.5 and 6/2: ratios 4 and 2 in one file, 3 in the other. The interval resamples files:
    # the first twice (geometric mean 8**(1/2)), the second twice (3), or one of each (24**(1/3)).
    geometric_mean, interval = f"{24 ** (1 / 3):.2f}x", f"{8 ** (1 / 2):.2f}-3.00"
    expected = ["32", "entropy", "qconvert", "3", geometric_mean, interval, "3.00", "2.00-4.00", "2/3"]
    assert lines[1].split() == expected

    (tmp_path / "alone.json").write_text(json.dumps([row("qconvert", "entropy", [1.0])]))
    alone = pool(tmp_path / "alone.json")
    assert alone.returncode == 2 and "no rounds to pair" in alone.stderr
    zero_rows = [row("onnxruntime", "entropy", [1.0]), row("qconvert", "entropy", [0.0])]
    (tmp_path / "zero.json").write_text(json.dumps(zero_rows))
    zero = pool(tmp_path / "zero.json")
    assert zero.returncode == 2 and "a run of 0.0 s" in zero.stderr and "Traceback" not in zero.stderr
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    refused = pool(tmp_path / "other.json")
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "not the --json rows of benchmarks/calibrate.py"
    )

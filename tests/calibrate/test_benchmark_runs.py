"""benchmarks/calibrate.py still runs: both tools, a fresh process per row, figures that add up.

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

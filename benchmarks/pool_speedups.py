"""Speed-ups pooled over several runs of benchmarks/calibrate.py (its --json files), paired round by round.

With `--repeat R` the two tools take turns in each round, so a round's onnxruntime run and a qconvert run
saw the same minute of this shared machine, and their ratio is that round's speed-up. One invocation's
`speed-up` column (the ratio of R medians) moves by 10-20% between invocations here; pooling the rounds
of many invocations says how far the speed-up itself is known. Per N and method this prints the rounds
paired, the geometric mean of their ratios with a 95% bootstrap interval, the median and range, and how
many rounds reach `--target`. The interval resamples whole files (10,000 times, fixed seed, so the same
files give the same figures): the rounds of one invocation ran in the same hour and vary together, so
resampling rounds alone would make it too narrow. A tool that failed in a round has no ratio for it.
Give it runs of one model and one set of options: the rows do not say which model they ran.

Usage: python benchmarks/pool_speedups.py run1.json run2.json ... [--target 3]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

RESAMPLES = 10_000
SEED = 0


def paired_ratios(rows: list[dict[str, Any]]) -> dict[tuple[int, str, str], list[float]]:
    """(samples, method, tool) -> onnxruntime's seconds over the tool's, one per round both ran. A method
    listed twice in one run has two rows per tool: the n-th of a tool pairs with onnxruntime's n-th."""
    peers: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["tool"] == "onnxruntime":
            peers[(row["samples"], row["method"].lower())].append(row)
    seen: dict[tuple[int, str, str], int] = defaultdict(int)
    ratios: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for row in rows:
        if row["tool"] == "onnxruntime":
            continue
        key = (row["samples"], row["method"].lower(), row["tool"])
        candidates = peers[key[:2]]
        index, seen[key] = seen[key], seen[key] + 1
        if index >= len(candidates):
            continue
        # runs: (seconds, calibrate s, cpu s, peak MB) per round, in the order the rounds ran; a tool that
        # failed ran no later round, so the rounds both ran are the first ones of each
        for theirs, ours in zip(candidates[index]["runs"], row["runs"], strict=False):
            if theirs[0] <= 0 or ours[0] <= 0:
                raise ValueError(
                    f"a run of {min(theirs[0], ours[0])} s ({row['method']}, N = {row['samples']})"
                )
            ratios[key].append(theirs[0] / ours[0])
    return dict(ratios)


def bootstrap_interval(
    files: list[list[float]], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles, exponentiated, of the mean of the log ratios pooled from
    `resamples` resamplings of `files` (one list of log ratios per file); one file's rounds are resampled
    one by one, since there is nothing else to resample."""
    clusters = [[value] for value in files[0]] if len(files) == 1 else files
    generator = random.Random(seed)
    means = sorted(
        statistics.fmean(
            [value for cluster in generator.choices(clusters, k=len(clusters)) for value in cluster]
        )
        for _ in range(resamples)
    )
    return math.exp(means[int(0.025 * resamples)]), math.exp(means[int(0.975 * resamples) - 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path, help="--json outputs of benchmarks/calibrate.py")
    parser.add_argument("--target", type=float, default=3.0, help="the speed-up to count rounds against")
    args = parser.parse_args(argv)
    pooled: dict[tuple[int, str, str], list[list[float]]] = defaultdict(list)  # the ratios of each file
    for path in dict.fromkeys(path.resolve() for path in args.files):  # a file given twice counts once
        try:
            ratios_of_file = paired_ratios(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            print(f"pool_speedups: {path}: {error}", file=sys.stderr)
            return 2
        except (KeyError, TypeError, IndexError):
            print(f"pool_speedups: {path}: not the --json rows of benchmarks/calibrate.py", file=sys.stderr)
            return 2
        for key, ratios in ratios_of_file.items():
            pooled[key].append(ratios)
    if not any(ratios for files in pooled.values() for ratios in files):
        print(
            "pool_speedups: no rounds to pair: no onnxruntime row ran beside another tool's", file=sys.stderr
        )
        return 2
    print(
        f"{'samples':>7}  {'method':<15} {'tool':<14} {'rounds':>6} {'geo-mean':>9} {'95% interval':>13} "
        f"{'median':>7} {'range':>11} {f'>= {args.target:g}x':>8}"
    )
    for (samples, method, tool), files in sorted(pooled.items()):
        logs_per_file = [[math.log(ratio) for ratio in ratios] for ratios in files if ratios]
        if not logs_per_file:
            continue
        ratios = [ratio for file_ratios in files for ratio in file_ratios]
        logs = [value for file_logs in logs_per_file for value in file_logs]
        low, high = bootstrap_interval(logs_per_file)
        reached = sum(ratio >= args.target for ratio in ratios)
        geometric_mean = math.exp(statistics.fmean(logs))
        print(
            f"{samples:>7}  {method:<15} {tool:<14} {len(ratios):>6} {geometric_mean:>8.2f}x "
            f"{f'{low:.2f}-{high:.2f}':>13} {statistics.median(ratios):>7.2f} "
            f"{f'{min(ratios):.2f}-{max(ratios):.2f}':>11} {f'{reached}/{len(ratios)}':>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speed-ups pooled over several runs of benchmarks/calibrate.py (its --json files), paired round by round.

With `--repeat R` the two tools take turns in each round, so a round's onnxruntime run and a qconvert run
saw the same minute of this shared machine, and their ratio is that round's speed-up. One invocation's
`speed-up` column (the ratio of R medians) moves by 10-20% between invocations here; pooling the rounds
of many invocations says how far the speed-up itself is known. Per N and method this prints the rounds
paired, the geometric mean of their ratios with a 95% bootstrap interval (10,000 resamples of the rounds,
fixed seed, so the same files give the same figures), the median and range, and how many rounds reach
`--target`. A tool that failed in a round has no ratio for it.

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
    """(samples, method, tool) -> onnxruntime's seconds over the tool's, one per round both ran."""
    peers = {(row["samples"], row["method"].lower()): row for row in rows if row["tool"] == "onnxruntime"}
    ratios: dict[tuple[int, str, str], list[float]] = {}
    for row in rows:
        peer = peers.get((row["samples"], row["method"].lower()))
        if row["tool"] == "onnxruntime" or peer is None:
            continue
        # runs: (seconds, calibrate s, cpu s, peak MB) per round, in the order the rounds ran; a tool that
        # failed ran no later round, so the rounds both ran are the first ones of each
        pairs = zip(peer["runs"], row["runs"], strict=False)
        key = (row["samples"], row["method"].lower(), row["tool"])
        ratios[key] = [theirs[0] / ours[0] for theirs, ours in pairs]
    return ratios


def bootstrap_interval(
    logs: list[float], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the mean of `logs` over `resamples` resamplings, exponentiated."""
    generator = random.Random(seed)
    means = sorted(statistics.fmean(generator.choices(logs, k=len(logs))) for _ in range(resamples))
    return math.exp(means[int(0.025 * resamples)]), math.exp(means[int(0.975 * resamples) - 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path, help="--json outputs of benchmarks/calibrate.py")
    parser.add_argument("--target", type=float, default=3.0, help="the speed-up to count rounds against")
    args = parser.parse_args(argv)
    pooled: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for path in args.files:
        try:
            ratios_of_file = paired_ratios(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            print(f"pool_speedups: {path}: {error}", file=sys.stderr)
            return 2
        except (KeyError, TypeError, IndexError):
            print(f"pool_speedups: {path}: not the --json rows of benchmarks/calibrate.py", file=sys.stderr)
            return 2
        for key, ratios in ratios_of_file.items():
            pooled[key].extend(ratios)
    print(
        f"{'samples':>7}  {'method':<15} {'tool':<14} {'rounds':>6} {'geo-mean':>9} {'95% interval':>13} "
        f"{'median':>7} {'range':>11} {f'>= {args.target:g}x':>8}"
    )
    for (samples, method, tool), ratios in sorted(pooled.items()):
        if not ratios:
            continue
        logs = [math.log(ratio) for ratio in ratios]
        low, high = bootstrap_interval(logs)
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

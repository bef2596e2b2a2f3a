"""The corpus status matrix: corpus model x {convert quantized / integer / qdq, check interpreter / xla}.

    .venv/bin/python models/corpus/status.py [--corpus DIR] [--only NAME ...] [--output FILE] [--xfail-table]

Builds the corpus into DIR first when DIR has no manifest.json (default: a temporary folder). Each entry
runs in a subprocess of its own (a crash or a hang of one engine costs one row, not the run; --timeout
seconds per entry). Prints the matrix (ok / FAIL with seconds), then every failure's short reason and the
reasons grouped with counts; `--output` also writes it to FILE. `--xfail-table` prints the failures as the
`EXPECTED_FAILURES` dict of tests/corpus/test_corpus.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus_checks import OPERATIONS, Outcome, run_operation  # noqa: E402
from corpus_manifest import BY_NAME, ENTRIES, CorpusEntry  # noqa: E402

SHORT_NAMES = {
    "convert:quantized": "cv:quant",
    "convert:integer": "cv:int",
    "convert:qdq": "cv:qdq",
    "check:interpreter": "ck:interp",
    "check:xla": "ck:xla",
}


def worker(corpus: Path, name: str) -> None:
    """Run the five operations of one entry; print one JSON line per operation."""
    entry = BY_NAME[name]
    for operation in OPERATIONS:
        outcome = run_operation(corpus / entry.file, corpus / entry.inputs_file, operation)
        record = {
            "operation": operation,
            "ok": outcome.ok,
            "reason": outcome.reason,
            "seconds": outcome.seconds,
        }
        print(json.dumps(record), flush=True)


def run_entry(corpus: Path, entry: CorpusEntry, timeout: float) -> dict[str, Outcome]:
    command = [sys.executable, str(Path(__file__).resolve()), "--corpus", str(corpus), "--worker", entry.name]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        stdout, problem = done.stdout, None if done.returncode == 0 else f"worker exit {done.returncode}"
        if problem and done.stderr.strip():
            problem += ": " + done.stderr.strip().splitlines()[-1]
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        problem = f"timed out after {timeout:.0f} s"
    outcomes: dict[str, Outcome] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            outcomes[record["operation"]] = Outcome(record["ok"], record["reason"], record["seconds"])
    for operation in OPERATIONS:
        if operation not in outcomes:
            outcomes[operation] = Outcome(False, problem or "no result", time.perf_counter() - started)
    return outcomes


def group_key(reason: str) -> str:
    """A reason without node names and numbers, so that the same problem on different nodes groups."""
    reason = re.sub(r"'[^']*'", "'…'", reason)
    return re.sub(r"\d+(\.\d+)?", "N", reason)


def render(results: dict[str, dict[str, Outcome]], corpus: Path, seconds: float) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    revision = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    width = max(len(name) for name in results) + 2
    lines = [
        f"qconvert corpus status, {when}, HEAD {revision} (+ uncommitted work in the tree), corpus {corpus}",
        "each cell: ok or FAIL, seconds; convert = --to stablehlo with the inputs' shapes; check = nothing",
        "not run, nothing failed, every output within the noise floor (models/corpus/corpus_checks.py)",
        "",
        "entry".ljust(width) + "".join(SHORT_NAMES[op].ljust(13) for op in OPERATIONS),
    ]
    for name, outcomes in results.items():
        cells = [f"{'ok' if o.ok else 'FAIL'} {o.seconds:5.1f}s".ljust(13) for o in outcomes.values()]
        lines.append(name.ljust(width) + "".join(cells))
    total = sum(len(o) for o in results.values())
    passed = sum(o.ok for outcomes in results.values() for o in outcomes.values())
    lines += ["", f"{passed} of {total} ok; {seconds:.0f} s in all", "", "Failures:"]
    groups: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for name, outcomes in results.items():
        for operation, outcome in outcomes.items():
            if not outcome.ok:
                lines.append(f"  {name:22} {SHORT_NAMES[operation]:10} {outcome.reason}")
                key = group_key(outcome.reason)
                groups[key] += 1
                examples.setdefault(key, outcome.reason)
    lines += ["", "Failure reasons grouped (count: one example):"]
    lines += [f"  {count:3}: {examples[key]}" for key, count in groups.most_common()]
    return "\n".join(lines) + "\n"


def xfail_table(results: dict[str, dict[str, Outcome]]) -> str:
    lines = ["EXPECTED_FAILURES: dict[tuple[str, str], str] = {"]
    for name, outcomes in results.items():
        for operation, outcome in outcomes.items():
            if not outcome.ok:
                lines.append(f"    ({name!r}, {operation!r}): {outcome.reason[:90]!r},")
    lines.append("}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--corpus", type=Path, help="corpus folder (built there when it has no manifest.json)"
    )
    parser.add_argument("--only", nargs="+", help="entries (arch.style) or architectures")
    parser.add_argument("--output", type=Path, help="also write the matrix to this file")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per entry (default 600)")
    parser.add_argument("--xfail-table", action="store_true", help="print the failures as a Python dict")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.corpus, args.worker)
        return 0
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix="qconvert-corpus-"))
    if not (corpus / "manifest.json").exists():
        subprocess.run([sys.executable, str(HERE / "build.py"), "--out", str(corpus)], check=True)
    chosen = [e for e in ENTRIES if not args.only or e.name in args.only or e.architecture in args.only]
    started = time.perf_counter()
    results: dict[str, dict[str, Outcome]] = {}
    for entry in chosen:
        results[entry.name] = run_entry(corpus, entry, args.timeout)
        marks = " ".join("ok" if o.ok else "F" for o in results[entry.name].values())
        print(f"{entry.name}: {marks}", file=sys.stderr, flush=True)
    text = render(results, corpus, time.perf_counter() - started)
    print(text, end="")
    if args.output:
        args.output.write_text(text)
    if args.xfail_table:
        print(xfail_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

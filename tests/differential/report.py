"""Prints every disagreement class of the differential test at once, with reproducers.

    .venv/bin/python tests/differential/report.py [--examples N] [--types N] [--modules N]

Uses the same seeds and generators as test_against_mlir.py (the counts may be raised to search wider).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from differential.generators import generate_module_cases, generate_type_cases
from differential.harness import (
    PIPELINES,
    Comparison,
    MlirOracle,
    collect,
    known_crash,
    ours_parse,
    ours_pass,
    pass_unavailable,
)
from differential.test_against_mlir import MODULE_SEED, TYPE_SEED, type_module


def section(title: str, comparisons: list[Comparison], examples: int) -> None:
    verdicts = dict(Counter(c.verdict for c in comparisons))
    print(f"\n{'#' * 100}\n# {title}: {len(comparisons)} compared; {verdicts}")
    for name, wrong in (
        ("validity / printed text", lambda c: not c.agrees),
        ("error messages", lambda c: c.verdict == "both-reject" and not c.messages_equal),
        (
            "error locations",
            lambda c: c.verdict == "both-reject" and c.messages_equal and not c.locations_equal,
        ),
    ):
        print()
        print(collect(f"{title}: {name}", comparisons, wrong).render(examples=examples, limit=100))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=1)
    parser.add_argument("--types", type=int, default=6000)
    parser.add_argument("--modules", type=int, default=1500)
    args = parser.parse_args()
    start = time.time()
    oracle = MlirOracle()

    types = generate_type_cases(TYPE_SEED, args.types)
    texts = [type_module(c.text) for c in types]
    mlir = oracle.run([(t, None) for t in texts])
    section(
        "types",
        [Comparison(c.category, t, m, ours_parse(t), c.text) for c, t, m in zip(types, texts, mlir)],
        args.examples,
    )

    modules = generate_module_cases(MODULE_SEED, args.modules)
    mlir = oracle.run([(c.text, None) for c in modules])
    module_comparisons = [
        Comparison(c.category, c.text, m, ours_parse(c.text)) for c, m in zip(modules, mlir)
    ]
    section("modules", module_comparisons, args.examples)

    valid = [c for c in module_comparisons if c.verdict == "same-text"]
    for pass_name in PIPELINES:
        why = pass_unavailable(pass_name)
        if why:
            print(f"\n# {pass_name}: not available in qconvert ({why})")
            continue
        runnable = [c for c in valid if known_crash(c.text, pass_name) is None]
        skipped = Counter(known_crash(c.text, pass_name) for c in valid if known_crash(c.text, pass_name))
        results = oracle.run([(c.text, pass_name) for c in runnable])
        comparisons = [
            Comparison(c.category, c.text, m, ours_pass(c.text, pass_name)) for c, m in zip(runnable, results)
        ]
        print(f"\n{'#' * 100}\n# pass {pass_name}: {len(comparisons)} run")
        print(f"# not run (upstream crashes): {dict(skipped)}")
        print(f"# verdicts: {dict(Counter(c.verdict for c in comparisons))}")
        print(
            collect(f"{pass_name}: output", comparisons, lambda c: c.mlir.ok and not c.agrees).render(
                args.examples
            )
        )
        print(
            collect(f"{pass_name}: qconvert raised", comparisons, lambda c: c.ours.crashed).render(
                args.examples
            )
        )
        failed = [c for c in comparisons if not c.mlir.ok]
        print(f"\n# {pass_name}: MLIR's output fails to verify on {len(failed)} modules (not compared)")
        print(
            f"#   and ours then: {dict(Counter('rejects' if not c.ours.ok else 'accepts' for c in failed))}"
        )
    print(f"\n# total {time.time() - start:.1f} s; MLIR worker restarts after crashes: {oracle.restarts}")


if __name__ == "__main__":
    main()

"""Fuzzing the MLIR side (issue 23): structure-aware mutations of MLIR text through parse -> verify ->
print -> parse again -> passes, as `qconvert opt` runs them.

Contract, per mutated input:
- no exception but our diagnostics (QConvertError): anything else is a bug of ours (exit 3 in the CLI);
- no hang: each input is bounded in time (SIGALRM), and the whole run by a time budget;
- memory bounded: the process's peak stays under PEAK_BYTES (a small splat of a huge type was 16 GiB);
- what parses and verifies prints, and the printed text parses and prints to the same text; the same for
  each pass's output.

Seeds: the `// -----` chunks of upstream's quant dialect tests (../shared/conformance/mlir-quant) and a
few of ours. Mutations work on tokens (our lexer's): numbers swapped for edge values (leading zeros,
5,000 digits, hex, huge exponents), tokens deleted, duplicated, swapped or replaced by others of the
corpus, punctuation and keywords inserted, spans spliced from another seed, and spans wrapped in many
levels of brackets.

Fixed seed and a ~60 s budget in CI (`QCONVERT_FUZZ_EXAMPLES`, default 10,000 inputs;
`QCONVERT_FUZZ_SECONDS`, default 60); a longer run:

    QCONVERT_FUZZ_EXAMPLES=100000 QCONVERT_FUZZ_SECONDS=3600 QCONVERT_FUZZ_SEED=7 \
        pytest tests/fuzz/test_mlir_fuzz.py
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import peak_memory, reset_peak_memory
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from qconvert.errors import QConvertError
from qconvert.ir.lexer import Lexer
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.ir.verify import verify
from qconvert.opt import parse_arguments, run_opt
from qconvert.passes import get_pass

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("QCONVERT_FUZZ_EXAMPLES", "10000"))
SECONDS = float(os.environ.get("QCONVERT_FUZZ_SECONDS", "60"))
SEED = int(os.environ.get("QCONVERT_FUZZ_SEED", "23"))
SECONDS_PER_INPUT = 10  # a chunk of a few hundred bytes takes milliseconds
PEAK_BYTES = 3 * 2**30  # the process's peak: a few hundred MB for pytest, numpy and the IR; never GBs
PASSES = [
    "normalize-quant-types",
    "lower-quant-ops",
    "strip-func-quant-types",
    "canonicalize",
    "inline",
    "dce",
]
OUR_SEEDS = [
    """!q = !quant.uniform<i8:f32, 0.5:3>
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = quant.qcast %arg0 : tensor<4xf32> to tensor<4x!q>
  %1 = quant.dcast %0 : tensor<4x!q> to tensor<4xf32>
  return %1 : tensor<4xf32>
}""",
    """func.func @g(%arg0: tensor<2x4x!quant.uniform<i4:f32:{0:1,1:2}, {{0.5:1, 0.25}, {1.0, 2.0:-1}}>>)
    -> tensor<2x4xf32> {
  %0 = quant.dcast %arg0 : tensor<2x4x!quant.uniform<i4:f32:{0:1,1:2}, {{0.5:1, 0.25}, {1.0, 2.0:-1}}>>
      to tensor<2x4xf32>
  %c = arith.constant dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]> : tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}""",
    """func.func @h(%arg0: tensor<3x!quant.uniform<u8:f32:0, {1.0:128, 2.0:3, 0.5}>>) -> tensor<3xi8> {
  %0 = quant.scast %arg0 : tensor<3x!quant.uniform<u8:f32:0, {1.0:128, 2.0:3, 0.5}>> to tensor<3xi8>
  %1 = "test.op"(%0) ({
  ^bb0(%a: i8):
    "test.yield"(%a) : (i8) -> ()
  }) {attr = [1, 2.5, "s", @sym, array<i32: 1, 2>, dense_resource<b> : tensor<2xi8>]} : (tensor<3xi8>) -> i8
  return %0 : tensor<3xi8>
}""",
    """#map = affine_map<(d0, d1) -> (d1, d0)>
!c = !quant.calibrated<f32<-1.0:2.5>>
!a = !quant.any<i8<-8:7>:f32>
!t = !quant.quantile<i2:f16, {-1.0, -0.5, 0.5, 1.0}>
func.func private @decl(tensor<2x!c>, vector<[4]x2xf32>, !a, tensor<*x!t>) -> (index, none)
func.func @k() -> (tensor<2x2xi8>, tensor<3xf16>) attributes {m = #map, u, f = 0x7FC00000 : f32} {
  %0 = arith.constant dense<"0x01020304"> : tensor<2x2xi8>
  %1 = arith.constant dense_resource<blob> : tensor<3xf16> loc("x.mlir":1:2)
  %2 = arith.constant dense<[0x7C00, -0.0, 1.5]> : tensor<3xf16>
  return %0, %1 : tensor<2x2xi8>, tensor<3xf16>
}
{-#
  dialect_resources: {
    builtin: {
      blob: "0x02000000003C00400042"
    }
  }
#-}""",
]


def seeds() -> list[str]:
    """Chunks of the upstream quant tests (their RUN and CHECK lines are comments) and ours."""
    folder = Path(os.environ.get("QCONVERT_CONFORMANCE_DIR", ROOT.parent / "shared" / "conformance"))
    chunks = list(OUR_SEEDS)
    for path in sorted((folder / "mlir-quant").glob("*.mlir")):
        for chunk in re.split(r"^// -----.*$", path.read_text(encoding="utf-8"), flags=re.M):
            body = "\n".join(
                line
                for line in chunk.split("\n")
                if not line.lstrip().startswith("//") or "expected-" in line  # for --verify-diagnostics
            )
            if body.strip() and len(body) < 4000:
                chunks.append(body)
    return chunks


def tokens(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of each token, by our lexer (an `error` token for a character it does not read)."""
    lexer = Lexer(text)
    found = []
    while lexer.token.kind != "eof" and len(found) < 5000:
        token = lexer.token
        found.append((token.start, token.end, token.kind))
        lexer.reset(token.end)
    return found


SEEDS = seeds()
NUMBERS = [
    "1",
    "2",
    "3",
    "127",
    "-128",
    "255",
    "0.5",
    "1.0e-3",
    "0",
    "01",
    "007",
    "-0",
    "1" * 5000,
    "0x" + "F" * 40,
    "0x7FC00000",
    "1.0e309",
    "1e-400",
    "4294967296",
    "9223372036854775808",
    "-9223372036854775809",
    "65535",
    "0.0",
    "nan",
    "inf",
]
INSERTS = [
    "<",
    ">",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    "=",
    "x",
    "?",
    "*",
    "->",
    "%0",
    "%arg0",
    "^bb0",
    '"',
    "@f",
    "#a",
    "!q",
    "loc(",
    "tensor<",
    "vector<",
    "!quant.uniform<",
    "!quant.any<",
    "!quant.calibrated<",
    "{-#",
    "#-}",
    "dense<",
    "dense_resource<",
    "array<i8:",
    "func.func",
    "return",
    "quant.qcast",
    "module {",
    "// expected-error@+1 {{",
    "// expected-error-re@+1 {{{{(.|.)*[}}}}\n",
    "}}\n",
    "\n// -----\n",
    "u8",
    "i4",
    "f16",
    "0x",
    "\\",
    "\n",
]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A seed with one to three mutations. Choices come from a Random seeded by hypothesis: uniform over
    tokens (hypothesis's own draws favour the first elements, and most inputs would break at token 0)."""
    rnd = random.Random(draw(st.integers(0, 2**64 - 1)))
    text = rnd.choice(VALID_SEEDS if rnd.random() < 0.8 else SEEDS)
    for _ in range(rnd.choice([1, 1, 1, 2, 3])):  # mostly one: most inputs stay near valid
        spans = tokens(text)
        if not spans:
            text += rnd.choice(INSERTS)
            continue
        start, end, kind = rnd.choice(spans)
        action = rnd.choice(["number", "delete", "duplicate", "replace", "insert", "splice", "nest", "swap"])
        if action == "replace" and kind in ("integer", "float"):
            action = "number"
        if action == "number":
            numbers = [(a, b) for a, b, k in spans if k in ("integer", "float")]
            if numbers:
                start, end = rnd.choice(numbers)
            text = text[:start] + rnd.choice(NUMBERS) + text[end:]
        elif action == "delete":
            text = text[:start] + text[end:]
        elif action == "duplicate":
            text = text[:end] + text[start:end] * rnd.randint(1, 3) + text[end:]
        elif action == "replace":  # by a token of the same kind (or any kind) from another seed
            other = rnd.choice(SEEDS)
            other_spans = [(a, b) for a, b, k in tokens(other) if k == kind or rnd.random() < 0.2]
            if other_spans:
                other_start, other_end = rnd.choice(other_spans)
                text = text[:start] + other[other_start:other_end] + text[end:]
        elif action == "insert":
            text = text[:start] + rnd.choice(INSERTS) + text[start:]
        elif action == "splice":
            other = rnd.choice(SEEDS)
            begin = rnd.randint(0, len(other))
            text = text[:start] + other[begin : begin + rnd.randint(1, 200)] + text[end:]
        elif action == "nest":
            opener, closer = rnd.choice([("(", ")"), ("[", "]"), ("{", "}"), ("tensor<", ">"), ("<", ">")])
            depth = rnd.choice([1, 2, 70, 200])
            text = text[:start] + opener * depth + text[start:end] + closer * depth + text[end:]
        else:  # swap two tokens
            other_start, other_end, _ = rnd.choice(spans)
            if other_start > end:
                text = (
                    text[:start]
                    + text[other_start:other_end]
                    + text[end:other_start]
                    + text[start:end]
                    + text[other_end:]
                )
    return text


def parses(text: str) -> bool:
    try:
        verify(parse_module(text, "seed.mlir", options=OPTIONS))
    except QConvertError:
        return False
    return True


OPTIONS = ParserOptions(allow_unregistered_dialect=True)
VALID_SEEDS = [text for text in SEEDS if parses(text)]  # four inputs in five start from one of these


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def round_trip(text: str) -> str | None:
    """Parse and verify `text`; None when it is refused with a diagnostic, else its printed form, checked
    to parse and print to itself."""
    try:
        module = parse_module(text, "fuzz.mlir", options=OPTIONS)
        verify(module)
    except QConvertError:
        return None
    printed = print_module(module)
    again = parse_module(printed, "printed.mlir", options=OPTIONS)
    verify(again)
    assert print_module(again) == printed, f"printing is not stable for:\n{text}\nprinted:\n{printed}"
    return printed


def check_contract(text: str) -> None:
    # The driver itself: split chunks, expected-* comments and their regular expressions (RE2).
    for flags in (["--split-input-file", "--verify-diagnostics"], ["--split-input-file", "--canonicalize"]):
        run_opt(text, "fuzz.mlir", parse_arguments(["fuzz.mlir", "--allow-unregistered-dialect", *flags]))
    printed = round_trip(text)
    if printed is None:
        return
    for name in PASSES:
        module = parse_module(printed, "printed.mlir", options=OPTIONS)
        try:
            get_pass(name).run(module)
            verify(module)
        except QConvertError:
            continue
        output = print_module(module)
        assert round_trip(output) == output, f"'{name}' output does not print back to itself:\n{text}"


STARTED: list[float] = []  # when the first input ran: the budget counts from there


@pytest.fixture(scope="module", autouse=True)
def _peak_reset_before_the_runs() -> None:
    reset_peak_memory()  # the peak that PEAK_BYTES bounds is this module's, not earlier tests'


@pytest.mark.slow
@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(mutated())
def test_mutated_mlir_gives_diagnostics_or_round_trips(text: str) -> None:
    if not STARTED:
        STARTED.append(time.monotonic())
    if time.monotonic() - STARTED[0] > SECONDS:  # the run's time budget is spent: the rest pass untested
        return
    with time_limit(SECONDS_PER_INPUT):
        check_contract(text)
    peak = peak_memory()
    assert peak < PEAK_BYTES, f"peak memory {peak} bytes after:\n{text[:2000]}"


@pytest.mark.parametrize("index", range(len(OUR_SEEDS)))
def test_seeds_round_trip(index: int) -> None:
    """Our seeds themselves parse, verify and print back (so mutations start from valid text)."""
    assert round_trip(OUR_SEEDS[index]) is not None

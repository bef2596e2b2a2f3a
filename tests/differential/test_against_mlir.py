"""Differential test against real upstream MLIR (torch-mlir's Python bindings; IREE's as a second opinion).

Thousands of seeded, generated `!quant.*` types and small quant-cast modules go through both upstream MLIR
and qconvert:

* validity: MLIR accepts ⇔ qconvert accepts, and then the printed module is byte-identical
  (`test_types_agree`, `test_modules_agree`, one case per generator category);
* rejection: the error messages are identical (`test_*_error_messages`, one case per class of MLIR
  message) and so are their line:column (`test_*_error_locations`). A class whose messages differ today is
  listed in KNOWN_MESSAGE_DIFFERENCES with what differs, and xfails (strictly: once it matches, the entry
  must go). Validity, printed text and pass output are never xfailed;
* passes: on every module both accept, `lower-quant-ops`, `normalize-quant-types` and
  `strip-func-quant-types` give byte-identical output wherever MLIR's own output verifies
  (`test_pass_output`); our passes never fail with a Python exception (`test_pass_never_crashes`).

Inputs that crash upstream MLIR (harness.KNOWN_CRASHES) are not sent to it; `test_known_upstream_crashes`
checks that each of them still crashes, so the list cannot silently hide a fixed upstream.

Failures print the disagreement classes with the shortest reproducer of each. To see everything at once:
`python -m pytest tests/differential -q -x --tb=short` or run `python tests/differential/report.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

import pytest
from conftest import require_module
from differential.generators import ModuleCase, TypeCase, generate_module_cases, generate_type_cases
from differential.harness import (
    KNOWN_CRASHES,
    PIPELINES,
    Comparison,
    MlirOracle,
    Outcome,
    collect,
    known_crash,
    ours_parse,
    ours_pass,
    pass_unavailable,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TYPE_SEED = 20260415
TYPE_COUNT = 6000
MODULE_SEED = 20260416
MODULE_COUNT = 1500

TYPE_CASES: list[TypeCase] = generate_type_cases(TYPE_SEED, TYPE_COUNT)
MODULE_CASES: list[ModuleCase] = generate_module_cases(MODULE_SEED, MODULE_COUNT)


def type_module(type_text: str) -> str:
    return f"func.func private @f() -> {type_text}\n"


def module_group(category: str) -> str:
    """`module/per-axis/qcast/bad-wrong-dim` -> `module/per-axis/bad`; `module/chain` stays."""
    parts = category.split("/")
    return "/".join(parts[:2]) + ("/bad" if any(p.startswith(("bad-", "no-", "all-")) for p in parts) else "")


TYPE_CATEGORIES = sorted({case.category for case in TYPE_CASES})
MODULE_GROUPS = sorted({module_group(case.category) for case in MODULE_CASES})
PASSES = tuple(PIPELINES)

# Classes of MLIR error messages: (name, regex on MLIR's last error message). The first match wins.
TYPE_MESSAGE_CLASSES: tuple[tuple[str, str], ...] = (
    ("unknown-type", r"^unknown quantized type"),
    ("expected-token", r"^expected '.*'$"),
    ("expected-element", r"^expected (integer value|floating point literal|valid keyword|non-function type)"),
    ("storage-width", r"^expected storage type width"),
    ("invalid-kind", r"^invalid kind of type specified"),
    (
        "lexer",
        r"^(unexpected character|expected three consecutive dots|unexpected decimal integer literal"
        r"|hexadecimal float|integer value too large|invalid integer width|unbalanced)",
    ),
    ("storage-type", r"^illegal storage type (prefix|size)"),
    ("storage-bounds", r"^illegal storage (type minimum|type maximum|min and storage max)"),
    ("scale-range", r"^scale .* out of expressed type range"),
    ("dimension-block", r"^illegal (quantized dimension|block size)"),
    ("tensor-literal", r"^tensor literal is invalid"),
    (
        "calibrated",
        r"^(calibrated values must be present|expecting float expressed type|illegal min and max)",
    ),
    ("quantile", r"quantile|^storage type must be an integer or float type|^storage min must be less"),
    ("container-element", r"failed to verify 'elementType'|element type"),
    ("other", r""),
)
MODULE_MESSAGE_CLASSES: tuple[tuple[str, str], ...] = (
    ("ods-constraint", r"op (operand|result) #\d+ must be"),
    ("shape-trait", r"both scalars or both tensors with matching shape"),
    ("integer-or-quantized", r"input must be integer and result must be quantized"),
    ("element-match", r"^(expressed|storage) type in quantized type expected to match"),
    ("per-axis", r"per-axis|quantized dimension (must be less than tensor rank$|size does not match)"),
    (
        "sub-channel",
        r"sub-channel|Rank of scales|of scales tensor at axis|divisible by the corresponding|"
        r"quantized dimension \d+ must be less than tensor rank",
    ),
    ("container-type", r"failed to verify 'elementType'"),
    ("other", r""),
)

# Message classes where qconvert's diagnostics differ from MLIR's today, with what differs (they xfail
# strictly: when a class starts to match, its entry must go). "Collateral" means the message differs only
# because qconvert accepts or rejects some part of the input that MLIR does not (a validity bug, which
# test_types_agree / test_modules_agree report as a hard failure).
_COLLATERAL = "collateral of validity differences reported by test_types_agree"
KNOWN_MESSAGE_DIFFERENCES: dict[str, str] = {
    "type:storage-width": "`u16f16`, `uf32`...: MLIR says 'expected storage type width', "
    "qconvert 'illegal storage type prefix'",
    "type:invalid-kind": "`complex<f32>` as expressed type: MLIR parses it, then 'invalid kind of type "
    "specified'; qconvert cannot parse complex types ('expected non-function type')",
    "type:lexer": "MLIR's lexer diagnostics are not reproduced: 'expected three consecutive dots for an "
    "ellipsis' (`.5`, `0.5.`), 'unexpected decimal integer literal for a floating point value' (`1e-3`, "
    "`2`), 'unexpected character' (`;`), 'integer value too large', 'hexadecimal float constant out of "
    "range for type', 'hexadecimal float literal should not have a leading minus'",
    "type:calibrated": "`complex<f32>` (see invalid-kind); negative hex and integer literals; f80 "
    f"({_COLLATERAL})",
    "type-location:expected-token": "MLIR reports a wrong-token error ('expected ...') right after the "
    "previous token (Parser::emitWrongTokenError skips back over whitespace); qconvert at the next token",
    "type-location:expected-element": "same rule as expected-token ('expected non-function type' after "
    "whitespace); and 'expected valid keyword' at the end of the input is reported at EOF by MLIR (2:1 "
    "after the final newline), at the start of the keyword by qconvert",
    "module:integer-or-quantized": "MLIR: \"'quant.scast' op failed to verify that input must be integer "
    "and result must be quantized, or vice versa\"; qconvert lacks 'failed to verify that '",
    "module:element-match": "MLIR emits these custom-verifier messages without the \"'quant.xcast' op \" "
    "prefix (emitError, not emitOpError); and MLIR reports one error per failing function, qconvert "
    f"only the first; and !quant.calibrated in casts ({_COLLATERAL})",
}


def message_class(outcome: Outcome, classes: tuple[tuple[str, str], ...]) -> str:
    message = outcome.messages[-1] if outcome.messages else ""
    return next(name for name, pattern in classes if re.search(pattern, message))


def known_difference(kind: str, name: str) -> list[pytest.MarkDecorator]:
    reason = KNOWN_MESSAGE_DIFFERENCES.get(f"{kind}:{name}")
    return [pytest.mark.xfail(reason=reason, strict=True)] if reason else []


def class_params(kind: str, classes: tuple[tuple[str, str], ...]) -> list[object]:
    return [pytest.param(name, id=name, marks=known_difference(kind, name)) for name, _ in classes]


# -------------------------------------------------------------------------------------------------------
# Running both sides (once per session)


@pytest.fixture(scope="module")
def oracle() -> MlirOracle:
    require_module("torch_mlir.ir")
    require_module("torch_mlir.passmanager")
    return MlirOracle("torch_mlir")


@cache
def _type_comparisons(oracle: MlirOracle) -> list[Comparison]:
    texts = [type_module(case.text) for case in TYPE_CASES]
    mlir = oracle.run([(text, None) for text in texts])
    return [
        Comparison(case.category, text, upstream, ours_parse(text), case.text)
        for case, text, upstream in zip(TYPE_CASES, texts, mlir)
    ]


@cache
def _module_comparisons(oracle: MlirOracle) -> list[Comparison]:
    mlir = oracle.run([(case.text, None) for case in MODULE_CASES])
    return [
        Comparison(case.category, case.text, upstream, ours_parse(case.text))
        for case, upstream in zip(MODULE_CASES, mlir)
    ]


@cache
def _pass_comparisons(oracle: MlirOracle, pass_name: str) -> list[Comparison]:
    """Our pass vs MLIR's on every module both accept. Inputs known to crash MLIR are not sent to it: their
    MLIR outcome is a `crashed` one saying so."""
    valid = [c for c in _module_comparisons(oracle) if c.verdict == "same-text"]
    reasons = [known_crash(c.text, pass_name) for c in valid]
    mlir = iter(oracle.run([(c.text, pass_name) for c, reason in zip(valid, reasons) if reason is None]))
    comparisons = []
    for comparison, reason in zip(valid, reasons):
        if reason is None:
            upstream = next(mlir)
        else:
            upstream = Outcome(
                ok=False, errors=((f"not run: upstream MLIR crashes ({reason})", None, None),), crashed=True
            )
        comparisons.append(
            Comparison(comparison.category, comparison.text, upstream, ours_pass(comparison.text, pass_name))
        )
    return comparisons


@pytest.fixture(scope="module")
def type_comparisons(oracle: MlirOracle) -> list[Comparison]:
    return _type_comparisons(oracle)


@pytest.fixture(scope="module")
def module_comparisons(oracle: MlirOracle) -> list[Comparison]:
    return _module_comparisons(oracle)


def assert_none(title: str, comparisons: list[Comparison], wrong: Callable[[Comparison], bool]) -> None:
    report = collect(title, comparisons, wrong)
    if report:
        pytest.fail(report.render(examples=2), pytrace=False)


# -------------------------------------------------------------------------------------------------------
# Types


def test_generated_inputs_cover_the_space() -> None:
    """The generators still produce what this file claims to test: thousands of cases, of every kind."""
    assert len(TYPE_CASES) >= 5000 and len(MODULE_CASES) >= 1000
    for expected in (
        "any",
        "calibrated",
        "quantile",
        "uniform/per-tensor",
        "uniform/per-axis",
        "uniform/sub-channel",
        "uniform/sub-channel/ragged",
        "uniform/scale",
        "syntax/truncate",
        "container/tensor",
        "container/vector",
    ):
        assert expected in TYPE_CATEGORIES, expected
    for expected in (
        "module/per-tensor",
        "module/per-axis",
        "module/sub-channel",
        "module/chain",
        "module/per-axis/bad",
        "module/sub-channel/bad",
    ):
        assert expected in MODULE_GROUPS, expected


@pytest.mark.parametrize("category", TYPE_CATEGORIES)
def test_types_agree(type_comparisons: list[Comparison], category: str) -> None:
    """MLIR accepts the type ⇔ qconvert does; accepted types print byte-identically."""
    cases = [c for c in type_comparisons if c.category == category and known_type_difference(c) is None]
    assert cases
    assert_none(f"types [{category}]", cases, lambda c: not c.agrees)


# Validity/printing classes where qconvert knowingly differs from MLIR today (checked to still differ below,
# so that a fix shows up): each is a predicate on the comparison and the reason.
KNOWN_TYPE_DIFFERENCES: dict[str, tuple[Callable[[Comparison], bool], str]] = {
    "sub-channel zero point printed as a bare colon": (
        lambda c: c.mlir.ok and re.search(r"\d:[,}]", c.mlir.text or "") is not None,
        "MLIR prints a sub-channel zero point whose low storage bits are 0 but whose stored bytes are not "
        "(e.g. u3 zero point 192) as `scale:` with no digits; qconvert stores the wrapped value, prints none",
    ),
    "sub-channel scales of a type without a numpy dtype": (
        lambda c: not c.ours.ok and "no numpy equivalent" in " ".join(c.ours.messages),
        "tf32/f80/f128 sub-channel scale tables need a numpy dtype; qconvert rejects them, MLIR accepts",
    ),
}


def known_type_difference(comparison: Comparison) -> str | None:
    return next(
        (name for name, (predicate, _) in KNOWN_TYPE_DIFFERENCES.items() if predicate(comparison)), None
    )


@pytest.mark.parametrize("name", sorted(KNOWN_TYPE_DIFFERENCES))
def test_known_type_differences_still_differ(type_comparisons: list[Comparison], name: str) -> None:
    """Each known difference is still real; when qconvert starts to agree, drop its entry."""
    cases = [c for c in type_comparisons if known_type_difference(c) == name]
    assert cases, f"no generated case shows '{name}' any more: drop it from KNOWN_TYPE_DIFFERENCES"
    assert all(not c.agrees for c in cases), KNOWN_TYPE_DIFFERENCES[name][1]


@pytest.mark.parametrize("message_kind", class_params("type", TYPE_MESSAGE_CLASSES))
def test_type_error_messages(type_comparisons: list[Comparison], message_kind: str) -> None:
    """Types both reject: the same error messages, in the same order."""
    cases = [
        c
        for c in type_comparisons
        if c.verdict == "both-reject" and message_class(c.mlir, TYPE_MESSAGE_CLASSES) == message_kind
    ]
    assert_none(f"type error messages [{message_kind}]", cases, lambda c: not c.messages_equal)


@pytest.mark.parametrize("message_kind", class_params("type-location", TYPE_MESSAGE_CLASSES))
def test_type_error_locations(type_comparisons: list[Comparison], message_kind: str) -> None:
    """Types both reject with the same messages: at the same line:column."""
    cases = [
        c
        for c in type_comparisons
        if c.verdict == "both-reject"
        and c.messages_equal
        and message_class(c.mlir, TYPE_MESSAGE_CLASSES) == message_kind
    ]
    assert_none(f"type error locations [{message_kind}]", cases, lambda c: not c.locations_equal)


def test_second_oracle_agrees(
    type_comparisons: list[Comparison], module_comparisons: list[Comparison]
) -> None:
    """IREE's MLIR (another build of upstream) says exactly what torch-mlir's says: the oracle is not a fluke.

    If this fails, upstream behaviour depends on the MLIR version here; decide which one qconvert targets.
    """
    require_module("iree.compiler.ir")
    comparisons = type_comparisons[::3] + module_comparisons[::3]
    iree = MlirOracle("iree.compiler").run([(c.text, None) for c in comparisons])
    second = [Comparison(c.category, c.text, c.mlir, other) for c, other in zip(comparisons, iree)]
    assert_none("torch-mlir (as MLIR) vs IREE (as qconvert)", second, lambda c: c.mlir != c.ours)


# -------------------------------------------------------------------------------------------------------
# Modules


@pytest.mark.parametrize("group", MODULE_GROUPS)
def test_modules_agree(module_comparisons: list[Comparison], group: str) -> None:
    """MLIR accepts the module (parse + verify) ⇔ qconvert does; accepted modules print byte-identically."""
    cases = [c for c in module_comparisons if module_group(c.category) == group]
    assert cases
    assert_none(f"modules [{group}]", cases, lambda c: not c.agrees)


@pytest.mark.parametrize("message_kind", class_params("module", MODULE_MESSAGE_CLASSES))
def test_module_error_messages(module_comparisons: list[Comparison], message_kind: str) -> None:
    """Modules both reject: the same error messages (one per failing function in MLIR), in the same order."""
    cases = [
        c
        for c in module_comparisons
        if c.verdict == "both-reject" and message_class(c.mlir, MODULE_MESSAGE_CLASSES) == message_kind
    ]
    assert_none(f"module error messages [{message_kind}]", cases, lambda c: not c.messages_equal)


@pytest.mark.parametrize("message_kind", class_params("module-location", MODULE_MESSAGE_CLASSES))
def test_module_error_locations(module_comparisons: list[Comparison], message_kind: str) -> None:
    cases = [
        c
        for c in module_comparisons
        if c.verdict == "both-reject"
        and c.messages_equal
        and message_class(c.mlir, MODULE_MESSAGE_CLASSES) == message_kind
    ]
    assert_none(f"module error locations [{message_kind}]", cases, lambda c: not c.locations_equal)


# -------------------------------------------------------------------------------------------------------
# Passes


def require_pass(pass_name: str) -> None:
    why = pass_unavailable(pass_name)
    if why is not None:
        pytest.skip(f"qconvert has no '{pass_name}' pass yet ({why})")


@pytest.mark.parametrize("group", [g for g in MODULE_GROUPS if not g.endswith("/bad")])
@pytest.mark.parametrize("pass_name", PASSES)
def test_pass_output(oracle: MlirOracle, pass_name: str, group: str) -> None:
    """Where MLIR's pass output verifies, ours is byte-identical (and we do not reject what MLIR accepts)."""
    require_pass(pass_name)
    cases = [c for c in _pass_comparisons(oracle, pass_name) if module_group(c.category) == group]
    if pass_name == "normalize-quant-types":  # where upstream's output is invalid IR, ours differs by design
        cases = [c for c in cases if not upstream_normalizes_to_invalid(c.text)]
    assert_none(f"{pass_name} [{group}]", cases, lambda c: c.mlir.ok and not c.agrees)


def upstream_normalizes_to_invalid(text: str) -> bool:
    """Whether a value or signature of the module has a type that upstream's normalize-quant-types makes
    invalid (issue 23; our output for those is checked in tests/unit/test_opt_normalize_blocks.py)."""
    from qconvert.ir import ParserOptions, parse_module
    from qconvert.ir.dialects.func import FuncOp
    from qconvert.passes.normalize_quant_types import upstream_writes_invalid

    module = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    for op in module.walk():
        types = [value.type for value in op.results]
        types += [a.type for region in op.regions for block in region.blocks for a in block.arguments]
        if isinstance(op, FuncOp):
            types += [*op.function_type.inputs, *op.function_type.results]
        if any(upstream_writes_invalid(getattr(type_, "element_type", None)) for type_ in types):
            return True
    return False


@pytest.mark.parametrize("pass_name", PASSES)
def test_pass_never_crashes(oracle: MlirOracle, pass_name: str) -> None:
    """On every module both accept (even where upstream crashes), our pass succeeds or reports an error."""
    require_pass(pass_name)
    assert_none(
        f"{pass_name}: qconvert raised", _pass_comparisons(oracle, pass_name), lambda c: c.ours.crashed
    )


def test_pass_coverage(oracle: MlirOracle) -> None:
    """Enough modules actually reach the byte-for-byte comparison of each pass."""
    for pass_name in PASSES:
        require_pass(pass_name)
        assert sum(c.mlir.ok for c in _pass_comparisons(oracle, pass_name)) >= 300, pass_name


KNOWN_CRASH_EXAMPLES = {
    "sub-channel type with float storage": (None, type_module("!quant.uniform<f8E5M2:f32:{0:2}, {{1.0}}>")),
    "quant cast of !quant.any or !quant.calibrated": (
        "lower-quant-ops",
        "func.func @f(%arg0: !quant.any<i8:f32>) -> f32 {\n"
        "  %0 = quant.dcast %arg0 : !quant.any<i8:f32> to f32\n  return %0 : f32\n}\n",
    ),
    "si/ui/float storage with explicit bounds": (
        "lower-quant-ops",
        "func.func @f(%arg0: tensor<2xf32>) -> tensor<2x!quant.uniform<si8<-126:126>:f32, 0.5>> {\n"
        "  %0 = quant.qcast %arg0 : tensor<2xf32> to tensor<2x!quant.uniform<si8<-126:126>:f32, 0.5>>\n"
        "  return %0 : tensor<2x!quant.uniform<si8<-126:126>:f32, 0.5>>\n}\n",
    ),
    "!quant.calibrated in a signature": (
        "strip-func-quant-types",
        "func.func private @d(tensor<2x!quant.calibrated<f32<-1.0:1.0>>>)\n",
    ),
}


@pytest.mark.parametrize("reason", sorted(KNOWN_CRASH_EXAMPLES))
def test_known_upstream_crashes(oracle: MlirOracle, reason: str) -> None:
    """Each input class kept away from upstream MLIR still crashes it (else drop it from KNOWN_CRASHES)."""
    stage, text = KNOWN_CRASH_EXAMPLES[reason]
    assert reason in KNOWN_CRASHES[stage]
    assert known_crash(text, stage) == reason
    (outcome,) = oracle.run([(text, stage)])
    assert outcome.crashed, f"upstream MLIR no longer crashes on {reason!r}:\n{outcome.describe()}"

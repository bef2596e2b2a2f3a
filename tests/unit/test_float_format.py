"""Check qconvert.ir.float_format against observed upstream output and, when available, against real MLIR.

Sources of truth, in order:
1. the observed table in the shared conformance notes (iree-opt output);
2. the examples in NOTES.md §1.4;
3. a live differential against upstream MLIR's Python bindings (torch-mlir,
   else jaxlib). MLIR prints every value we generate, and our text must be
   the same, byte for byte.

Engine tests skip where no binding imports (they fail instead under
QCONVERT_REQUIRE_ENGINES=1, see tests/conftest.py).
"""

from __future__ import annotations

import math
import os
import random
import re
import struct
from pathlib import Path
from types import ModuleType

import pytest
from conftest import require_module
from hypothesis import given, settings
from hypothesis import strategies as st

from qconvert.ir.float_format import (
    FLOAT_TYPES,
    bits_to_float,
    float_to_bits,
    float_type_width,
    format_diagnostic_float,
    format_float,
    format_float_bits,
    round_to_float_type,
)

_CONFORMANCE = Path(os.environ.get("QCONVERT_CONFORMANCE_DIR", "/work/shared/conformance"))
_TSV = _CONFORMANCE / "float-printing.tsv"
_TSV_TYPES = {
    "per-tensor scale (f64)": "f64",
    "sub-channel scale (f32)": "f32",
    "sub-channel scale (f16)": "f16",
    "sub-channel scale (bf16)": "bf16",
}
_F32_SCALE_RANGE = "[1.401298e-45, 3.402823e+38]"


def _f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


# --------------------------------------------------------------------------
# Observed output.


def test_format_float_observed_table_matches_iree_opt() -> None:
    """Every row of float-printing.tsv (iree-opt output) is reproduced."""
    if not _TSV.exists():
        pytest.skip(f"{_TSV} not found (set QCONVERT_CONFORMANCE_DIR)")
    rows = 0
    mismatches = []
    for line in _TSV.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        kind, literal, printed = line.split("\t")
        float_type = _TSV_TYPES[kind]
        got = format_float(round_to_float_type(float(literal), float_type), float_type)
        rows += 1
        if got != printed:
            mismatches.append((kind, literal, printed, got))
    assert rows > 10000
    assert mismatches == []


@pytest.mark.parametrize(
    ("value", "float_type", "expected"),
    [
        (2.0, "f64", "2.000000e+00"),
        (0.99872, "f64", "9.987200e-01"),
        (0.998, "f64", "0.998"),
        (-0.998, "f64", "-0.998"),
        (0.95, "f64", "0.94999999999999996"),
        (0.99, "f64", "0.98999999999999999"),
        (0.1234567, "f64", "0.1234567"),
        (0.015680249780416489, "f64", "0.015680249780416489"),
        (1.5350925350904778e-5, "f64", "1.5350925350904778E-5"),
        (1e-40, "f64", "9.9999999999999992E-41"),
        (0.015680249780416489, "f32", "0.0156802498"),
        (10704349.0, "f64", "0x41646ABBA0000000"),
        (12345678.0, "f64", "0x41678C29C0000000"),
        (-12345678.0, "f64", "0xC1678C29C0000000"),
        (12345678.0, "f32", "0x4B3C614E"),
        (0.3, "f64", "3.000000e-01"),
        (0.3, "f16", "3.000490e-01"),
        (0.8, "f64", "8.000000e-01"),
        (0.9999, "f64", "9.999000e-01"),
        (0.0078125, "f64", "7.812500e-03"),
        (100.5, "f64", "1.005000e+02"),
        (1.0e10, "f64", "1.000000e+10"),
        (0.996, "f64", "0.99599999999999999"),
        (1234567.0, "f64", "0x4132D68700000000"),
        # Observed with torch-mlir while writing this module.
        (123456789012345678.0, "f64", "1.2345678901234568E+17"),
        (5.9604644775390625e-08, "f16", "5.960460e-08"),  # truncation leaves exactly 6 digits
        (4.9406564584124654e-324, "f64", "4.940660e-324"),  # subnormal: 6 digits round-trip
        (3.0, "f4E2M1FN", "3.000000e+00"),
        (-0.75, "f8E8M0FNU", "-1.000000e+00"),  # APFloat keeps the sign the format lacks
        (-1.0e-60, "f8E8M0FNU", "5.877470e-39"),  # no zero: the smallest value, unsigned
    ],
)
def test_format_float_notes_examples_match(value: float, float_type: str, expected: str) -> None:
    """NOTES.md §1.4 examples (values are rounded to the type first, as the parser does)."""
    assert format_float(round_to_float_type(value, float_type), float_type) == expected


@pytest.mark.parametrize(
    ("value", "float_type", "expected"),
    [
        (0.0, "f64", "0.000000e+00"),
        (-0.0, "f64", "-0.000000e+00"),
        (-0.0, "f32", "-0.000000e+00"),
        (-0.0, "f8E4M3FNUZ", "0.000000e+00"),  # no negative zero: 0x80 is NaN
        (math.inf, "f64", "0x7FF0000000000000"),
        (-math.inf, "f64", "0xFFF0000000000000"),
        (math.nan, "f64", "0x7FF8000000000000"),
        (math.inf, "f32", "0x7F800000"),
        (math.nan, "f32", "0x7FC00000"),
        (math.inf, "f16", "0x7C00"),
        (math.nan, "bf16", "0x7FC0"),
        (math.nan, "tf32", "0x3FE00"),
        (math.nan, "f8E4M3FN", "0x7F"),
        (math.nan, "f8E4M3FNUZ", "0x80"),
        (math.nan, "f8E8M0FNU", "0xFF"),
        (math.inf, "f80", "0x7FFF8000000000000000"),
        (math.nan, "f128", "0x7FFF8000000000000000000000000000"),
    ],
)
def test_format_float_specials_print_as_zero_or_bits(value: float, float_type: str, expected: str) -> None:
    """Zeros print in the 6-digit form; inf and NaN print as their bit pattern."""
    assert format_float(value, float_type) == expected


def test_format_float_bits_keeps_nan_payload_and_sign_of_zero() -> None:
    assert format_float_bits(0x7FF0000000000001, "f64") == "0x7FF0000000000001"
    assert format_float_bits(0xFFC00001, "f32") == "0xFFC00001"
    assert format_float_bits(0x8000, "f16") == "-0.000000e+00"
    assert format_float_bits(0x3C00, "f16") == "1.000000e+00"
    # An x87 unnormal is a NaN to APFloat, which writes it back with the all-ones exponent.
    assert format_float_bits(0x3FFF0000000000000001, "f80") == "0x7FFF0000000000000001"


def test_bits_to_float_and_float_to_bits_are_inverse_on_small_formats() -> None:
    """Every non-NaN pattern of the formats up to 16 bits survives a round trip."""
    for float_type in FLOAT_TYPES:
        width = float_type_width(float_type)
        if width > 16:
            continue
        for bits in range(1 << width):
            value = bits_to_float(bits, float_type)
            if not math.isnan(value):
                assert float_to_bits(value, float_type) == bits, (float_type, hex(bits))


def test_round_to_float_type_matches_numpy_and_ml_dtypes() -> None:
    """Ties-to-even conversion from double agrees with numpy (f16, f32) and ml_dtypes (the rest)."""
    np = require_module("numpy")
    ml_dtypes = require_module("ml_dtypes")
    dtypes = {
        "f32": np.float32,
        "f16": np.float16,
        "bf16": ml_dtypes.bfloat16,
        "f8E5M2": ml_dtypes.float8_e5m2,
        "f8E4M3FN": ml_dtypes.float8_e4m3fn,
        "f8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
        "f8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    }
    rng = random.Random(7)
    for float_type, dtype in dtypes.items():
        top = float(ml_dtypes.finfo(dtype).max)
        values = [rng.uniform(-1.1 * top, 1.1 * top) * 2.0 ** -rng.randint(0, 30) for _ in range(2000)]
        with np.errstate(over="ignore"):
            expected = np.array(values, dtype=np.float64).astype(dtype).astype(np.float64)
        for value, want in zip(values, expected.tolist()):
            got = round_to_float_type(value, float_type)
            assert got == want or (math.isnan(got) and math.isnan(want)), (float_type, value, got, want)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_format_float_f64_output_parses_back_to_same_bits(value: float) -> None:
    """Whatever form is chosen, reading it back gives the same f64 bits."""
    text = format_float(value)
    if text.startswith("0x"):
        assert int(text, 16) == _f64_bits(value)
    else:
        assert "." in text
        assert _f64_bits(float(text)) == _f64_bits(value)


def test_format_float_unknown_type_raises() -> None:
    with pytest.raises(ValueError, match="unsupported float type 'f42'"):
        format_float(1.0, "f42")


# --------------------------------------------------------------------------
# Diagnostics.


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5.960464477539063e-08, "5.960464e-08"),
        (1.0, "1.000000e+00"),
        (-1.0, "-1.000000e+00"),
        (1.401298464324817e-45, "1.401298e-45"),
        (3.4028234663852886e38, "3.402823e+38"),
        (1e100, "1.000000e+100"),
        (-0.0, "-0.000000e+00"),
        (math.inf, "INF"),
        (-math.inf, "-INF"),
        (math.nan, "nan"),
        (-math.nan, "nan"),
    ],
)
def test_format_diagnostic_float_is_write_double(value: float, expected: str) -> None:
    """llvm::write_double: C %e, but nan, INF and -INF for the non-finite values."""
    assert format_diagnostic_float(value) == expected


# --------------------------------------------------------------------------
# Differential against upstream MLIR.


def _mlir_ir() -> tuple[str, ModuleType]:
    """(engine name, its ``ir`` module): torch-mlir, else jaxlib; skips (or fails in CI) if neither."""
    for engine, name in (("torch_mlir", "torch_mlir.ir"), ("jaxlib", "jax._src.lib.mlir.ir")):
        try:
            return engine, __import__(name, fromlist=["ir"])
        except ImportError:
            continue
    return "torch_mlir", require_module("torch_mlir.ir")


def _parse_print(ir: ModuleType, text: str) -> str:
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    with ctx:
        return str(ir.Module.parse(text))


def _print_attrs(ir: ModuleType, literals: list[tuple[str, str]]) -> list[str]:
    """What MLIR prints for `{v = LITERAL : TYPE}`, one op per literal."""
    text = "\n".join(f'"test.op"() {{v = {lit} : {t}}} : () -> ()' for lit, t in literals)
    printed = re.findall(r"\{v = (.*) : (\S+)\}", _parse_print(ir, text))
    assert [t for _, t in printed] == [t for _, t in literals]
    return [p for p, _ in printed]


def _differential_patterns() -> list[tuple[int, str]]:
    """About 9,000 bit patterns, chosen where the printer's three steps meet."""
    rng = random.Random(20240531)
    out: list[tuple[int, str]] = []

    def add64(x: float) -> None:
        out.append((_f64_bits(x), "f64"))

    for _ in range(1500):  # random f64 of sensible magnitude, both signs
        out.append(((rng.getrandbits(1) << 63) | (rng.randint(850, 1150) << 52) | rng.getrandbits(52), "f64"))
    for _ in range(500):  # short decimals, their neighbours, and the same in f32/f16/bf16
        x = float(f"{rng.randint(1, 10 ** rng.randint(1, 8))}e{rng.randint(-20, 10)}")
        add64(x)
        add64(math.nextafter(x, 0.0))
        add64(math.nextafter(x, math.inf))
        for float_type in ("f32", "f16", "bf16"):
            y = round_to_float_type(x, float_type)
            if math.isfinite(y) and y != 0.0:
                bits = float_to_bits(y, float_type)
                out += [(bits, float_type), (bits - 1, float_type), (bits + 1, float_type)]
    for lit in ("0.998", "0.95", "0.99", "0.1234567", "0.3", "0.996", "1e-40", "0.015680249780416489"):
        add64(float(lit))
        add64(math.nextafter(float(lit), 0.0))
    for n in (10704349, 12345678, 1234567, 123456789012345678, 2**53 + 2, 10**22, 10**23):
        add64(float(n))
        add64(-float(n))
        out.append((float_to_bits(round_to_float_type(float(n), "f32"), "f32"), "f32"))
    for k in range(-1074, 1024, 7):  # powers of two, subnormals included
        add64(math.ldexp(1.0, k))
    for _ in range(300):  # f64 subnormals
        out.append((rng.getrandbits(52), "f64"))
    for _ in range(800):
        out.append((rng.getrandbits(32), "f32"))
        out.append((rng.getrandbits(16), "f16"))
        out.append((rng.getrandbits(16), "bf16"))
        out.append((rng.getrandbits(19), "tf32"))
    for _ in range(150):  # wide formats, including x87 unnormals
        out.append((rng.getrandbits(80), "f80"))
        out.append((rng.getrandbits(128), "f128"))
        out.append((float_to_bits(float(rng.randint(1, 10**20)), "f80"), "f80"))
        out.append((float_to_bits(rng.random(), "f128"), "f128"))
    for float_type in FLOAT_TYPES:  # every pattern of the 8-bit and smaller formats
        width = float_type_width(float_type)
        if width <= 8:
            out += [(bits, float_type) for bits in range(1 << width)]
    return out


def test_format_float_bits_matches_mlir_attribute_printer() -> None:
    """format_float_bits agrees with MLIR's printer on ~9,000 exact (hex) inputs."""
    _, ir = _mlir_ir()
    patterns = _differential_patterns()
    assert len(patterns) > 8000
    printed = _print_attrs(ir, [(f"0x{bits:X}", t) for bits, t in patterns])
    mismatches = [
        (t, hex(bits), want, format_float_bits(bits, t))
        for (bits, t), want in zip(patterns, printed)
        if format_float_bits(bits, t) != want
    ]
    assert mismatches == []


def test_round_to_float_type_matches_mlir_decimal_literals() -> None:
    """round_to_float_type + format_float agree with MLIR parsing and printing decimal literals."""
    _, ir = _mlir_ir()
    rng = random.Random(99)
    literals: list[tuple[str, str]] = []
    for float_type in FLOAT_TYPES:
        width = float_type_width(float_type)
        if width <= 16:
            values = (bits_to_float(bits, float_type) for bits in range(1 << width))
            top = max(abs(v) for v in values if math.isfinite(v))
        else:
            top = 3.0e38 if float_type in ("f32", "tf32") else 1.0e300
        for _ in range(150):
            x = rng.uniform(-1.2 * top, 1.2 * top) * 2.0 ** -rng.randint(0, 24)
            literals.append(("%.17e" % x, float_type))  # MLIR float literals need a '.'
    printed = _print_attrs(ir, literals)
    mismatches = [
        (t, lit, want, format_float(round_to_float_type(float(lit), t), t))
        for (lit, t), want in zip(literals, printed)
        if format_float(round_to_float_type(float(lit), t), t) != want
    ]
    assert mismatches == []


def test_format_float_matches_mlir_quant_scales() -> None:
    """Per-tensor and per-axis scales print as f64; sub-channel scales in the expressed type."""
    ir = require_module("torch_mlir.ir")  # jaxlib's Python context does not register `quant`
    rng = random.Random(5)
    scales = [rng.uniform(1e-6, 1.0) * 10.0 ** -rng.randint(0, 6) for _ in range(400)]
    scales += [float(f"0.{rng.randint(1, 9999)}") for _ in range(100)]
    scales += [10704349.0, 12345678.0, 0.998, 0.95, 1e-40]
    lines = []
    expected = []
    for i, scale in enumerate(scales):
        hex64 = f"0x{_f64_bits(scale):X}"
        if i % 2:
            lines.append(f"func.func private @f{i}() -> tensor<2x!quant.uniform<i8:f32, {hex64}:3>>")
            expected.append(f"!quant.uniform<i8:f32, {format_float(scale)}:3>")
        elif i % 4 == 0:
            lines.append(
                f"func.func private @f{i}() -> tensor<2x!quant.uniform<i8:f32:0, {{{hex64}, {hex64}:1}}>>"
            )
            text = format_float(scale)
            expected.append(f"!quant.uniform<i8:f32:0, {{{text},{text}:1}}>")
        else:
            # Sub-channel scales are parsed as doubles, then stored as f32.
            lines.append(
                f"func.func private @f{i}() -> tensor<2x!quant.uniform<i8:f32:{{0:1}}, {{{scale!r}}}>>"
            )
            scale32 = format_float(round_to_float_type(scale, "f32"), "f32")
            expected.append(f"!quant.uniform<i8:f32:{{0:1}}, {{{scale32}}}>")
    printed = re.findall(r"tensor<2x(!quant\.uniform<.*>)>$", _parse_print(ir, "\n".join(lines)), flags=re.M)
    assert len(printed) == len(expected)
    assert [(p, e) for p, e in zip(printed, expected) if p != e] == []


@pytest.mark.parametrize("scale", [-1.0, -5.960464477539063e-08, 3.5e38, math.inf, -math.inf, 1e-46])
def test_format_diagnostic_float_matches_mlir_scale_range_error(scale: float) -> None:
    """Numbers in MLIR diagnostics (here: scale out of range) match format_diagnostic_float."""
    ir = require_module("torch_mlir.ir")
    text = f"func.func private @f() -> tensor<2x!quant.uniform<i8:f32, 0x{_f64_bits(scale):X}>>"
    message = f"scale {format_diagnostic_float(scale)} out of expressed type range {_F32_SCALE_RANGE}"
    with pytest.raises(Exception, match=re.escape(message)):
        _parse_print(ir, text)

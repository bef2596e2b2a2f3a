"""Print floats exactly as upstream MLIR's AsmPrinter does; round doubles to a float type as its parser does.

MLIR prints a float attribute, and every float the quant printer emits
(scales, calibrated min/max), with ``printFloatValue`` in
``mlir/lib/IR/AsmPrinter.cpp``:

1. ``APFloat::toString(str, /*FormatPrecision=*/6, /*FormatMaxPadding=*/0,
   /*TruncateZero=*/false)`` gives ``d.dddddde±XX``. It is used only if
   parsing it back *directly into the value's own format* (correct rounding,
   ties to even) gives the same bits.
2. Otherwise ``APFloat::toString(str)`` is used if it contains a ``.``. Its
   defaults are FormatPrecision 0, meaning the format's natural precision
   ``2 + precision*59/196`` (17 for f64, 9 for f32, 5 for f16, 4 for bf16),
   FormatMaxPadding 3 and TruncateZero true.
3. Otherwise, and always for inf and NaN, the bit pattern is printed with
   ``APInt::toString(radix 16, formatAsCLiteral)``: ``0x`` and upper-case hex
   digits, without leading zeros.

``APFloat::toString`` builds its digits in two steps, and this module
reproduces both with integer arithmetic. First it divides the exact decimal
significand by a power of ten chosen from its *bit* length. That division
truncates, and it can leave exactly FormatPrecision digits, so no rounding
happens at all. Then it rounds the remaining digits half-up on the first
dropped digit. That is why 0.998 (binary 0.99799999...) gives
``9.979990e-01`` in step 1 and then fails the round trip.

Diagnostics print doubles differently: ``raw_ostream << double`` is
``llvm::write_double`` with C's ``%e`` (see :func:`format_diagnostic_float`).
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

__all__ = [
    "FLOAT_TYPES",
    "bits_to_float",
    "float_to_bits",
    "float_type_width",
    "format_diagnostic_float",
    "format_float",
    "format_float_bits",
    "round_to_float_type",
]


class _Format(NamedTuple):
    """One float format, described with LLVM's ``fltSemantics`` numbers."""

    name: str
    width: int  # storage bits
    man_bits: int  # precision - 1 (for x87 the integer bit is stored too)
    bias: int
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number
    max_sig: int  # its significand, integer bit included
    kind: str  # "ieee", "x87", "nan_allones", "nan_negzero", "finite" or "e8m0"
    digits: int  # natural FormatPrecision: 2 + precision * 59 // 196
    nan_bits: int  # canonical quiet positive NaN; -1 if the format has none


def _make(name: str, width: int, exp_bits: int, man_bits: int, bias: int, kind: str) -> _Format:
    exp_all_ones = (1 << exp_bits) - 1
    all_ones_sig = (2 << man_bits) - 1
    emax, max_sig = exp_all_ones - bias, all_ones_sig  # NaN-only and finite-only formats
    emin = 1 - bias
    if kind in ("ieee", "x87"):
        emax -= 1  # the all-ones exponent is inf/NaN
        nan_bits = (exp_all_ones << man_bits) | (1 << (man_bits - 1))
        if kind == "x87":
            nan_bits = (exp_all_ones << 64) | (3 << 62)
    elif kind == "nan_allones":
        # The all-ones exponent is a normal binade except for the all-ones
        # significand, which is NaN.
        max_sig -= 1
        nan_bits = (exp_all_ones << man_bits) | ((1 << man_bits) - 1)
    elif kind == "nan_negzero":
        nan_bits = 1 << (width - 1)
    elif kind == "finite":
        nan_bits = -1
    else:  # e8m0: no sign, no significand, no zero; 0xFF is NaN.
        emax, emin, nan_bits = exp_all_ones - 1 - bias, -bias, exp_all_ones
    precision = man_bits + 1
    return _Format(
        name, width, man_bits, bias, emin, emax, max_sig, kind, 2 + precision * 59 // 196, nan_bits
    )


# Parameters from llvm/lib/Support/APFloat.cpp (fltSemantics); MLIR's names.
_FORMATS: dict[str, _Format] = {
    f.name: f
    for f in (
        _make("f64", 64, 11, 52, 1023, "ieee"),
        _make("f32", 32, 8, 23, 127, "ieee"),
        _make("f16", 16, 5, 10, 15, "ieee"),
        _make("bf16", 16, 8, 7, 127, "ieee"),
        _make("tf32", 19, 8, 10, 127, "ieee"),
        _make("f80", 80, 15, 63, 16383, "x87"),
        _make("f128", 128, 15, 112, 16383, "ieee"),
        _make("f8E5M2", 8, 5, 2, 15, "ieee"),
        _make("f8E4M3", 8, 4, 3, 7, "ieee"),
        _make("f8E3M4", 8, 3, 4, 3, "ieee"),
        _make("f8E4M3FN", 8, 4, 3, 7, "nan_allones"),
        _make("f8E4M3FNUZ", 8, 4, 3, 8, "nan_negzero"),
        _make("f8E5M2FNUZ", 8, 5, 2, 16, "nan_negzero"),
        _make("f8E4M3B11FNUZ", 8, 4, 3, 11, "nan_negzero"),
        _make("f8E8M0FNU", 8, 8, 0, 127, "e8m0"),
        _make("f6E2M3FN", 6, 2, 3, 1, "finite"),
        _make("f6E3M2FN", 6, 3, 2, 3, "finite"),
        _make("f4E2M1FN", 4, 2, 1, 1, "finite"),
    )
}

FLOAT_TYPES: tuple[str, ...] = tuple(_FORMATS)
"""The MLIR float type names this module supports."""

# [2**emin, 2**(emax+1)) per format that a double can cover.
_NORMAL_RANGE: dict[str, tuple[float, float]] = {
    f.name: (math.ldexp(1.0, f.emin), math.ldexp(1.0, f.emax + 1)) for f in _FORMATS.values() if f.emax < 1023
}

_F64 = _FORMATS["f64"]
_F32 = _FORMATS["f32"]
_WIDE = (_F64, _FORMATS["f80"], _FORMATS["f128"])  # every double is exact in these
_STEP1_PRECISION = 6  # printFloatValue's FormatPrecision for the first try
_MAX_PADDING = 3  # APFloat::toString's default FormatMaxPadding
_F64_MIN_NORMAL = 2.2250738585072014e-308

_pack_d = struct.Struct("<d").pack
_unpack_d = struct.Struct("<d").unpack
_pack_q = struct.Struct("<Q").pack
_unpack_q = struct.Struct("<Q").unpack
_pack_f = struct.Struct("<f").pack
_unpack_f = struct.Struct("<f").unpack
_pack_i = struct.Struct("<I").pack
_unpack_i = struct.Struct("<I").unpack


def _fmt(float_type: str) -> _Format:
    f = _FORMATS.get(float_type)
    if f is None:
        raise ValueError(f"unsupported float type {float_type!r}")
    return f


def float_type_width(float_type: str) -> int:
    """Storage width in bits of ``float_type`` (64 for f64, 19 for tf32, 4 for f4E2M1FN)."""
    return _fmt(float_type).width


# --------------------------------------------------------------------------
# Powers, kept as constant tables: APFloat::toString multiplies by 5**t and
# divides by 10**r, and pow() on every call would dominate the cost.

_TABLE_SIZE = 1074 + 53  # every f64 needs t <= 1074
_POW5: tuple[int, ...] = tuple(5**i for i in range(_TABLE_SIZE))
_POW10: tuple[int, ...] = tuple(10**i for i in range(_TABLE_SIZE))


def _pow5(n: int) -> int:
    return _POW5[n] if n < _TABLE_SIZE else 5**n


def _pow10(n: int) -> int:
    return _POW10[n] if n < _TABLE_SIZE else 10**n


# --------------------------------------------------------------------------
# Rounding: the parser's double -> format conversion, and APFloat's exact
# decimal parse used by printFloatValue's round-trip check.


def _round_exact(num: int, den: int, f: _Format) -> tuple[int, int] | None:
    """Round the positive rational num/den to ``f`` with ties to even.

    Returns (m, q) with the result m * 2**q, or None when the result overflows
    to inf (IEEE formats) or NaN (NaN-only formats), as APFloat's
    handleOverflow does for round-to-nearest. Finite-only formats saturate
    to the largest value; E8M0, which has no zero, goes to its smallest value.
    """
    e = num.bit_length() - den.bit_length()  # floor(log2(num/den)), or one more
    if (num < den << e) if e >= 0 else (num << -e < den):
        e -= 1
    q = max(e, f.emin) - f.man_bits  # weight of the last significand bit
    if q >= 0:
        d = den << q
        m, r = divmod(num, d)
    else:
        d = den
        m, r = divmod(num << -q, den)
    r <<= 1
    if r > d or (r == d and m & 1):
        m += 1
    if m == 0 and f.kind == "e8m0":
        return 1, f.emin  # no zero: the smallest value instead
    shift = q - (f.emax - f.man_bits)  # compare m * 2**q with the largest finite value
    if ((m << shift) if shift >= 0 else m) > (f.max_sig if shift >= 0 else f.max_sig << -shift):
        if f.kind == "finite":
            return f.max_sig, f.emax - f.man_bits
        return None
    return m, q


def round_to_float_type(value: float, float_type: str) -> float:
    """Round a double to ``float_type`` as MLIR's parser does.

    MLIR parses a decimal float literal to a double first, then converts it
    with ``APFloat::convert(rmNearestTiesToEven)``. This function is that
    conversion, and returns the exact value of the format as a Python float.
    f64, f80 and f128 hold every double, so they return ``value`` unchanged.
    Overflow gives inf (IEEE formats), NaN (NaN-only formats) or the largest
    finite value with the input's sign (finite-only formats). Formats
    without negative zero give +0.0 for -0.0. NaN stays NaN. f8E8M0FNU has
    no zero and no sign bit, yet APFloat keeps the sign of a negative input
    (MLIR prints ``-0.5 : f8E8M0FNU`` back as ``-5.000000e-01``); so does
    this function, except where the value would round to zero, which gives
    the smallest value, positive.
    """
    f = _fmt(float_type)
    if f in _WIDE:
        return value
    if f is _F32:
        try:
            return _unpack_f(_pack_f(value))[0]  # a C double->float cast: ties to even
        except OverflowError:
            return math.copysign(math.inf, value)
    if value != value:
        return value
    negative = math.copysign(1.0, value) < 0
    if f.kind == "e8m0" and abs(value) <= math.ldexp(1.0, f.emin - 1):
        # No zero: what would round to zero becomes the smallest value, unsigned.
        return math.ldexp(1.0, f.emin)
    if value in (math.inf, -math.inf):
        if f.kind == "ieee":
            return value
        result = math.ldexp(f.max_sig, f.emax - f.man_bits) if f.kind == "finite" else math.nan
    elif value == 0.0:
        result = 0.0
    else:
        num, den = abs(value).as_integer_ratio()
        rounded = _round_exact(num, den, f)
        if rounded is None:
            result = math.inf if f.kind == "ieee" else math.nan
        else:
            result = math.ldexp(*rounded)
    if negative and not (f.kind == "nan_negzero" and result == 0.0):
        result = -result
    return result


# --------------------------------------------------------------------------
# Bit patterns.


def _exponent_field_shift(f: _Format) -> int:
    return 64 if f.kind == "x87" else f.man_bits


def float_to_bits(value: float, float_type: str) -> int:
    """Return the bit pattern of ``value`` in ``float_type``.

    ``value`` must be representable in the format (see
    :func:`round_to_float_type`). NaN maps to the format's quiet NaN with the
    value's sign: f64 keeps the payload, f32 keeps what a C double->float
    cast keeps, and formats whose only NaN is unsigned ignore the sign.
    """
    f = _fmt(float_type)
    if f is _F64:
        return _unpack_q(_pack_d(value))[0]
    if f is _F32:
        return _unpack_i(_pack_f(value))[0]
    sign_bit = 1 << (f.width - 1)
    negative = math.copysign(1.0, value) < 0
    sign = sign_bit if negative and f.kind != "e8m0" else 0
    if value != value:
        if f.nan_bits < 0:
            raise ValueError(f"{float_type} has no NaN")
        return f.nan_bits if f.kind in ("nan_negzero", "e8m0") else sign | f.nan_bits
    field_shift = _exponent_field_shift(f)
    if value in (math.inf, -math.inf):
        if f.kind not in ("ieee", "x87"):
            raise ValueError(f"{float_type} has no infinity")
        inf_bits = ((sign_bit - 1) >> field_shift) << field_shift
        return sign | inf_bits | (1 << 63 if f.kind == "x87" else 0)
    if value == 0.0:
        if f.kind == "e8m0":
            raise ValueError("f8E8M0FNU has no zero")
        return 0 if f.kind == "nan_negzero" else sign
    mag = abs(value)
    e = math.frexp(mag)[1] - 1
    if e < f.emin:  # subnormal: exponent field 0
        return sign | int(math.ldexp(mag, f.man_bits - f.emin))
    significand = int(math.ldexp(mag, f.man_bits - e))
    if f.kind != "x87":
        significand -= 1 << f.man_bits  # the integer bit is implicit
    return sign | ((e + f.bias) << field_shift) | significand


def _decode(bits: int, f: _Format) -> tuple[str, bool, int, int]:
    """(category, negative, num, exp2) of a bit pattern; finite values are num * 2**exp2.

    category is "nan", "inf", "zero" or "finite", as APFloat classifies the
    pattern (x87 pseudo-NaNs and unnormals count as NaN).
    """
    if f.kind == "e8m0":
        return ("nan", False, 0, 0) if bits == f.nan_bits else ("finite", False, 1, bits - f.bias)
    sign_bit = 1 << (f.width - 1)
    negative = bool(bits & sign_bit)
    field_shift = _exponent_field_shift(f)
    field = (bits & (sign_bit - 1)) >> field_shift
    man = bits & ((1 << field_shift) - 1)
    exp_all_ones = (sign_bit - 1) >> field_shift
    if f.kind == "x87":
        integer_bit = man >> 63
        if field == exp_all_ones:
            return ("inf" if man == 1 << 63 else "nan"), negative, 0, 0
        if field and not integer_bit:
            return "nan", negative, 0, 0
        if not man:
            return "zero", negative, 0, 0
        return "finite", negative, man, max(field, 1) - f.bias - f.man_bits
    if f.kind == "ieee" and field == exp_all_ones:
        return ("nan" if man else "inf"), negative, 0, 0
    if f.kind == "nan_allones" and field == exp_all_ones and man == (1 << f.man_bits) - 1:
        return "nan", negative, 0, 0
    if f.kind == "nan_negzero" and negative and not field and not man:
        return "nan", True, 0, 0
    if not field:
        return ("finite" if man else "zero"), negative, man, f.emin - f.man_bits
    return "finite", negative, (1 << f.man_bits) | man, field - f.bias - f.man_bits


def bits_to_float(bits: int, float_type: str) -> float:
    """Return the value of a bit pattern of ``float_type`` as a Python float.

    Exact for every finite pattern of the formats up to f64. f80 and f128
    values that are not doubles raise ValueError. NaN payloads are kept for
    f64 and f32 only.
    """
    f = _fmt(float_type)
    if not 0 <= bits < (1 << f.width):
        raise ValueError(f"bit pattern {bits:#x} does not fit {float_type}")
    if f is _F64:
        return _unpack_d(_pack_q(bits))[0]
    if f is _F32:
        return _unpack_f(_pack_i(bits))[0]
    category, negative, num, exp2 = _decode(bits, f)
    if category == "nan":
        value = math.nan
    elif category == "inf":
        value = math.inf
    elif category == "zero":
        value = 0.0
    else:
        value = _exact_double(num, exp2)
        if value is None:
            raise ValueError(f"{float_type} pattern {bits:#x} is not exactly a double")
    return -value if negative else value


def _exact_double(num: int, exp2: int) -> float | None:
    try:
        value = math.ldexp(num, exp2)
    except OverflowError:
        return None
    if value == 0.0 or value.as_integer_ratio() != _ratio(num, exp2):
        return None
    return value


def _ratio(num: int, exp2: int) -> tuple[int, int]:
    """num * 2**exp2 as a reduced (numerator, denominator) pair."""
    tz = (num & -num).bit_length() - 1
    num >>= tz
    exp2 += tz
    return (num << exp2, 1) if exp2 >= 0 else (num, 1 << -exp2)


# --------------------------------------------------------------------------
# APFloat::toString.
#
# A finite nonzero value is num / 2**t with num odd (t > 0), i.e. exactly
# m * 10**-t with m = num * 5**t; or it is the integer m (t = 0).
# APFloat::toString first divides m by 10**r, truncating, with r chosen from
# m's bit length; floor(m / 10**r) is computed here without big divisions.


def _bits_required(precision: int) -> int:
    # AdjustToPrecision(APInt&): 196/59 slightly exceeds lg 10.
    return (precision * 196 + 58) // 59


_STEP1_BITS = _bits_required(_STEP1_PRECISION)
_STEP2_BITS = {name: _bits_required(f.digits) for name, f in _FORMATS.items()}
_EXP_OFFSET = 400
# Step 1's exponent: at least two digits, lower-case "e" (f64 needs -324..308).
_STEP1_EXP: tuple[str, ...] = tuple(
    ("e-%02d" % -x if x < 0 else "e+%02d" % x) for x in range(-_EXP_OFFSET, _EXP_OFFSET)
)
_ZEROS: tuple[str, ...] = tuple("0" * i for i in range(_STEP1_PRECISION + 2))


def _shrink(m: int, num: int, t: int, r: int) -> int:
    """floor(m / 10**r), where m = num * 5**t when t > 0."""
    if not r:
        return m
    if not t:
        return m // _pow10(r)
    if t >= r:
        return (num * _pow5(t - r)) >> r  # m / 10**r == num * 5**(t-r) / 2**r
    return num // (_pow5(r - t) << r)


def _round_digits(m: int, e: int, precision: int) -> tuple[str, int]:
    """Digits of m * 10**e after AdjustToPrecision(buffer).

    Returns (digits without trailing zeros, at most ``precision`` of them;
    exponent of the last digit). Rounding is half-up on the first dropped
    digit only, as in APFloat. APFloat strips trailing zeros before rounding;
    stripping after gives the same digits, because a dropped zero never
    rounds up.
    """
    s = str(m)
    n = len(s)
    if n > precision:
        q = m // _POW10[n - precision]
        if s[precision] >= "5":
            q += 1  # a carry out gives 10...0, stripped below
        s = str(q)
        e += n - precision
    k = len(s)
    s = s.rstrip("0")
    return s, e + k - len(s)


def _step1_text(negative: bool, s: str, e: int) -> str:
    """toString(6, 0, false) of s * 10**e: always ``d.dddddde±XX``."""
    n = len(s)
    x = e + n - 1
    if -_EXP_OFFSET <= x < _EXP_OFFSET:
        suffix = _STEP1_EXP[x + _EXP_OFFSET]
    else:  # f80 and f128 only
        suffix = "e-%02d" % -x if x < 0 else "e+%02d" % x
    text = s[0] + "." + s[1:] + _ZEROS[_STEP1_PRECISION + 1 - n] + suffix
    return "-" + text if negative else text


def _step2_text(negative: bool, s: str, e: int, precision: int) -> str:
    """Default toString() (padding 3, TruncateZero true) of s * 10**e."""
    n = len(s)
    if e < 0:
        whole = e + n
        if whole > 0:  # 765e-2 == 7.65
            text = s[:whole] + "." + s[whole:]
        elif 1 - whole <= _MAX_PADDING:  # 765e-5 == 0.00765: the leading digit is 10**(whole-1)
            text = "0." + "0" * -whole + s
        else:
            text = s[0] + "." + (s[1:] or "0") + "E" + str(whole - 1)
    elif e > _MAX_PADDING or n + e > precision:
        text = s[0] + "." + (s[1:] or "0") + "E+" + str(e + n - 1)
    else:
        text = s + "0" * e  # no '.': the caller falls back to hex
    return "-" + text if negative else text


def _hex(bits: int) -> str:
    # APInt::toString(radix 16, unsigned, formatAsCLiteral): no zero padding.
    return f"0x{bits:X}"


def _parses_back(s: str, e: int, text: str, num: int, exp2: int, f: _Format, value: float | None) -> bool:
    """Whether APFloat(f, text), correctly rounded with ties to even, is num * 2**exp2.

    ``text`` spells s * 10**e with the sign of the value; ``value`` is the
    value as a double when it is one.
    """
    if value is not None and f.man_bits <= 52:
        x = float(text)
        if f is _F64:
            return x == value
        # Rounding the decimal to a double and then to f is rounding twice.
        # That is exact when the double is in f's normal range and not
        # exactly halfway between two values of f; the second rounding is
        # then done on the double's bits.
        shift = 52 - f.man_bits
        xbits = _unpack_q(_pack_d(x))[0]
        low = xbits & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if low != half and _NORMAL_RANGE[f.name][0] <= abs(x) < _NORMAL_RANGE[f.name][1]:
            xbits = (xbits >> shift) + (low > half)
            return _unpack_d(_pack_q(xbits << shift))[0] == value
    d = int(s)
    back = _round_exact(d * _pow10(e), 1, f) if e >= 0 else _round_exact(d, _pow10(-e), f)
    return back is not None and back[0] != 0 and _ratio(*back) == _ratio(num, exp2)


def _may_have_6_digits(s: str) -> bool:
    """Whether a normal f64 whose step-2 digits are ``s`` can be within half an ulp of a 6-digit decimal.

    If a 6-digit decimal D parses back to the normal double V, then
    |V - D| < 2**-53 * D, which is under 12 units of V's 17th significant
    digit. So V's 17 digits are D's 6 digits and then 0000000000x, or D's
    6 digits minus one and then 9999999999x. APFloat's own 17 digits are off
    by less than one more unit, so digits 7 to 15 must all be 0 or all be 9.
    """
    middle = (s + "00000000000")[6:15]
    return len(s) <= 6 or middle == "000000000" or middle == "999999999"


def _format_finite(negative: bool, num: int, exp2: int, f: _Format, value: float | None) -> str | None:
    """printFloatValue for the nonzero value ±num * 2**exp2; None means "print the bits"."""
    value_num, value_exp2 = num, exp2
    t = 0
    if exp2 >= 0:
        m = num << exp2
    else:
        tz = (num & -num).bit_length() - 1
        if tz >= -exp2:
            m = num >> -exp2  # an integer
        else:
            num >>= tz
            t = -exp2 - tz
            m = num * _pow5(t)
    bits = m.bit_length()

    # Step 2's digits come first: for f64 they show cheaply whether step 1
    # can succeed at all, which it rarely does for computed scales.
    required = _STEP2_BITS[f.name]
    r2 = (bits - required) * 59 // 196 if bits > required else 0
    m2 = _shrink(m, num, t, r2)
    s2, e2 = _round_digits(m2, r2 - t, f.digits)

    # Step 1: toString(6, 0, false), kept only if it parses back exactly.
    if f is not _F64 or value is None or abs(value) < _F64_MIN_NORMAL or _may_have_6_digits(s2):
        r1 = (bits - _STEP1_BITS) * 59 // 196 if bits > _STEP1_BITS else 0
        # floor(floor(m / 10**r2) / 10**(r1-r2)) == floor(m / 10**r1)
        m1 = m2 // _POW10[r1 - r2] if r1 >= r2 else _shrink(m, num, t, r1)
        s, e = _round_digits(m1, r1 - t, _STEP1_PRECISION)
        text = _step1_text(negative, s, e)
        if _parses_back(s, e, text, value_num, value_exp2, f, value):
            return text

    # Step 2: the default toString(), if it has a '.'.
    text = _step2_text(negative, s2, e2, f.digits)
    return text if "." in text else None


def format_float(value: float, float_type: str = "f64") -> str:
    """Print ``value`` exactly as MLIR's AsmPrinter prints a float of that type.

    ``value`` must already be representable in ``float_type``; callers round
    with :func:`round_to_float_type`. The result is what upstream MLIR
    writes for a ``FloatAttr`` value (without the ``: type`` suffix) and for
    quant scales. That is the 6-digit scientific form if it round-trips,
    else APFloat's default rendering, else the hex bit pattern (integral
    values whose rendering has no ``.``, inf, NaN). NaN prints as the
    format's canonical quiet NaN (see :func:`float_to_bits`); use
    :func:`format_float_bits` to print a specific NaN pattern.
    """
    f = _FORMATS.get(float_type) or _fmt(float_type)
    if value != value or value == math.inf or value == -math.inf:
        return _hex(float_to_bits(value, float_type))
    if value == 0.0:
        if f.kind == "e8m0":
            raise ValueError("f8E8M0FNU has no zero")
        # toString of a zero is "0.000000e+00", which always round-trips.
        if math.copysign(1.0, value) < 0 and f.kind != "nan_negzero":
            return "-0.000000e+00"
        return "0.000000e+00"
    negative = value < 0.0
    num, den = (-value if negative else value).as_integer_ratio()
    text = _format_finite(negative, num, 1 - den.bit_length(), f, value)
    return _hex(float_to_bits(value, float_type)) if text is None else text


def format_float_bits(bits: int, float_type: str) -> str:
    """Print the float with bit pattern ``bits`` exactly as MLIR's AsmPrinter does.

    Works on the exact pattern, so it also covers every f80 and f128 value
    and keeps NaN payloads: inf and NaN patterns print as their own bits.
    """
    f = _fmt(float_type)
    if not 0 <= bits < (1 << f.width):
        raise ValueError(f"bit pattern {bits:#x} does not fit {float_type}")
    category, negative, num, exp2 = _decode(bits, f)
    if category == "zero":
        return "-0.000000e+00" if negative else "0.000000e+00"
    if category != "finite":
        if f.kind == "x87" and category == "nan":
            # APFloat reads unnormals and pseudo-NaNs as NaN and writes a NaN
            # back with the all-ones exponent.
            bits |= ((1 << 15) - 1) << 64
        return _hex(bits)
    value = _exact_double(num, exp2) if f.man_bits <= 52 else None  # enables the fast checks
    if value is not None and negative:
        value = -value
    text = _format_finite(negative, num, exp2, f, value)
    return _hex(bits) if text is None else text


def format_diagnostic_float(value: float) -> str:
    """Print a double as MLIR diagnostics do (``raw_ostream << double``).

    That is ``llvm::write_double`` with ``FloatStyle::Exponent``: C's ``%e``
    (6 digits after the point, e.g. ``5.960464e-08``), except that any NaN
    prints as ``nan`` (no sign) and infinities as ``INF`` and ``-INF``.
    """
    if value != value:
        return "nan"
    if value == math.inf:
        return "INF"
    if value == -math.inf:
        return "-INF"
    return "%e" % value

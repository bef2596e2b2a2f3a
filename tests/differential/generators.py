"""Seeded generators of `!quant.*` type texts and small quant-cast modules for the differential test.

Everything here is plain `random.Random(seed)`: the same seed gives the same cases, byte for byte. The
generators do not know which texts are valid; the real MLIR decides. They are biased so that most texts are
valid (to compare printing) while every rule of the parser and the verifiers is hit by some invalid ones.

Each case carries a `category` (`uniform/scale`, `module/per-axis/qcast/bad-wrong-dim`, ...): the test
groups its results by it, so that a mismatch report says which part of the input space it came from.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

# -------------------------------------------------------------------------------------------------------
# Building blocks


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


SIGNED_PREFIXES = ("i", "si")
# Float storage types MLIR accepts, with their finite range (the default storage bounds).
FLOAT_STORAGE_RANGES = {"f8E5M2": (-57344, 57344), "f8E4M3FN": (-448, 448), "f4E2M1FN": (-6, 6)}
# Other small floats: not storage types upstream (the test records what MLIR says about them).
OTHER_SMALL_FLOATS = words("f8E4M3 f8E5M2FNUZ f8E4M3FNUZ f8E4M3B11FNUZ f8E3M4 f8E8M0FNU f6E2M3FN f6E3M2FN")
EXPRESSED = ("f16", "bf16", "f32", "f64")
EXOTIC_EXPRESSED = ("tf32", "f80", "f128", "f8E5M2", "f8E4M3FN", "f4E2M1FN", "f6E3M2FN")
INVALID_EXPRESSED = words("i8 si8 f33 index none vector<2xf32> tensor<f32> complex<f32> i1")
INVALID_STORAGE = words("i0 u0 i33 u33 si33 ui0 i64 i1024 f16 bf16 f32 index int8 i u s8 x8")
# Scale literals MLIR rejects (or that are out of every range), and some that are just odd.
ODD_SCALES = words(
    "0.0 -0.0 -1.0 -0.5 1.0e-400 1.0e+39 1.0e309 1 2 1e-3 +1.0 inf nan 0x0 0x8000000000000000 "
    "0x7FF0000000000000 0x7FF8000000000000 0xBFF0000000000000 -0x3FF0000000000000 0x3FF00000000000000 "
    "1.0e-320 1.0e+300 1.0e-50 -1.0e-10 .5 0.5. 1.e5 1.5e"
)
# (smallest positive subnormal, largest finite) of each expressed type, as Python floats.
FLOAT_LIMITS = {
    "f16": (2.0**-24, 65504.0),
    "bf16": (2.0**-133, float.fromhex("0x1.fep127")),
    "f32": (2.0**-149, float.fromhex("0x1.fffffep127")),
    "f64": (5e-324, 1.7976931348623157e308),
}


@dataclass(frozen=True)
class Storage:
    """A storage type as written, and the facts the generators need about it."""

    text: str
    low: int  # default minimum
    high: int  # default maximum
    width: int  # bits (0 for unparsable spellings)
    is_float: bool = False
    is_signed: bool = True

    @property
    def signless(self) -> str:
        """The signless integer type of the same width (what quant.scast converts to and from)."""
        return f"i{self.width}"


def integer_storage(prefix: str, width: int) -> Storage:
    signed = prefix in SIGNED_PREFIXES
    if width <= 0:
        return Storage(f"{prefix}{width}", 0, 0, width, is_signed=signed)
    low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
    return Storage(f"{prefix}{width}", low, high, width, is_signed=signed)


def float_storage(name: str) -> Storage:
    low, high = FLOAT_STORAGE_RANGES.get(name, (-1, 1))
    width = int(name[1]) if name[1].isdigit() else 0
    return Storage(name, low, high, width, is_float=True)


def pick_width(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.45:
        return rng.choice((2, 4, 8, 8, 8, 16, 32))
    return rng.randint(1, 32)


def gen_storage(rng: random.Random, invalid: float = 0.08) -> Storage:
    """Mostly i/u/si/ui of width 1..32; sometimes float storage; rarely an illegal spelling."""
    r = rng.random()
    if r < invalid:
        text = rng.choice((*INVALID_STORAGE, *OTHER_SMALL_FLOATS))
        return Storage(text, 0, 0, 0)
    if r < invalid + 0.12:
        return float_storage(rng.choice(tuple(FLOAT_STORAGE_RANGES)))
    prefix = rng.choice(("i", "i", "u", "u", "si", "ui"))
    return integer_storage(prefix, pick_width(rng))


def gen_bounds(rng: random.Random, storage: Storage, invalid: float = 0.15) -> tuple[str, int, int]:
    """`<lo:hi>` or nothing, and the effective bounds. Valid narrowing mostly; out-of-range or min>=max."""
    low, high = storage.low, storage.high
    r = rng.random()
    if r < 0.55 or low >= high:
        return "", low, high
    if r < 0.55 + invalid:
        kind = rng.randrange(5)
        if kind == 0:
            lo, hi = low - rng.randint(1, 1000), high
        elif kind == 1:
            lo, hi = low, high + rng.randint(1, 1000)
        elif kind == 2:
            lo = hi = rng.randint(low, high)
        elif kind == 3:
            lo, hi = high, low
        else:
            lo, hi = rng.randint(low, high), rng.randint(low, high)
        return f"<{lo}:{hi}>", lo, hi
    if r < 0.75:
        return f"<{low}:{high}>", low, high  # the full range: printed without bounds
    lo = rng.randint(low, high - 1)
    hi = rng.randint(lo + 1, high)
    if rng.random() < 0.3:  # the common "narrow range" forms
        lo, hi = (low + 1, high) if rng.random() < 0.5 else (low, high - 1)
    return f"<{lo}:{hi}>", lo, hi


def gen_expressed(rng: random.Random, invalid: float = 0.05) -> str:
    r = rng.random()
    if r < invalid:
        return rng.choice(INVALID_EXPRESSED)
    if r < invalid + 0.03:
        return rng.choice(EXOTIC_EXPRESSED)
    return rng.choice(EXPRESSED)


def float_text(value: float) -> str:
    """A decimal literal MLIR's lexer reads as a float (it must have a `.`)."""
    text = repr(value)
    if "inf" in text or "nan" in text:
        return text
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (e + exponent if e else "")


def f64_hex(value: float) -> str:
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


def float_literal(rng: random.Random, value: float, hex_rate: float) -> str:
    """A decimal or hex literal of `value`; rarely a form MLIR rejects (`-0x...`, an integer)."""
    r = rng.random()
    if r < 0.01:
        return ("-" if value < 0 else "") + f64_hex(abs(value))  # a hex float may not have a leading minus
    if r < 0.02:
        return str(int(value))  # an integer literal is no float literal
    return f64_hex(value) if r < 0.02 + hex_rate else float_text(value)


def near_limit_scales(expressed: str) -> list[float]:
    tiny, huge = FLOAT_LIMITS.get(expressed, FLOAT_LIMITS["f32"])
    return [
        tiny,
        tiny * 1.000001,
        tiny * 0.99,
        tiny / 2,
        huge,
        huge * 0.999999,
        huge * 1.000001,
        math.nextafter(huge, math.inf),
        math.nextafter(tiny, 0.0),
        huge * 2 if huge < 1e308 else huge,
        65504.0,
        65519.0,
        65520.0,
        5.960464477539063e-08,
        5.96e-08,
        6.0e-08,
        3.3895313892515355e38,
        3.39e38,
        9.183549615799121e-41,
        1.401298464324817e-45,
        1.4e-45,
    ]


def gen_scale(rng: random.Random, expressed: str, invalid: float = 0.1) -> str:
    """A scale literal: short decimal, random double, hex bits, near a limit, or (rarely) an illegal one."""
    r = rng.random()
    if r < invalid:
        return rng.choice(ODD_SCALES)
    r = rng.random()
    if r < 0.35:  # short decimals
        digits = rng.randint(1, 4)
        mantissa = rng.randint(1, 10**digits - 1)
        point = rng.randint(0, digits)
        text = str(mantissa).rjust(point + 1, "0")
        text = f"{text[: len(text) - point]}.{text[len(text) - point :]}"
        if rng.random() < 0.25:
            text += f"e{rng.randint(-8, 4):+d}" if rng.random() < 0.5 else f"E{rng.randint(-8, 4)}"
        return text
    if r < 0.6:  # random doubles
        value = 10 ** rng.uniform(-9, 4)
        return float_text(float(f"%.{rng.randint(3, 17)}g" % value))
    if r < 0.72:  # hex bit patterns of a double
        value = 10 ** rng.uniform(-6, 4)
        if rng.random() < 0.2:
            value = float(rng.randint(1_000_000, 99_999_999))  # integral values print as hex
        return f64_hex(value) if rng.random() < 0.8 else f64_hex(value).lower().replace("0X", "0x")
    if r < 0.85:  # near the limits of the expressed type (and of the others)
        value = rng.choice(near_limit_scales(expressed))
        return float_text(value) if rng.random() < 0.8 else f64_hex(value)
    if r < 0.93:  # integral and binary-exact values
        return float_text(
            rng.choice((1.0, 2.0, 0.5, 0.25, 0.0078125, 1024.0, 12345678.0, 1234567.0, 10704349.0))
        )
    return float_text(
        rng.choice((0.998, 0.95, 0.99, 0.3, 0.8, 0.9999, 0.996, 0.1234567, 1.5350925350904778e-5))
    )


def gen_zero_point(rng: random.Random, storage: Storage, invalid: float = 0.05) -> str:
    """`:zp` or nothing: small, at the storage extremes, large, negative; rarely illegal."""
    r = rng.random()
    if r < 0.35:
        return ""
    if r < 0.35 + invalid:
        return ":" + rng.choice(
            ("9223372036854775808", "-9223372036854775809", "1.5", "x", "", "18446744073709551616")
        )
    r = rng.random()
    if r < 0.5:
        value = rng.randint(-128, 255)
    elif r < 0.7 and storage.low < storage.high:
        value = rng.choice((storage.low, storage.high, (storage.low + storage.high) // 2))
    elif r < 0.85:
        value = rng.choice((0, 1000, -1000, 128, 300, 200, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 65536))
    else:
        return ":" + rng.choice(("0x7F", "0xFF", "0x10", "-0x10"))
    return f":{value}"


# -------------------------------------------------------------------------------------------------------
# Type cases


@dataclass(frozen=True)
class TypeCase:
    category: str
    text: str


@dataclass(frozen=True)
class QuantSpec:
    """A quant type text with what the module generator needs to build shapes around it."""

    text: str
    kind: str  # per-tensor, per-axis, sub-channel, any, calibrated, quantile
    storage: Storage
    expressed: str
    axis: int = -1
    num_scales: int = 0
    blocks: tuple[tuple[int, int], ...] = ()
    scale_dims: tuple[int, ...] = ()


def gen_per_tensor(rng: random.Random, category: str = "uniform/per-tensor") -> TypeCase:
    storage = gen_storage(rng)
    bounds, _, _ = gen_bounds(rng, storage)
    expressed = gen_expressed(rng)
    scale = gen_scale(rng, expressed)
    zp = gen_zero_point(rng, storage)
    return TypeCase(category, f"!quant.uniform<{storage.text}{bounds}:{expressed}, {scale}{zp}>")


def gen_scale_focus(rng: random.Random) -> TypeCase:
    """Per-tensor types whose only variable part is the scale (valid storage and expressed type)."""
    storage = integer_storage(rng.choice(("i", "u")), 8)
    expressed = rng.choice(EXPRESSED)
    scale = gen_scale(rng, expressed, invalid=0.15)
    return TypeCase("uniform/scale", f"!quant.uniform<{storage.text}:{expressed}, {scale}>")


def param_list(rng: random.Random, storage: Storage, expressed: str, count: int, sep: str) -> str:
    return sep.join(
        f"{gen_scale(rng, expressed, 0.03)}{gen_zero_point(rng, storage, 0.01)}" for _ in range(count)
    )


def gen_per_axis(rng: random.Random) -> TypeCase:
    storage = gen_storage(rng)
    bounds, _, _ = gen_bounds(rng, storage)
    expressed = gen_expressed(rng)
    axis = rng.choice((0, 0, 1, 1, 2, 3)) if rng.random() > 0.05 else rng.choice((-1, 2**31, 2**40))
    count = rng.randint(1, 5) if rng.random() > 0.03 else 0
    body = param_list(rng, storage, expressed, count, rng.choice((",", ", ")))
    return TypeCase(
        "uniform/per-axis", f"!quant.uniform<{storage.text}{bounds}:{expressed}:{axis}, {{{body}}}>"
    )


def nested(rng: random.Random, dims: tuple[int, ...], leaf: Callable[[], str], ragged: bool) -> str:
    """A brace-nested tensor literal of shape `dims`; `ragged` makes one sub-list of a different rank."""
    if len(dims) == 1:
        items = [leaf() for _ in range(dims[0])]
        if ragged and rng.random() < 0.5:
            items[rng.randrange(len(items))] = "{" + leaf() + "}"
        return "{" + ", ".join(items) + "}"
    items = [nested(rng, dims[1:], leaf, False) for _ in range(dims[0])]
    if ragged:
        position = rng.randrange(len(items))
        items[position] = leaf() if rng.random() < 0.5 else "{" + items[position] + "}"
    return "{" + ", ".join(items) + "}"


def gen_blocks(rng: random.Random, rank: int, invalid: float = 0.06) -> list[tuple[int, int]]:
    axes = [a for a in range(rank) if rng.random() < 0.6]
    blocks = [(a, rng.choice((1, 1, 2, 2, 3, 4))) for a in axes]
    if rng.random() < invalid:
        bad = rng.choice(((0, 0), (0, -1), (-1, 2), (rank + 1, 2)))
        blocks.insert(rng.randint(0, len(blocks)), bad)
    elif rng.random() < 0.03 and blocks:
        blocks.append(blocks[0])  # a duplicate axis
    return blocks


def gen_sub_channel(rng: random.Random) -> TypeCase:
    storage = gen_storage(rng)
    while storage.is_float:  # upstream MLIR crashes (SIGSEGV) on sub-channel types with float storage
        storage = gen_storage(rng)
    bounds, _, _ = gen_bounds(rng, storage)
    expressed = gen_expressed(rng)
    rank = rng.randint(1, 3)
    dims = tuple(rng.choice((1, 1, 2, 2, 3)) for _ in range(rank))
    blocks = gen_blocks(rng, rank)
    block_text = (
        ", ".join(f"{a}:{b}" for a, b in blocks)
        if rng.random() < 0.8
        else ",".join(f"{a}:{b}" for a, b in blocks)
    )
    ragged = rng.random() < 0.07
    body = nested(
        rng, dims, lambda: f"{gen_scale(rng, expressed, 0.03)}{gen_zero_point(rng, storage, 0.01)}", ragged
    )
    return TypeCase(
        "uniform/sub-channel/ragged" if ragged else "uniform/sub-channel",
        f"!quant.uniform<{storage.text}{bounds}:{expressed}:{{{block_text}}}, {body}>",
    )


def gen_any(rng: random.Random) -> TypeCase:
    storage = gen_storage(rng)
    bounds, _, _ = gen_bounds(rng, storage)
    expressed = f":{gen_expressed(rng)}" if rng.random() < 0.6 else ""
    return TypeCase("any", f"!quant.any<{storage.text}{bounds}{expressed}>")


def gen_calibrated_value(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.4:
        return round(rng.uniform(-10, 10), rng.randint(0, 4))
    if r < 0.7:
        return rng.uniform(-1000, 1000)
    return rng.choice((0.0, -0.998, 1.2321, 12345678.0, -12345678.0, 1e-40, 0.95, 1e300, -1e-300))


def gen_calibrated(rng: random.Random) -> TypeCase:
    expressed = gen_expressed(rng, invalid=0.1)
    lo, hi = sorted((gen_calibrated_value(rng), gen_calibrated_value(rng)))
    r = rng.random()
    if r < 0.08:
        lo, hi = hi, lo
    elif r < 0.12:
        hi = lo

    def literal(value: float) -> str:
        return float_literal(rng, value, 0.15)

    r = rng.random()
    if r < 0.05:
        return TypeCase("calibrated", f"!quant.calibrated<{expressed}>")
    if r < 0.08:
        return TypeCase("calibrated", f"!quant.calibrated<{expressed}<{literal(lo)}>>")
    return TypeCase("calibrated", f"!quant.calibrated<{expressed}<{literal(lo)}:{literal(hi)}>>")


def gen_quantile(rng: random.Random) -> TypeCase:
    r = rng.random()
    if r < 0.7:
        width = rng.choice((1, 2, 2, 3, 4, 4))
        prefix = rng.choice(("i", "i", "ui", "si", "u"))
        storage = integer_storage(prefix, width)
        count = storage.high - storage.low + 1
    elif r < 0.9:
        storage = float_storage(rng.choice(("f4E2M1FN", "f4E2M1FN", "f8E5M2", "f8E4M3FN")))
        count = 16 if storage.text == "f4E2M1FN" else 256
    else:
        storage = Storage(rng.choice(("i8", "f16", "index", "i0", "f6E2M3FN", "f8E4M3")), 0, 0, 8)
        count = rng.choice((4, 16, 256))
    quantile_type = (
        rng.choice((*EXPRESSED, "f16", "f32"))
        if rng.random() > 0.1
        else rng.choice(("i8", "i4", "index", "f8E5M2", "f4E2M1FN", "tf32"))
    )
    bounds = ""
    if rng.random() < 0.25 and storage.low < storage.high:
        lo = rng.randint(storage.low, storage.high - 1)
        hi = rng.randint(lo + 1, storage.high)
        if rng.random() < 0.1:
            lo, hi = hi, lo
        if rng.random() < 0.1:
            lo -= 1
        bounds = f", <{lo}:{hi}>"
        count = hi - lo + 1
    if rng.random() < 0.1:
        count = max(0, count + rng.choice((-1, 1, -count)))
    count = min(count, 300)
    values = sorted(round(rng.uniform(-2, 2), rng.randint(1, 6)) for _ in range(count))
    lut = ",".join(float_literal(rng, v, 0.1) for v in values)
    return TypeCase("quantile", f"!quant.quantile<{storage.text}:{quantile_type}, {{{lut}}}{bounds}>")


MUTATIONS = ("delete", "replace", "truncate", "duplicate", "insert", "keyword")


def mutate(rng: random.Random, text: str) -> tuple[str, str]:
    """A syntax error: one punctuation deleted/replaced/duplicated, a truncation, junk, a bad keyword."""
    kind = rng.choice(MUTATIONS)
    start = len("!quant.")
    punct = [i for i, c in enumerate(text) if c in "<>:,{}" and i >= start]
    if kind == "delete" and punct:
        i = rng.choice(punct)
        return kind, text[:i] + text[i + 1 :]
    if kind == "replace" and punct:
        i = rng.choice(punct)
        return kind, text[:i] + rng.choice(";:,<>{}() ") + text[i + 1 :]
    if kind == "duplicate" and punct:
        i = rng.choice(punct)
        return kind, text[:i] + text[i] + text[i:]
    if kind == "insert":
        i = rng.randint(start, len(text) - 1)
        return kind, text[:i] + rng.choice(
            (" foo", " 1", " -", " ?", "x", " %a", " @s", " !quant.any<i8>")
        ) + text[i:]
    if kind == "keyword":
        keyword = rng.choice(("foobar", "__", "Uniform", "uniformx", "any2", "calib", "quant", "uniform", ""))
        rest = text[text.index("<") :] if "<" in text else ""
        return kind, f"!quant.{keyword}{rest}"
    return "truncate", text[: rng.randint(start, len(text) - 1)]


TYPE_GENERATORS: tuple[tuple[float, Callable[[random.Random], TypeCase]], ...] = (
    (0.22, gen_per_tensor),
    (0.12, gen_scale_focus),
    (0.16, gen_per_axis),
    (0.2, gen_sub_channel),
    (0.08, gen_any),
    (0.08, gen_calibrated),
    (0.08, gen_quantile),
)


CONTAINERS = (
    "tensor<2x3x{}>",
    "tensor<?x{}>",
    "tensor<*x{}>",
    "tensor<{}>",
    "vector<4x{}>",
    "vector<[2]x{}>",
)


def generate_type_cases(
    seed: int, count: int, syntax_errors: float = 0.06, containers: float = 0.08
) -> list[TypeCase]:
    """`count` type texts; about `syntax_errors` of them are mutated into syntax errors, and about
    `containers` of them are the element type of a tensor or vector type."""
    rng = random.Random(seed)
    weights = [w for w, _ in TYPE_GENERATORS]
    generators = [g for _, g in TYPE_GENERATORS]
    cases = []
    for _ in range(count):
        case = rng.choices(generators, weights)[0](rng)
        if rng.random() < syntax_errors:
            kind, text = mutate(rng, case.text)
            case = TypeCase(f"syntax/{kind}", text)
        elif rng.random() < containers:
            container = rng.choice(CONTAINERS)
            case = TypeCase(f"container/{container.partition('<')[0]}", container.format(case.text))
        cases.append(case)
    return cases


# -------------------------------------------------------------------------------------------------------
# Valid type specs and modules


def gen_valid_storage(rng: random.Random) -> Storage:
    if rng.random() < 0.1:
        return float_storage(rng.choice(tuple(FLOAT_STORAGE_RANGES)))
    prefix = rng.choice(("i", "i", "i", "u", "u", "si", "ui"))
    return integer_storage(prefix, rng.choice((4, 8, 8, 8, 16, 32, 2, 1, 7)))


def gen_valid_scale(rng: random.Random, expressed: str) -> str:
    return (
        gen_scale(rng, expressed, invalid=0.0)
        if rng.random() < 0.5
        else rng.choice(("0.5", "2.0", "0.25", "1.5", "3.0", "0.1", "0.998", "0.0078125"))
    )


def gen_valid_zp(rng: random.Random, storage: Storage) -> str:
    if rng.random() < 0.4 or storage.is_float:
        return ""
    return f":{rng.randint(max(storage.low, -128), min(storage.high, 255))}"


def gen_spec(rng: random.Random) -> QuantSpec:
    """A (probably) valid quant type with its structure."""
    r = rng.random()
    storage = gen_valid_storage(rng)
    while 0.6 <= r < 0.88 and storage.is_float:  # upstream MLIR crashes on sub-channel with float storage
        storage = gen_valid_storage(rng)
    bounds = ""
    if rng.random() < 0.25 and storage.high - storage.low >= 4:
        lo = rng.randint(storage.low, storage.low + 2)
        hi = rng.randint(storage.high - 2, storage.high)
        if lo != storage.low or hi != storage.high:
            bounds = f"<{lo}:{hi}>"
    expressed = rng.choice(EXPRESSED)
    head = f"{storage.text}{bounds}:{expressed}"

    def param() -> str:
        scale = gen_valid_scale(rng, expressed)
        if expressed == "f16" and not (FLOAT_LIMITS["f16"][0] <= safe_float(scale) <= 65504):
            scale = "0.5"
        return scale + gen_valid_zp(rng, storage)

    if r < 0.35:
        return QuantSpec(f"!quant.uniform<{head}, {param()}>", "per-tensor", storage, expressed)
    if r < 0.6:
        axis = rng.randint(0, 2)
        count = rng.randint(1, 4)
        body = ",".join(param() for _ in range(count))
        return QuantSpec(
            f"!quant.uniform<{head}:{axis}, {{{body}}}>", "per-axis", storage, expressed, axis, count
        )
    if r < 0.88:
        rank = rng.randint(1, 3)
        dims = tuple(rng.choice((1, 1, 2, 3)) for _ in range(rank))
        blocks = tuple((a, rng.choice((1, 2, 3))) for a in range(rank) if dims[a] > 1 or rng.random() < 0.3)
        if rng.random() < 0.3:
            blocks = tuple(rng.sample(blocks, len(blocks)))
        block_text = ", ".join(f"{a}:{b}" for a, b in blocks)
        body = nested(rng, dims, param, False)
        return QuantSpec(
            f"!quant.uniform<{head}:{{{block_text}}}, {body}>",
            "sub-channel",
            storage,
            expressed,
            blocks=blocks,
            scale_dims=dims,
        )
    if r < 0.94:
        return QuantSpec(f"!quant.any<{head}>", "any", storage, expressed)
    if r < 0.97 and not storage.is_float and storage.width <= 4:
        values = ",".join(f"{v / 4:.2f}" for v in range(storage.high - storage.low + 1))
        spelling = f"ui{storage.width}" if storage.text.startswith("u") else storage.text  # `u4` is no type
        text = f"!quant.quantile<{spelling}:{expressed}, {{{values}}}>"
        return QuantSpec(text, "quantile", storage, expressed)
    return QuantSpec(f"!quant.calibrated<{expressed}<-1.0:1.0>>", "calibrated", storage, expressed)


def safe_float(text: str) -> float:
    try:
        if text.lower().startswith(("0x", "-0x")):
            return struct.unpack("<d", struct.pack("<Q", int(text, 16) & (2**64 - 1)))[0]
        return float(text)
    except ValueError:
        return math.nan


@dataclass
class Shape:
    """A container: `scalar`, `ranked` (dims, -1 = dynamic), `unranked`, or `vector`."""

    kind: str
    dims: tuple[int, ...] = ()

    def of(self, element: str) -> str:
        if self.kind == "scalar":
            return element
        if self.kind == "unranked":
            return f"tensor<*x{element}>"
        prefix = "".join(("?" if d < 0 else str(d)) + "x" for d in self.dims)
        return f"{'vector' if self.kind == 'vector' else 'tensor'}<{prefix}{element}>"


def fitting_shape(rng: random.Random, spec: QuantSpec) -> Shape:
    """A container the op verifiers accept for this element type."""
    if spec.kind == "per-axis":
        if rng.random() < 0.15:
            return Shape("unranked")
        rank = rng.randint(spec.axis + 1, spec.axis + 2)
        dims = [rng.choice((1, 2, 3, -1)) for _ in range(rank)]
        dims[spec.axis] = spec.num_scales if rng.random() < 0.8 else -1
        return Shape("ranked", tuple(dims))
    if spec.kind == "sub-channel":
        block = dict(spec.blocks)
        dims = []
        for axis, scale_dim in enumerate(spec.scale_dims):
            if rng.random() < 0.15:
                dims.append(-1)
            elif axis in block:
                dims.append(scale_dim * block[axis])
            else:
                dims.append(scale_dim if scale_dim > 1 else rng.choice((1, 2, 5)))
        return Shape("ranked", tuple(dims))
    r = rng.random()
    if r < 0.25:
        return Shape("scalar")
    if r < 0.35:
        return Shape("unranked")
    if r < 0.45:
        return Shape("ranked", ())
    return Shape("ranked", tuple(rng.choice((1, 2, 3, 4, -1)) for _ in range(rng.randint(1, 3))))


def perturb_shape(rng: random.Random, spec: QuantSpec, shape: Shape) -> tuple[str, Shape]:
    """A container the op verifiers should reject for this element type (or, rarely, still accept)."""
    options = ["scalar", "unranked", "vector"]
    if shape.kind == "ranked":
        options += ["rank+1", "rank-1", "dim"]
    kind = rng.choice(options)
    if kind == "scalar":
        return "scalar-container", Shape("scalar")
    if kind == "unranked":
        return "unranked-container", Shape("unranked")
    if kind == "vector":
        return "vector-container", Shape("vector", shape.dims or (2,))
    if kind == "rank+1":
        return "extra-dim", Shape("ranked", (*shape.dims, rng.choice((1, 2))))
    if kind == "rank-1":
        return "missing-dim", Shape("ranked", shape.dims[:-1])
    dims = list(shape.dims)
    if not dims:
        return "extra-dim", Shape("ranked", (2,))
    i = rng.randrange(len(dims))
    dims[i] = (dims[i] if dims[i] > 0 else 2) + rng.choice((1, 2, 3))
    if rng.random() < 0.2:
        dims[i] = 0
    return "wrong-dim", Shape("ranked", tuple(dims))


@dataclass
class ModuleCase:
    category: str
    text: str
    specs: list[QuantSpec] = field(default_factory=list)


def cast_function(name: str, op: str, source: str, result: str) -> str:
    return (
        f"  func.func @{name}(%arg0: {source}) -> {result} {{\n"
        f"    %0 = quant.{op} %arg0 : {source} to {result}\n"
        f"    return %0 : {result}\n"
        f"  }}\n"
    )


def gen_cast_module(rng: random.Random) -> ModuleCase:
    """One function with one cast, either well-typed or broken in one way."""
    spec = gen_spec(rng)
    shape = fitting_shape(rng, spec)
    op = rng.choice(("qcast", "dcast", "scast-to", "scast-from"))
    category = f"module/{spec.kind}/{op}"
    in_shape = out_shape = shape
    expressed = spec.expressed
    integer = spec.storage.signless
    quant = spec.text
    if rng.random() < 0.3:
        fault = rng.choice(
            ("shape", "shape", "operand-shape", "expressed", "storage", "both-int", "both-quant")
        )
        if fault in ("shape", "operand-shape"):
            what, new = perturb_shape(rng, spec, shape)
            if fault == "shape":
                in_shape = out_shape = new
            else:
                in_shape = new
            category += f"/bad-{what}" + ("-operand" if fault == "operand-shape" else "")
        elif fault == "expressed":
            expressed = rng.choice([e for e in (*EXPRESSED, "i8") if e != spec.expressed])
            integer = rng.choice(("i16", "i32", "si8", "ui8", "f32"))
            category += "/bad-element"
        elif fault == "storage":
            integer = rng.choice(("i16", "i32", "si8", "ui8", "f32", "i1"))
            expressed = "i8"
            category += "/bad-element"
        elif fault == "both-int":
            quant = integer
            category += "/no-quant"
        else:
            expressed = integer = quant
            category += "/all-quant"
    if op == "qcast":
        source, result = in_shape.of(expressed), out_shape.of(quant)
    elif op == "dcast":
        source, result = in_shape.of(quant), out_shape.of(expressed)
    elif op == "scast-to":
        source, result = in_shape.of(integer), out_shape.of(quant)
    else:
        source, result = in_shape.of(quant), out_shape.of(integer)
    op_name = op.partition("-")[0]
    return ModuleCase(category, "module {\n" + cast_function("f", op_name, source, result) + "}\n", [spec])


def gen_chain_module(rng: random.Random) -> ModuleCase:
    """Valid modules with several functions: qcast/dcast/scast chains, calls, declarations."""
    specs = [gen_spec(rng) for _ in range(rng.randint(1, 3))]
    functions = []
    for index, spec in enumerate(specs):
        shape = fitting_shape(rng, spec)
        ft, qt, it = shape.of(spec.expressed), shape.of(spec.text), shape.of(spec.storage.signless)
        if spec.kind in ("any", "calibrated", "quantile"):
            functions.append(f"  func.func private @decl{index}({qt}) -> {qt}\n")
            continue
        r = rng.random()
        if r < 0.4:
            functions.append(
                f"  func.func @roundtrip{index}(%arg0: {ft}) -> {ft} {{\n"
                f"    %0 = quant.qcast %arg0 : {ft} to {qt}\n"
                f"    %1 = quant.dcast %0 : {qt} to {ft}\n"
                f"    return %1 : {ft}\n  }}\n"
            )
        elif r < 0.6:
            functions.append(
                f"  func.func @storage{index}(%arg0: {ft}) -> ({it}, {qt}) {{\n"
                f"    %0 = quant.qcast %arg0 : {ft} to {qt}\n"
                f"    %1 = quant.scast %0 : {qt} to {it}\n"
                f"    %2 = quant.scast %1 : {it} to {qt}\n"
                f"    return %1, %2 : {it}, {qt}\n  }}\n"
            )
        elif r < 0.8:
            functions.append(
                f"  func.func private @callee{index}({qt}, {ft}) -> ({qt}, {ft})\n"
                f"  func.func @caller{index}(%arg0: {qt}, %arg1: {ft}) -> ({qt}, {ft}) {{\n"
                f"    %0:2 = call @callee{index}(%arg0, %arg1) : ({qt}, {ft}) -> ({qt}, {ft})\n"
                f"    %1 = quant.dcast %0#0 : {qt} to {ft}\n"
                f"    return %0#0, %1 : {qt}, {ft}\n  }}\n"
            )
        else:
            functions.append(
                f"  func.func @dq{index}(%arg0: {qt}, %arg1: {it}) -> ({ft}, {qt}) {{\n"
                f"    %0 = quant.dcast %arg0 : {qt} to {ft}\n"
                f"    %1 = quant.scast %arg1 : {it} to {qt}\n"
                f"    return %0, %1 : {ft}, {qt}\n  }}\n"
            )
    return ModuleCase("module/chain", "module {\n" + "".join(functions) + "}\n", specs)


def generate_module_cases(seed: int, count: int) -> list[ModuleCase]:
    rng = random.Random(seed)
    return [gen_cast_module(rng) if rng.random() < 0.7 else gen_chain_module(rng) for _ in range(count)]

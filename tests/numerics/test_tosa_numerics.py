"""qconvert.numerics.tosa against the TOSA reference model (tosa-tools 2026.8.0, run from its own venv).

Every case is a one-op TOSA graph (RESCALE, TABLE or AVG_POOL2D) written as MLIR text, serialized by
`tosa-opt --tosa-serialize` and run by `tosa_reference_model`; our numpy emulation must return the same
integers bit for bit, or refuse the same inputs: our TosaErrorIf where the model reports ERROR (or tosa-opt's
verifier refuses the text first), our TosaUnpredictable where it reports UNPREDICTABLE (a REQUIRE failed).
All graphs run in one worker process (a module fixture); more than 100,000 RESCALE values are compared,
covering: random scales over the whole range, gain (scale >= 1) with saturation at both ends, tiny scales
and the shift clamp at 62 (multiplier shifted to 0), mantissas that round to 2**31, exact ties for SINGLE
and DOUBLE rounding at every shift from 31 to 61, zero points at their limits, per-channel scales, 16-bit
and 32-bit inputs, 48-bit inputs at scale16 (as constants: the model's Python binding refuses i48
inputs), unsigned input and output flags, and the ERROR_IF / REQUIRE rules. TABLE: every int8 and every
int16 input through random tables and tables built from sigmoid / tanh / exp. AVG_POOL2D: window counts 1
to 81 with padding (reciprocal_scale).

Not emulated: RESCALE's INEXACT_ROUND (implementation-defined within a bound; the reference model refuses
it too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.numerics.tosa import (
    INTEGER_TYPES,
    TosaErrorIf,
    TosaRounding,
    TosaUnpredictable,
    average_pool_output,
    build_table_i8,
    build_table_i16,
    compute_multiplier_and_shift,
    reciprocal_scale,
    rescale,
    table,
)

pytestmark = pytest.mark.engine

VALUES_PER_CASE = 4096
_CONTAINER = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i48": np.int64}


def dense(values: np.ndarray | list[int], type_text: str) -> str:
    """A `tosa.const` of integer values."""
    flat = np.asarray(values, np.int64).reshape(-1)
    body = str(int(flat[0])) if flat.size == 1 else "[" + ", ".join(str(int(v)) for v in flat) + "]"
    return f'"tosa.const"() <{{values = dense<{body}> : {type_text}}}> : () -> {type_text}'


def bit_pattern(value: int, bits: int) -> int:
    """The signed reading of `value`'s low `bits` bits: how a zero point is written in a signless constant."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@dataclass
class RescaleCase:
    """One RESCALE graph: its input, constants and attributes, as `rescale` takes them."""

    family: str
    values: np.ndarray
    input_type: str
    output_type: str
    multiplier: list[int]
    shift: list[int]
    input_zp: int = 0
    output_zp: int = 0
    scale32: bool = True
    rounding: TosaRounding = TosaRounding.SINGLE
    per_channel: bool = False
    input_unsigned: bool = False
    output_unsigned: bool = False

    def emulate(self) -> tuple[str, np.ndarray | None]:
        """("VALID", result) from our numerics, or ("ERROR_IF" | "REQUIRE", None) when it refuses."""
        try:
            result = rescale(
                self.values,
                self.multiplier,
                self.shift,
                input_type=self.input_type,
                output_type=self.output_type,
                input_zp=self.input_zp,
                output_zp=self.output_zp,
                scale32=self.scale32,
                rounding=self.rounding,
                per_channel=self.per_channel,
                input_unsigned=self.input_unsigned,
                output_unsigned=self.output_unsigned,
            )
        except TosaErrorIf:
            return "ERROR_IF", None
        except TosaUnpredictable:
            return "REQUIRE", None
        return "VALID", result

    def mlir(self) -> str:
        """The graph; i48 values are a constant (the binding takes no i48 input) beside an unused i8 input."""
        shape = "x".join(str(d) for d in self.values.shape)
        in_t, out_t = f"tensor<{shape}x{self.input_type}>", f"tensor<{shape}x{self.output_type}>"
        channels = len(self.multiplier)
        multiplier_t = f"tensor<{channels}x{'i32' if self.scale32 else 'i16'}>"
        shift_t = f"tensor<{channels}xi8>"
        in_zp_t, out_zp_t = f"tensor<1x{self.input_type}>", f"tensor<1x{self.output_type}>"
        in_bits, out_bits = INTEGER_TYPES[self.input_type], INTEGER_TYPES[self.output_type]
        rounding = "DOUBLE_ROUND" if self.rounding == TosaRounding.DOUBLE else "SINGLE_ROUND"
        flags = (
            f"scale32 = {str(self.scale32).lower()}, rounding_mode = #tosa.rounding_mode<{rounding}>, "
            f"per_channel = {str(self.per_channel).lower()}, "
            f"input_unsigned = {str(self.input_unsigned).lower()}, "
            f"output_unsigned = {str(self.output_unsigned).lower()}"
        )
        if self.input_type == "i48":
            argument, source = "%unused: tensor<1xi8>", f"  %x = {dense(self.values, in_t)}\n"
        else:
            argument, source = f"%x: {in_t}", ""
        return (
            f"func.func @main({argument}) -> {out_t} {{\n{source}"
            f"  %m = {dense(self.multiplier, multiplier_t)}\n"
            f"  %s = {dense(self.shift, shift_t)}\n"
            f"  %iz = {dense([bit_pattern(self.input_zp, in_bits)], in_zp_t)}\n"
            f"  %oz = {dense([bit_pattern(self.output_zp, out_bits)], out_zp_t)}\n"
            f'  %y = "tosa.rescale"(%x, %m, %s, %iz, %oz) <{{{flags}}}> : '
            f"({in_t}, {multiplier_t}, {shift_t}, {in_zp_t}, {out_zp_t}) -> {out_t}\n"
            f"  return %y : {out_t}\n}}"
        )

    def inputs(self) -> tuple[np.ndarray, ...]:
        if self.input_type == "i48":
            return (np.zeros(1, np.int8),)
        return (self.values.astype(_CONTAINER[self.input_type]),)


def random_inputs(
    rng: np.random.Generator, type_name: str, count: int, limit: int | None = None
) -> np.ndarray:
    """`count` values of a type, its extremes and 0 / ±1 included, within ±`limit` when given."""
    bits = INTEGER_TYPES[type_name]
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if limit is not None:
        low, high = max(low, -limit), min(high, limit - 1)
    values = rng.integers(low, high, count, endpoint=True, dtype=np.int64)
    values[:5] = [low, high, 0, min(1, high), max(-1, low)]
    return values.astype(_CONTAINER[type_name])


def value_limit(shift: list[int] | np.ndarray, input_zp: int) -> int:
    """Inputs keeping `x - zp` inside apply_scale_32's REQUIRE `|v| < 2**(shift-1)` for every channel."""
    return max(0, (1 << (int(np.min(shift)) - 1)) - abs(input_zp) - 1)


def scale_of(rng: np.random.Generator, low_exponent: float, high_exponent: float) -> float:
    return float(2.0 ** rng.uniform(low_exponent, high_exponent))


def random_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Random per-tensor scales from 2**-45 to 2**12 over every input / output type and both roundings."""
    cases = []
    for input_type in ("i8", "i16", "i32"):
        for output_type in ("i8", "i16", "i32"):
            for rounding in TosaRounding:
                for _ in range(2):
                    scale = scale_of(rng, -45, 12 if input_type != "i32" else -2)
                    multiplier, shift = compute_multiplier_and_shift(scale)
                    input_zp = int(rng.integers(-128, 128)) if input_type == "i8" else 0
                    output_zp = int(rng.integers(-128, 128)) if output_type == "i8" else 0
                    limit = value_limit([int(shift)], input_zp)
                    values = random_inputs(rng, input_type, VALUES_PER_CASE, limit)
                    cases.append(
                        RescaleCase(
                            "random",
                            values,
                            input_type,
                            output_type,
                            [int(multiplier)],
                            [int(shift)],
                            input_zp,
                            output_zp,
                            rounding=rounding,
                        )
                    )
    return cases


def tie_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Exact halves: multiplier 2**30 and shift s make v / 2**(s-30), a tie for every odd multiple of
    2**(s-31); SINGLE rounds them up, DOUBLE (s > 31) away from zero."""
    cases = []
    for shift in range(31, 62):
        unit = 1 << (shift - 31)
        limit = min(2**31, 2 ** (shift - 1))  # apply_scale_32 REQUIREs |v| < 2**(shift-1)
        odd = 2 * rng.integers(-limit // (2 * unit), limit // (2 * unit) - 1, 1024, dtype=np.int64) + 1
        values = odd * unit
        for rounding in TosaRounding:
            cases.append(
                RescaleCase(
                    "ties", values.astype(np.int32), "i32", "i32", [1 << 30], [shift], rounding=rounding
                )
            )
    return cases


def gain_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Scales from 1 to 2**12 (requantization gains): most outputs saturate, at both ends."""
    cases = []
    for input_type, output_type in (
        ("i8", "i8"),
        ("i8", "i16"),
        ("i16", "i16"),
        ("i16", "i8"),
        ("i32", "i16"),
    ):
        for rounding in TosaRounding:
            scale = scale_of(rng, 0, 12)
            multiplier, shift = compute_multiplier_and_shift(scale)
            input_zp = 17 if input_type == "i8" else 0
            values = random_inputs(rng, input_type, VALUES_PER_CASE, value_limit([int(shift)], input_zp))
            cases.append(
                RescaleCase(
                    "gain",
                    values,
                    input_type,
                    output_type,
                    [int(multiplier)],
                    [int(shift)],
                    input_zp,
                    -5 if output_type == "i8" else 0,
                    rounding=rounding,
                )
            )
    exact_one = compute_multiplier_and_shift(1.0)
    values = random_inputs(rng, "i8", 256)
    cases.append(
        RescaleCase(
            "gain", values, "i8", "i8", [int(exact_one.multiplier)], [int(exact_one.shift)], -128, 127
        )
    )
    return cases


def tiny_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Scales below 2**-31, down to 0 and the smallest subnormal: shift clamped at 62, multiplier shifted."""
    cases = []
    scales = [
        2.0**-31,
        2.0**-33,
        2.0**-40,
        2.0**-50,
        2.0**-61,
        2.0**-62,
        2.0**-70,
        2.0**-92,
        1e-30,
        5e-324,
        0.0,
    ]
    for index, scale in enumerate(scales):
        multiplier, shift = compute_multiplier_and_shift(scale)
        output_type = ("i8", "i16", "i32")[index % 3]
        output_zp = (-128, 127)[index % 2] if output_type == "i8" else 0
        values = random_inputs(rng, "i32", VALUES_PER_CASE, value_limit([int(shift)], 0))
        rounding = TosaRounding.DOUBLE if index % 2 else TosaRounding.SINGLE
        cases.append(
            RescaleCase(
                "tiny",
                values,
                "i32",
                output_type,
                [int(multiplier)],
                [int(shift)],
                0,
                output_zp,
                rounding=rounding,
            )
        )
    return cases


def renormalised_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Scales whose mantissa rounds to 2**31 ((1 - 2**-33) * 2**e): multiplier 2**30 and one less shift."""
    cases = []
    for exponent in (-1, -9, -20, -31):
        scale = (1 - 2.0**-33) * 2.0**exponent
        multiplier, shift = compute_multiplier_and_shift(scale)
        assert int(multiplier) == 1 << 30 and int(shift) == 30 - exponent, "the mantissa did not renormalise"
        values = random_inputs(rng, "i32", VALUES_PER_CASE, value_limit([int(shift)], 0))
        cases.append(RescaleCase("renormalised", values, "i32", "i32", [int(multiplier)], [int(shift)]))
    return cases


def zero_point_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Zero points at their limits, signed and unsigned (u8 0 / 255, u16 0 / 32768)."""
    cases = []
    scale = compute_multiplier_and_shift(0.37)
    m, s = [int(scale.multiplier)], [int(scale.shift)]
    everything8 = np.arange(-128, 128, dtype=np.int8)
    for input_zp in (-128, 127):
        for output_zp in (-128, 127):
            cases.append(RescaleCase("zero points", everything8, "i8", "i8", m, s, input_zp, output_zp))
    for input_zp in (0, 255):
        cases.append(
            RescaleCase("zero points", everything8, "i8", "i8", m, s, input_zp, 3, input_unsigned=True)
        )
    for output_zp in (0, 255):
        cases.append(
            RescaleCase("zero points", everything8, "i8", "i8", m, s, -7, output_zp, output_unsigned=True)
        )
    values16 = random_inputs(rng, "i16", VALUES_PER_CASE)
    for zp in (0, 32768):
        cases.append(RescaleCase("zero points", values16, "i16", "i16", m, s, zp, 0, input_unsigned=True))
        cases.append(RescaleCase("zero points", values16, "i16", "i16", m, s, 0, zp, output_unsigned=True))
    return cases


def per_channel_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """One (multiplier, shift) per last-dimension channel, scales spread over 2**-40 .. 2**4."""
    cases = []
    for channels, input_type, output_type in (
        (1, "i8", "i8"),
        (3, "i32", "i8"),
        (16, "i32", "i16"),
        (61, "i16", "i8"),
    ):
        for rounding in TosaRounding:
            scales = 2.0 ** rng.uniform(-40, 4 if input_type != "i32" else -2, channels)
            multiplier, shift = compute_multiplier_and_shift(scales)
            input_zp = -3 if input_type == "i8" else 0
            rows = VALUES_PER_CASE // channels
            values = random_inputs(rng, input_type, rows * channels, value_limit(shift, input_zp))
            cases.append(
                RescaleCase(
                    "per channel",
                    values.reshape(rows, channels),
                    input_type,
                    output_type,
                    [int(v) for v in multiplier],
                    [int(v) for v in shift],
                    input_zp,
                    9 if output_type == "i8" else 0,
                    rounding=rounding,
                    per_channel=True,
                )
            )
    return cases


def scale16_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """scale32 = false: 16-bit multipliers, i8 / i16 / i48 inputs (48-bit accumulators of EXT-INT16)."""
    cases = []
    for input_type, output_type, high in (
        ("i8", "i8", 6),
        ("i16", "i16", 2),
        ("i16", "i32", 8),
        ("i48", "i32", -17),
        ("i48", "i16", -30),
    ):
        scale = scale_of(rng, -40, high)
        multiplier, shift = compute_multiplier_and_shift(scale, scale_width=16)
        count = VALUES_PER_CASE if input_type != "i48" else 512
        if input_type == "i48":  # |v * m| >> s must stay int32: keep |v| below 2**(31 + s) / m
            limit = min(2**47, (2 ** (30 + int(shift))) // max(int(multiplier), 1))
            values = rng.integers(-limit, limit, count, dtype=np.int64)
            values[:2] = [-limit, limit - 1]
        else:
            values = random_inputs(rng, input_type, count)
        cases.append(
            RescaleCase(
                "scale16",
                values,
                input_type,
                output_type,
                [int(multiplier)],
                [int(shift)],
                -20 if input_type == "i8" else 0,
                20 if output_type == "i8" else 0,
                scale32=False,
            )
        )
    return cases


def unsigned_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """input_unsigned / output_unsigned on i8 and i16: u8 <-> i8 re-centring and unsigned gains."""
    cases = []
    for input_type, output_type, input_unsigned in (
        ("i8", "i8", True),
        ("i8", "i16", True),
        ("i16", "i8", True),
        ("i8", "i8", False),
        ("i16", "i16", False),
        ("i16", "i8", False),
    ):
        for rounding in TosaRounding:
            scale = scale_of(rng, -12, 3)
            multiplier, shift = compute_multiplier_and_shift(scale)
            if input_unsigned:  # u8 / u16 in (zero point 128 / 32768), signed out
                input_zp = 128 if input_type == "i8" else 32768
                output_zp = -1 if output_type == "i8" else 0
            else:  # signed in, u8 / u16 out (zero point 200 / 32768)
                input_zp = -100 if input_type == "i8" else 0
                output_zp = 200 if output_type == "i8" else 32768
            values = random_inputs(rng, input_type, VALUES_PER_CASE)
            cases.append(
                RescaleCase(
                    "unsigned",
                    values,
                    input_type,
                    output_type,
                    [int(multiplier)],
                    [int(shift)],
                    input_zp,
                    output_zp,
                    rounding=rounding,
                    input_unsigned=input_unsigned,
                    output_unsigned=not input_unsigned,
                )
            )
    return cases


def refused_cases(rng: np.random.Generator) -> list[RescaleCase]:
    """Inputs the spec gives no result for: ERROR_IF (invalid graph) and REQUIRE (unpredictable)."""
    x8 = random_inputs(rng, "i8", 64)
    x16 = random_inputs(rng, "i16", 64)
    x32 = random_inputs(rng, "i32", 64)
    one = [1 << 30], [30]
    return [
        RescaleCase("refused", x8, "i8", "i8", [1 << 30], [63]),  # shift above 62
        RescaleCase("refused", x8, "i8", "i8", [1 << 30], [1]),  # shift below 2
        RescaleCase("refused", x8, "i8", "i8", [-5], [30]),  # negative multiplier
        RescaleCase("refused", x8, "i8", "i8", [1 << 30], [3]),  # |x| >= 2**(shift-1)
        RescaleCase("refused", x32, "i32", "i32", *one),  # |x| >= 2**29 with shift 30
        RescaleCase("refused", x32, "i32", "i32", [2**31 - 1], [2]),  # result beyond int32
        RescaleCase("refused", x16, "i16", "i16", *one, input_zp=1),  # zero point on signed i16
        RescaleCase(
            "refused", x16, "i16", "i16", *one, input_zp=5, input_unsigned=True
        ),  # u16 zp not 0/32768
        RescaleCase(
            "refused", x16, "i16", "i16", [1 << 14], [14], scale32=False, rounding=TosaRounding.DOUBLE
        ),
        RescaleCase("refused", x8, "i8", "i8", *one, input_unsigned=True, output_unsigned=True),
        RescaleCase("refused", x8, "i8", "i32", *one, input_unsigned=True),
        RescaleCase("refused", x32[:8], "i32", "i8", [1 << 30], [40], output_unsigned=True),
    ]


FAMILIES: dict[str, Callable[[np.random.Generator], list[RescaleCase]]] = {
    "random": random_cases,
    "ties": tie_cases,
    "gain": gain_cases,
    "tiny": tiny_cases,
    "renormalised": renormalised_cases,
    "zero points": zero_point_cases,
    "per channel": per_channel_cases,
    "scale16": scale16_cases,
    "unsigned": unsigned_cases,
    "refused": refused_cases,
}


@dataclass
class EngineRun:
    """Every RESCALE case and what the reference model said about it."""

    cases: list[RescaleCase]
    statuses: list[str] = field(default_factory=list)
    outputs: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def rescale_run() -> EngineRun:
    require_tosa_python()
    from qconvert.backends.tosa import ReferenceJob, run_reference_jobs

    rng = np.random.default_rng(19)
    cases = [case for make in FAMILIES.values() for case in make(rng)]
    results = run_reference_jobs([ReferenceJob(inputs=case.inputs(), mlir=case.mlir()) for case in cases])
    return EngineRun(
        cases,
        [r.status for r in results],
        [r.outputs for r in results],
        [r.messages for r in results],
    )


def engine_verdict(status: str) -> str:
    """The reference model's status in our terms (tosa-opt's verifier refuses some ERROR_IF graphs first)."""
    return {
        "TOSA_VALID": "VALID",
        "TOSA_ERROR": "ERROR_IF",
        "SERIALIZE_FAILED": "ERROR_IF",
        "RUN_FAILED": "ERROR_IF",
        "TOSA_UNPREDICTABLE": "REQUIRE",
    }[status]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rescale_is_bit_exact_with_the_reference_model(rescale_run: EngineRun, family: str) -> None:
    compared = 0
    for case, status, outputs, messages in zip(
        rescale_run.cases, rescale_run.statuses, rescale_run.outputs, rescale_run.messages, strict=True
    ):
        if case.family != family:
            continue
        verdict, ours = case.emulate()
        label = f"{family}: {case.input_type}->{case.output_type} m={case.multiplier[:3]} s={case.shift[:3]}"
        assert verdict == engine_verdict(status), (
            f"{label}: we say {verdict}, the model {status}:\n{messages}"
        )
        if verdict != "VALID":
            continue
        assert ours is not None
        (theirs,) = outputs
        assert theirs.dtype == ours.dtype and theirs.shape == ours.shape, label
        mismatch = np.flatnonzero(theirs.reshape(-1) != ours.reshape(-1))
        first = mismatch[0] if mismatch.size else 0
        assert mismatch.size == 0, (
            f"{label}: {mismatch.size} of {ours.size} differ, first at {case.values.reshape(-1)[first]}: "
            f"ours {ours.reshape(-1)[first]}, the model's {theirs.reshape(-1)[first]}"
        )
        compared += ours.size
    if family == "refused":
        assert all(case.emulate()[0] != "VALID" for case in rescale_run.cases if case.family == "refused")
    else:
        assert compared > 0, f"no {family} case ran"


def test_more_than_100000_rescale_values_agree(rescale_run: EngineRun) -> None:
    agreed = 0
    for case, outputs in zip(rescale_run.cases, rescale_run.outputs, strict=True):
        verdict, ours = case.emulate()
        if verdict == "VALID" and np.array_equal(outputs[0], ours):
            agreed += ours.size
    assert agreed >= 100_000, agreed


def test_the_families_reach_their_edges(rescale_run: EngineRun) -> None:
    """The generated cases do hit what they are named for (so the comparisons above are not vacuous)."""
    by_family: dict[str, list[tuple[RescaleCase, np.ndarray]]] = {}
    for case in rescale_run.cases:
        verdict, ours = case.emulate()
        if verdict == "VALID":
            assert ours is not None
            by_family.setdefault(case.family, []).append((case, ours))
    gain_outputs = np.concatenate(
        [o.reshape(-1).astype(np.int64) for c, o in by_family["gain"] if c.output_type == "i8"]
    )
    assert gain_outputs.min() == -128 and gain_outputs.max() == 127, "no saturation at both ends"
    assert max(c.shift[0] for c, _ in by_family["tiny"]) == 62 and any(
        c.multiplier[0] == 0 for c, _ in by_family["tiny"]
    )
    assert any(c.multiplier[0] not in (0, 1 << 30) and c.shift[0] == 62 for c, _ in by_family["tiny"])
    single = [o for c, o in by_family["ties"] if c.rounding == TosaRounding.SINGLE and c.shift[0] > 31]
    double = [o for c, o in by_family["ties"] if c.rounding == TosaRounding.DOUBLE and c.shift[0] > 31]
    assert any(not np.array_equal(a, b) for a, b in zip(single, double, strict=True)), "DOUBLE never differed"


def table_graph(shape: tuple[int, ...], lookup: np.ndarray) -> str:
    in_t = "i8" if lookup.size == 256 else "i16"
    out_t = "i8" if lookup.size == 256 else "i32"
    dims = "x".join(str(d) for d in shape)
    table_t = f"tensor<{lookup.size}x{in_t}>"
    return (
        f"func.func @main(%x: tensor<{dims}x{in_t}>) -> tensor<{dims}x{out_t}> {{\n"
        f"  %t = {dense(lookup, table_t)}\n"
        f'  %y = "tosa.table"(%x, %t) : (tensor<{dims}x{in_t}>, {table_t}) -> tensor<{dims}x{out_t}>\n'
        f"  return %y : tensor<{dims}x{out_t}>\n}}"
    )


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def smooth_i16_table(rng: np.random.Generator) -> np.ndarray:
    """A random i16 table whose slopes all fit int16 (a random walk with steps below 2**15)."""
    steps = rng.integers(-(2**12), 2**12, 512)
    return np.clip(np.concatenate([[rng.integers(-1000, 1000)], steps]).cumsum(), -32768, 32767).astype(
        np.int16
    )


def test_table_is_bit_exact_with_the_reference_model() -> None:
    """Every int8 and every int16 input, through random tables and tables built from float functions;
    a table with a slope beyond int16 is UNPREDICTABLE on both sides."""
    require_tosa_python()
    from qconvert.backends.tosa import ReferenceJob, run_reference_jobs

    rng = np.random.default_rng(191)
    every8 = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    every16 = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16).reshape(256, 256)
    tables = [
        rng.integers(-128, 128, 256).astype(np.int8),
        build_table_i8(sigmoid, 0.05, -10, 1 / 256, -128),
        build_table_i8(np.tanh, 0.03, 5, 1 / 128, 0),
        smooth_i16_table(rng),
        build_table_i16(sigmoid, 8 / 32768, 0, 1 / 32768, 0),
        build_table_i16(np.tanh, 4 / 32768, 0, 1 / 32768, 0),
        build_table_i16(np.exp, 10 / 65536, 32767, 1 / 32768, -32768, midpoint_correction=False),
    ]
    steep = np.zeros(513, np.int16)
    steep[300] = 32767
    steep[301] = -32768
    jobs = [
        ReferenceJob(
            inputs=(every8 if t.size == 256 else every16,),
            mlir=table_graph(every8.shape if t.size == 256 else every16.shape, t),
        )
        for t in [*tables, steep]
    ]
    results = run_reference_jobs(jobs)
    for lookup, job, result in zip(tables, jobs[:-1], results[:-1], strict=True):
        assert result.status == "TOSA_VALID", result.messages
        ours = table(job.inputs[0], lookup)
        assert ours.dtype == result.outputs[0].dtype
        assert np.array_equal(ours, result.outputs[0])
    assert results[-1].status == "TOSA_UNPREDICTABLE"
    with pytest.raises(TosaUnpredictable):
        table(every16, steep)


def test_built_tables_follow_their_function() -> None:
    """The i8 table is Q(f(DQ(x))) exactly; the interpolated i16 table stays within 2 steps (in 1/128
    units: 256) of Q(f(DQ(x))), and the midpoint correction never makes the worst error larger."""
    every8 = np.arange(-128, 128, dtype=np.int8)
    lookup8 = build_table_i8(sigmoid, 0.05, -10, 1 / 256, -128)
    expected8 = np.clip(np.rint(sigmoid((every8.astype(np.float64) + 10) * 0.05) * 256) - 128, -128, 127)
    assert np.array_equal(table(every8, lookup8), expected8.astype(np.int8))

    every16 = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16)
    exact = np.tanh(every16.astype(np.float64) * 4 / 32768) * 32768 * 128
    errors = {}
    for correction in (True, False):
        lookup = build_table_i16(np.tanh, 4 / 32768, 0, 1 / 32768, 0, midpoint_correction=correction)
        errors[correction] = np.abs(
            table(every16, lookup).astype(np.float64) - np.clip(exact, -(2**22), 2**22 - 128)
        )
    assert errors[True].max() <= 256
    assert errors[True].max() <= errors[False].max()


def average_pool_graph(
    shape: tuple[int, int, int, int], kernel: int, pad: int, input_zp: int, output_zp: int
) -> str:
    n, h, w, c = shape
    out_h, out_w = h + 2 * pad - kernel + 1, w + 2 * pad - kernel + 1
    in_t, out_t = f"tensor<{n}x{h}x{w}x{c}xi8>", f"tensor<{n}x{out_h}x{out_w}x{c}xi8>"
    return (
        f"func.func @main(%x: {in_t}) -> {out_t} {{\n"
        f"  %iz = {dense([input_zp], 'tensor<1xi8>')}\n"
        f"  %oz = {dense([output_zp], 'tensor<1xi8>')}\n"
        f'  %y = "tosa.avg_pool2d"(%x, %iz, %oz) <{{acc_type = i32, kernel = array<i64: {kernel}, {kernel}>, '
        f"pad = array<i64: {pad}, {pad}, {pad}, {pad}>, stride = array<i64: 1, 1>}}> : "
        f"({in_t}, tensor<1xi8>, tensor<1xi8>) -> {out_t}\n"
        f"  return %y : {out_t}\n}}"
    )


def window_sums(x: np.ndarray, kernel: int, pad: int, input_zp: int) -> tuple[np.ndarray, np.ndarray]:
    """Sums of `x - zp` and element counts of every stride-1 window; padding adds nothing and counts 0."""
    shifted = np.pad(x.astype(np.int64) - input_zp, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    inside = np.pad(np.ones(x.shape[1:3], np.int64), pad)
    out_h, out_w = shifted.shape[1] - kernel + 1, shifted.shape[2] - kernel + 1
    sums = np.zeros((x.shape[0], out_h, out_w, x.shape[3]), np.int64)
    counts = np.zeros((out_h, out_w), np.int64)
    for dy in range(kernel):
        for dx in range(kernel):
            sums += shifted[:, dy : dy + out_h, dx : dx + out_w, :]
            counts += inside[dy : dy + out_h, dx : dx + out_w]
    return sums, counts[None, :, :, None]


def test_average_pool_reciprocal_scale_is_bit_exact_with_the_reference_model() -> None:
    """AVG_POOL2D's division by the window count (reciprocal_scale, counts 1..81 with padding)."""
    require_tosa_python()
    from qconvert.backends.tosa import ReferenceJob, run_reference_jobs

    rng = np.random.default_rng(1919)
    shape = (2, 12, 12, 8)
    cases = [
        (kernel, pad, int(rng.integers(-128, 128)), int(rng.integers(-128, 128)))
        for kernel, pad in ((1, 0), (2, 1), (3, 1), (5, 2), (7, 3), (9, 4))
    ]
    inputs = [rng.integers(-128, 128, shape).astype(np.int8) for _ in cases]
    results = run_reference_jobs(
        [
            ReferenceJob(inputs=(x,), mlir=average_pool_graph(shape, *case))
            for x, case in zip(inputs, cases, strict=True)
        ]
    )
    seen_counts: set[int] = set()
    for x, (kernel, pad, input_zp, output_zp), result in zip(inputs, cases, results, strict=True):
        assert result.status == "TOSA_VALID", result.messages
        sums, counts = window_sums(x, kernel, pad, input_zp)
        ours = average_pool_output(sums, np.broadcast_to(counts, sums.shape), output_zp, "i8")
        assert np.array_equal(ours, result.outputs[0]), f"kernel {kernel} pad {pad}"
        seen_counts.update(int(c) for c in np.unique(counts))
    assert {1, 81, 25, 15}.issubset(seen_counts)


def test_worked_vectors_of_the_reference() -> None:
    """Appendix A.3 and section 4.4 of the quantization reference (no engine needed)."""
    assert [
        tuple(map(int, compute_multiplier_and_shift(s)))
        for s in (1.0, 0.5, 3.0, 1e-3, 2.0**20, 2.0**-40, 1e-20)
    ] == [(2**30, 30), (2**30, 31), (1610612736, 29), (1099511628, 40), (2**30, 10), (2**22, 62), (0, 62)]
    assert tuple(map(int, compute_multiplier_and_shift(0.0009999999403953565))) == (1099511562, 40)
    ties = rescale(np.array([5, -3, -1], np.int32), 1 << 30, 31, output_type="i32")
    assert ties.tolist() == [3, -1, 0]
    quarter = np.array([-6, 6, -2], np.int32)
    assert rescale(quarter, 1 << 30, 32, output_type="i32").tolist() == [-1, 2, 0]
    assert rescale(quarter, 1 << 30, 32, output_type="i32", rounding=TosaRounding.DOUBLE).tolist() == [
        -2,
        2,
        -1,
    ]
    assert [tuple(map(int, reciprocal_scale(n))) for n in (1, 2, 3)] == [
        (2**30 + 1, 30),
        (2**30 + 1, 31),
        (1431655766, 32),
    ]
    with pytest.raises(ValueError, match="too large"):
        compute_multiplier_and_shift(2.0**29)
    with pytest.raises(ValueError, match="non-negative"):
        compute_multiplier_and_shift(-1.0)


@pytest.mark.parametrize("width", [32, 16])
def test_multiplier_and_shift_are_the_nearest_normalised_pair(width: int) -> None:
    """No engine here exposes MLIR's computeMultiplierAndShift, so its definition is checked directly on
    100,000 scales from 2**-75 to just below the largest representable: the multiplier is normalised
    (2**(w-2) <= m < 2**(w-1)) and the nearest, ties away from zero (|m - scale * 2**s| <= 1/2, exact in
    float64), until the shift reaches 62; from there it is the normalised one shifted right."""
    rng = np.random.default_rng(4)
    top_exponent = 28 if width == 32 else 12
    scales = 2.0 ** rng.uniform(-75, top_exponent, 100_000)
    scales[:4] = [
        (1 - 2.0 ** -(width + 1)) * 0.5,
        0.75 + 2.0 ** -(width + 1),
        2.0**-62,
        2.0 ** (top_exponent + 0.99),
    ]
    multiplier, shift = compute_multiplier_and_shift(scales, scale_width=width)
    m, s = multiplier.astype(np.int64), shift.astype(np.int64)
    assert np.all((s >= 2) & (s <= 62))
    free = s < 62
    assert np.all((m[free] >= 1 << (width - 2)) & (m[free] < 1 << (width - 1)))
    error = np.abs(m[free] - np.ldexp(scales[free], s[free].astype(np.int32)))
    assert error.max() <= 0.5
    # scales[0]'s mantissa rounds up to 2**(w-1): renormalised to 2**(w-2), one shift less
    assert int(multiplier[0]) == 1 << (width - 2) and int(shift[0]) == width - 1
    clamped = ~free
    assert clamped.sum() > 1000
    mantissa, exponent = np.frexp(scales[clamped])
    unclamped_shift = (width - 1) - exponent.astype(np.int64)
    normalised = np.floor(mantissa * 2.0 ** (width - 1) + 0.5).astype(np.int64)
    normalised = np.where(normalised == 1 << (width - 1), 1 << (width - 2), normalised)
    unclamped_shift = np.where(np.floor(mantissa * 2.0 ** (width - 1) + 0.5) == 2.0 ** (width - 1),
                               unclamped_shift - 1, unclamped_shift)  # fmt: skip
    assert np.array_equal(m[clamped], normalised >> np.minimum(31, unclamped_shift - 62))

"""The TOSA backend's options and engine names: their own module, so that the converter and the check runner
read them without importing the backend object, which imports both.
"""

from __future__ import annotations

from dataclasses import dataclass

from qconvert.numerics.tosa import TosaRounding
from qconvert.options import CHOICES, check_choice, flag, option, option_fields

ENGINE_NAMES = ("reference", "iree")


@dataclass(frozen=True, kw_only=True)
class TosaOptions:
    """`--rounding`, `--allow-float`, `--float-boundary`, `--backend-option integer_softmax=true`,
    `constant_sum_tables=true`."""

    rounding: str = option(
        TosaRounding.SINGLE.value,
        "tosa.rescale rounding (double needs TOSA's doubleround extension)",
        [r.value for r in TosaRounding],
    )
    allow_float: bool = option(False, "keep what cannot be integer as float TOSA ops (PRO-FP)")
    float_boundary: bool = option(False, "float inputs and outputs, quantized at the edges (PRO-FP)")
    integer_softmax: bool = option(
        True, "8-bit Softmax as integer TOSA (exp tables, i32 sum, intdiv); false: a float island"
    )
    constant_sum_tables: bool = option(
        True, "an i8 add / sub of a splat constant as a tosa.table of onnxruntime's float32 result"
    )

    def __post_init__(self) -> None:
        check_choice(
            flag("rounding"), self.rounding, option_fields(TosaOptions)["rounding"].metadata[CHOICES]
        )

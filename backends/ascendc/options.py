"""The ascendc backend's options (`--product`, `--round-mode`): their own module, so that the call-graph
builder and the check runner read them without importing the backend object.
"""

from __future__ import annotations

from dataclasses import dataclass

from qconvert.errors import InputError
from qconvert.options import check_choice, option

from .products import DEFAULT_PRODUCT, PRODUCTS

ROUND_MODES = ("rint", "round", "floor", "ceil", "trunc", "hybrid")


@dataclass(frozen=True, kw_only=True)
class AscendcOptions:
    """`--product`, `--round-mode`."""

    product: str = option(
        DEFAULT_PRODUCT, "the Ascend part whose quantization APIs the kernels call", PRODUCTS
    )
    round_mode: str = option(
        "rint", "the final cast's RoundMode (CAST_RINT ...; only the 950 parts take another)", ROUND_MODES
    )

    def __post_init__(self) -> None:
        check_choice("--product", self.product, PRODUCTS)
        check_choice("--round-mode", self.round_mode, ROUND_MODES)
        product = PRODUCTS[self.product]
        if self.round_mode not in product.round_modes:
            takers = [p.name for p in PRODUCTS.values() if self.round_mode in p.round_modes]
            raise InputError(
                f"--round-mode {self.round_mode}: {product.title}'s AscendQuant casts with CAST_NONE "
                f"(round half to even) only; a product that takes it: {', '.join(takers)}"
            )

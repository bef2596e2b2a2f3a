"""The product matrix of the AscendC quantization APIs (CANN asc-devkit, reference section 5.1): which Ascend
part runs which API, mode and destination type, and what a refusal names.

A site the chosen product cannot run is refused with the node, the rule and the products that would take
it (`refusal`); every rule lives in `PRODUCTS` and `RULES` so that the README's matrix and the refusals
say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "API_ANTIQUANT",
    "API_DEQUANT",
    "API_MMAD",
    "API_QUANT",
    "DEFAULT_PRODUCT",
    "INT8_DESTINATIONS",
    "PRODUCTS",
    "Product",
    "products_taking",
    "refusal",
]

API_QUANT = "AscendQuant"
API_DEQUANT = "AscendDequant"
API_ANTIQUANT = "AscendAntiQuant"
API_MMAD = "Mmad"  # the cube unit's int8 x int8 -> int32 matmul (no quantization API of its own)

INT8_DESTINATIONS = ("int8",)
GENERIC_DESTINATIONS = ("int8", "float8_e4m3fn", "float8_e5m2", "hifloat8", "float4_e2m1")
ALL_MODES = ("PER_TENSOR", "PER_CHANNEL", "PER_TOKEN", "PER_GROUP")


@dataclass(frozen=True, slots=True)
class Product:
    """One Ascend part as the quantization APIs see it (section 5.1's columns)."""

    name: str
    title: str
    quant_modes: tuple[str, ...]  # AscendQuant modes; () = no AscendQuant at all
    quant_destinations: tuple[str, ...]  # AscendQuant dstT
    dequant: bool
    antiquant: bool
    round_modes: tuple[str, ...]  # round modes a quantization call can be given (rint: CAST_NONE / RINT)
    npu_arch: int | None  # __NPU_ARCH__ of the kernel build (the SDK sample's codes), None: not documented
    vector_cores: int  # blocks a kernel is split across (blockDim); the host may launch fewer
    ub_bytes: int  # Unified Buffer per vector core: bounds a tile


PRODUCTS: dict[str, Product] = {
    product.name: product
    for product in (
        Product(
            "atlas-350",
            "Ascend 950PR / 950DT (Atlas 350)",
            ALL_MODES,
            GENERIC_DESTINATIONS,
            dequant=True,
            antiquant=True,
            round_modes=("rint", "round", "floor", "ceil", "trunc", "hybrid"),
            npu_arch=3510,
            vector_cores=64,
            ub_bytes=256 * 1024,
        ),
        Product(
            "atlas-a3",
            "Atlas A3 training / inference series",
            ("PER_TENSOR", "PER_CHANNEL"),
            INT8_DESTINATIONS,
            dequant=True,
            antiquant=True,
            round_modes=("rint",),
            npu_arch=2201,
            vector_cores=48,
            ub_bytes=192 * 1024,
        ),
        Product(
            "atlas-a2",
            "Atlas A2 training / 800I A2 inference series",
            ("PER_TENSOR", "PER_CHANNEL"),
            INT8_DESTINATIONS,
            dequant=True,
            antiquant=True,
            round_modes=("rint",),
            npu_arch=2201,
            vector_cores=48,
            ub_bytes=192 * 1024,
        ),
        Product(
            "atlas-200i-500-a2",
            "Atlas 200I / 500 A2 inference",
            (),
            (),
            dequant=False,
            antiquant=False,
            round_modes=("rint",),
            npu_arch=None,
            vector_cores=8,
            ub_bytes=192 * 1024,
        ),
        Product(
            "atlas-inference",
            "Atlas inference series (AI Core)",
            ("PER_TENSOR", "PER_CHANNEL"),
            INT8_DESTINATIONS,
            dequant=True,
            antiquant=True,
            round_modes=("rint",),
            npu_arch=None,
            vector_cores=8,
            ub_bytes=256 * 1024,
        ),
        Product(
            "atlas-inference-vector",
            "Atlas inference series (Vector Core)",
            (),
            (),
            dequant=False,
            antiquant=False,
            round_modes=("rint",),
            npu_arch=None,
            vector_cores=8,
            ub_bytes=256 * 1024,
        ),
        Product(
            "atlas-training",
            "Atlas training series",
            ("PER_TENSOR",),
            INT8_DESTINATIONS,
            dequant=False,
            antiquant=False,
            round_modes=("rint",),
            npu_arch=None,
            vector_cores=32,
            ub_bytes=256 * 1024,
        ),
        Product(
            "kirin-x90",
            "Kirin X90 / 9030",
            ("PER_TENSOR", "PER_CHANNEL"),
            INT8_DESTINATIONS,
            dequant=True,
            antiquant=True,
            round_modes=("rint",),
            npu_arch=None,
            vector_cores=4,
            ub_bytes=192 * 1024,
        ),
    )
}
DEFAULT_PRODUCT = "atlas-a2"


def products_taking(api: str, mode: str | None = None, destination: str | None = None) -> list[str]:
    """The products that run `api` (in `mode`, to `destination` for AscendQuant), in the table's order."""
    found = []
    for product in PRODUCTS.values():
        if api == API_QUANT:
            ok = (mode is None or mode in product.quant_modes) and (
                destination is None or destination in product.quant_destinations
            )
        elif api == API_DEQUANT:
            ok = product.dequant
        elif api == API_ANTIQUANT:
            ok = product.antiquant
        else:
            ok = True
        if ok:
            found.append(product.name)
    return found


def refusal(product: Product, api: str, mode: str | None, destination: str | None) -> str | None:
    """Why `product` cannot run this call (the rule, and who would take it), or None when it can."""
    if api == API_QUANT:
        if not product.quant_modes:
            rule = f"{product.title} has no AscendQuant"
        elif mode not in product.quant_modes:
            rule = f"AscendQuant {mode} is not available on {product.title}"
        elif destination not in product.quant_destinations:
            rule = f"AscendQuant to {destination} is not available on {product.title} (dstT int8 only)"
        else:
            return None
    elif api == API_DEQUANT and not product.dequant:
        rule = f"{product.title} has no AscendDequant"
    elif api == API_ANTIQUANT and not product.antiquant:
        rule = f"{product.title} has no AscendAntiQuant"
    else:
        return None
    takers = products_taking(api, mode, destination)
    return f"{rule}; " + (
        f"a product that takes it: {', '.join(takers)}" if takers else "no product takes it"
    )

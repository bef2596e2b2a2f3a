"""Host tiling: how a kernel cuts its tensor into Unified-Buffer tiles and the tiles over cores.

Every kernel processes a flat row-major tensor of `totalLen` elements (rows of `rowLen`, the API's n,
padded): `tileLen` elements per tile, a multiple of `rowLen` where the parameters recycle per row
(PER_CHANNEL: calCount % scaleCount == 0) and of 32 elements (every src / dst length 32-byte aligned for
8-, 16- and 32-bit types); the last tile holds the rest (`tailLen`, aligned the same way). Tiles go to
`blockDim` cores in contiguous runs: core i takes `tileCount / blockDim` tiles, one more when i <
`tileCount % blockDim` (`tile_ranges`, the formula the kernels use). Sizes fit the Unified Buffer: two
buffers (double buffering) of src and dst per tile, the parameters resident for the whole loop, and the
temporary buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from qconvert.errors import InputError

from .callgraph import ALIGN_BYTES, Site
from .products import API_DEQUANT, API_MMAD, API_QUANT, Product

__all__ = ["BUFFERS", "Tiling", "tile_ranges", "tiles", "tiling_for"]

BUFFERS = 2  # double buffering: CopyIn of tile i+1 overlaps Compute of tile i
ELEMENT_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int4": 1,
}


@dataclass(frozen=True, slots=True)
class Tiling:
    """What the host passes a kernel (`tiling.json`; the kernel's QTiling struct has the integer fields)."""

    totalLen: int | None  # None: set by the host at launch (a dynamic dimension)
    rowLen: int  # elements per row: the API's n (scaleCount for PER_CHANNEL), padded
    tileLen: int
    tileCount: int | None
    tailLen: int | None
    blockDim: int | None
    paramLen: int  # scale (and offset) elements resident in UB, each
    calCount: int  # AscendDequant: the columns of a row it writes (the real channels); 0 otherwise
    tmpBytes: int  # sharedTmpBuffer bytes (our bound: the half copy of a float source)
    ubBytes: int  # what the buffers take of the Unified Buffer

    def to_json(self) -> dict[str, int | None]:
        return asdict(self)


def tiling_for(site: Site, product: Product) -> Tiling | None:
    """The tiling of `site` on `product` (None for Mmad: the cube unit's Matmul API tiles itself);
    InputError when even one row does not fit the Unified Buffer."""
    if site.api == API_MMAD:
        return None
    src = ELEMENT_BYTES[site.src_type]
    dst = ELEMENT_BYTES[site.dst_type]
    row = max(site.n, 1)
    param_len = 0
    tmp_per_element = 0
    if site.api == API_QUANT:
        param_len = 0 if site.mode == "PER_TENSOR" or site.scale is None else int(site.scale.size)
        if site.runtime_scale:
            param_len = ALIGN_BYTES // 4  # 1/s and zp read from GM (32 bytes each), written at run time
        params = 2 * param_len * 4
        tmp_per_element = 2 if site.src_type == "float32" else 0  # the API's half copy of a float source
        if site.mode == "PER_CHANNEL":
            unit = math.lcm(ALIGN_BYTES, row)
        elif site.mode in ("PER_TOKEN", "PER_GROUP"):
            # whole rows, 8 at a time: a tile's slice of the resident float scales stays 32-byte aligned;
            # PER_GROUP along the rows (kDim 0) also whole groups of rows
            rows = 8 if site.k_dim != 0 else math.lcm(8, site.group_size or 1)
            unit = math.lcm(ALIGN_BYTES, rows * row)
        else:
            unit = ALIGN_BYTES
    elif site.api == API_DEQUANT:
        param_len = row
        params = row * 4
        unit = row  # whole rows (DequantParams{m, n, calCount})
    else:
        param_len = ((site.channels or 1) if site.transpose else row) if site.mode == "PER_CHANNEL" else 0
        params = 2 * param_len * 2
        unit = (
            16 * row if site.transpose else row
        )  # transposed: 16 rows keep a tile's half params 32-byte aligned
        tmp_per_element = 2
    per_element = BUFFERS * (src + dst) + tmp_per_element
    budget = product.ub_bytes - _round_up(params, ALIGN_BYTES)
    most = (budget // per_element) // unit * unit
    if most < unit:
        raise InputError(
            f"node '{site.node}': a row of {row} elements ({unit} with alignment) does not fit "
            f"{product.title}'s {product.ub_bytes} B Unified Buffer with double buffering; the channel "
            "count cannot be padded to the alignment rules there"
        )
    total = None if site.m is None else site.m * row
    if total is None:
        tile = most
        count = tail = block = None
    else:
        tile = min(most, _round_up(total, unit))
        count = -(-total // tile)
        tail = total - (count - 1) * tile
        block = min(count, product.vector_cores)
    tmp = _round_up(tile * tmp_per_element, ALIGN_BYTES)
    used = BUFFERS * tile * (src + dst) + _round_up(params, ALIGN_BYTES) + tmp
    cal_count = (site.channels or row) if site.api == API_DEQUANT else 0
    return Tiling(total, row, tile, count, tail, block, param_len, cal_count, tmp, used)


def tile_ranges(tiling: Tiling) -> Iterator[tuple[int, int, int]]:
    """(core, first tile, tile count) for every core: the kernel's split of the tiles."""
    assert tiling.tileCount is not None and tiling.blockDim is not None
    per, extra = divmod(tiling.tileCount, tiling.blockDim)
    for core in range(tiling.blockDim):
        first = core * per + min(core, extra)
        yield core, first, per + (1 if core < extra else 0)


def tiles(tiling: Tiling) -> Iterator[tuple[int, int, int]]:
    """(core, start element, length) of every tile, in the order the cores run them."""
    assert tiling.tileCount is not None and tiling.tailLen is not None
    for core, first, count in tile_ranges(tiling):
        for index in range(first, first + count):
            length = tiling.tailLen if index == tiling.tileCount - 1 else tiling.tileLen
            yield core, index * tiling.tileLen, length


def coverage(tiling: Tiling) -> np.ndarray:
    """How many times each element of the tensor is in a tile (every entry 1 when the tiling is right)."""
    assert tiling.totalLen is not None
    counts = np.zeros(tiling.totalLen, np.int64)
    for _, start, length in tiles(tiling):
        counts[start : start + length] += 1
    return counts


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple

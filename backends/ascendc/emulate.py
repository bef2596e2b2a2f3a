"""A site of the call graph run on the emulator of its API (qconvert/numerics/ascendc.py), on the whole
tensor or tile by tile exactly as its kernel cuts it (tiling.py): the data laid out as the kernel's GM
buffer (rows padded to the API's n), each tile given to the API call with the kernel's counts, the padding
dropped on the way out. No rounding rule is written here: every number comes from the numerics module.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from qconvert.ir.types import DYNAMIC
from qconvert.numerics.ascendc import (
    AscendQuantMode,
    ascend_antiquant,
    ascend_dequant,
    ascend_quant,
    quant_parameters_from_onnx,
)
from qconvert.numerics.onnxruntime_kernels import dynamic_quantize_parameters_onnxruntime

from .callgraph import ALIGN_BYTES, Site
from .products import API_ANTIQUANT, API_DEQUANT, API_QUANT
from .tiling import Tiling, tiles

__all__ = ["emulate_site", "gm_layout"]

UINT8_SHIFT = 128


def gm_layout(site: Site, array: np.ndarray) -> np.ndarray:
    """The site's source as the kernel's GM buffer: flat, rows padded to the API's n with zeros."""
    values = np.asarray(array)
    columns, row = _row(site, values.shape)
    if _flat(site):
        flat = values.reshape(-1)
        return np.pad(flat, (0, row - flat.size)) if row > flat.size else flat
    matrix = values.reshape(-1, columns)
    return np.pad(matrix, ((0, 0), (0, row - columns))).reshape(-1) if row > columns else matrix.reshape(-1)


def _row(site: Site, shape: tuple[int, ...]) -> tuple[int, int]:
    """(the real elements of a row, the row as the kernel lays it out) for a source of `shape`: the site's
    own n where its shape is static, else the same padding rule on the actual shape."""
    static = DYNAMIC not in site.shape
    if _flat(site):
        total = math.prod(shape)
        return total, _round_up(total, ALIGN_BYTES)
    if site.api == API_QUANT:
        if site.mode == "PER_CHANNEL" and site.channels:
            return site.channels, site.n
        total = math.prod(shape)
        return total, site.n if static else _round_up(total, ALIGN_BYTES)
    if site.api == API_DEQUANT:
        return site.channels or site.n, site.n
    if site.columns is not None:
        return site.columns, site.n
    columns = math.prod(shape[1:]) if len(shape) > 1 else max(math.prod(shape), 1)
    return columns, site.n if static else _round_up(columns, ALIGN_BYTES)


def _flat(site: Site) -> bool:
    """One scale for every element: the source is laid out flat, its tail padded to 32 elements."""
    return site.mode == "PER_TENSOR" and site.api in (API_QUANT, API_ANTIQUANT)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _from_layout(site: Site, flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    size = math.prod(shape)
    if _flat(site):
        return flat[:size].reshape(shape)
    columns, row = _row(site, shape)
    return flat.reshape(-1, row)[:, :columns].reshape(shape)


def emulate_site(
    site: Site, array: np.ndarray, tiling: Tiling | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The site's result on `array` (ONNX's storage type and shape back), and any run-time parameters
    (DynamicQuantizeLinear's scale and zero point). `tiling`: run tile by tile as the kernel does."""
    shape = tuple(np.asarray(array).shape)
    extra: dict[str, np.ndarray] = {}
    scale, offset = site.scale, site.offset
    if site.runtime_scale:
        onnx_scale, zero_point = dynamic_quantize_parameters_onnxruntime(array)
        scale, offset = quant_parameters_from_onnx(onnx_scale, zero_point - UINT8_SHIFT, src_dtype=np.float32)
        extra = {"scale": np.array(onnx_scale, np.float32), "zero_point": np.array(zero_point, np.uint8)}
    source = np.asarray(array)
    if site.api == API_ANTIQUANT and site.storage_shift:
        source = (source.astype(np.int16) + site.storage_shift).astype(np.int8)  # uint8 codes read as int8
    if site.api == API_QUANT and site.mode == "PER_TOKEN" and tiling is not None:
        flat = source.reshape(-1)
        parts = np.zeros(flat.size, dtype=_dst_dtype(site))
        rows = np.arange(flat.size // site.n)
        for _, start, length in tiles(tiling):  # each tile's rows with its slice of the per-row scales
            first, count = start // site.n, length // site.n
            chunk = flat[start : start + length].reshape(count, site.n)
            kept = rows[first : first + count]
            parts[start : start + length] = _per_token(site, chunk, scale, offset, kept).reshape(-1)
        result = parts.reshape(shape)
    elif site.api == API_QUANT and site.mode == "PER_TOKEN":
        result = _per_token(site, source, scale, offset)
    elif site.api == API_QUANT and site.mode == "PER_GROUP":
        result = _call(site, source, scale, offset, 0, source.size).reshape(shape)
    else:
        flat = gm_layout(site, source)
        if tiling is None:
            out = _call(site, flat, scale, offset, 0, flat.size)
        else:
            parts = np.zeros(flat.size, dtype=_dst_dtype(site))
            for _, start, length in tiles(tiling):
                parts[start : start + length] = _call(
                    site, flat[start : start + length], scale, offset, start, length
                ).reshape(-1)
            out = parts
        result = _from_layout(site, out.reshape(-1), shape)
    if site.api == API_QUANT and site.storage_shift:
        result = (result.astype(np.int16) + site.storage_shift).astype(np.uint8)
    if site.api in (API_ANTIQUANT, API_DEQUANT):
        result = result.astype(np.float32)
    return result, extra


_DESTINATIONS = {
    "int8": np.int8,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def _dst_dtype(site: Site) -> np.dtype:
    if site.api == API_QUANT:
        return np.dtype(_DESTINATIONS[site.dst_type])
    if site.api == API_ANTIQUANT:
        return np.dtype(ml_dtypes.bfloat16 if site.dst_type == "bfloat16" else np.float16)
    return np.dtype(np.float32)


def _call(
    site: Site, flat: np.ndarray, scale: np.ndarray | None, offset: np.ndarray | None, start: int, length: int
) -> np.ndarray:
    """One API call on `length` elements of the GM layout starting at `start` (whole rows where rows
    matter): the counts the kernel passes."""
    assert scale is not None
    if site.api == API_QUANT:
        destination = {
            "int8": np.int8,
            "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "float8_e5m2": ml_dtypes.float8_e5m2,
        }[site.dst_type]
        mode = AscendQuantMode[site.mode or "PER_TENSOR"]
        if mode is AscendQuantMode.PER_GROUP:
            return ascend_quant(
                flat.reshape(site.m or -1, site.n),
                scale,
                offset,
                mode=mode,
                dst_dtype=destination,
                round_mode=site.round_mode,
                group_size=site.group_size,
                axis=site.k_dim if site.k_dim is not None else 1,
            )
        return ascend_quant(
            flat,
            scale,
            offset if offset is not None else 0.0,
            mode=mode,
            dst_dtype=destination,
            round_mode=site.round_mode,
            src_dtype=np.dtype(site.src_type),
        )
    if site.api == API_DEQUANT:
        rows = flat.reshape(-1, site.n)
        columns = site.channels or site.n
        mode = AscendQuantMode.PER_CHANNEL if np.asarray(scale).size > 1 else AscendQuantMode.PER_TENSOR
        found = ascend_dequant(
            rows,
            scale if np.asarray(scale).size > 1 else float(np.asarray(scale).reshape(-1)[0]),
            mode=mode,
            cal_count=columns,
        )
        return np.pad(found, ((0, 0), (0, site.n - columns))).reshape(-1)
    mode = AscendQuantMode[site.mode or "PER_TENSOR"]
    rows = flat.reshape(1, -1) if mode is AscendQuantMode.PER_TENSOR else flat.reshape(-1, site.n)
    if mode is AscendQuantMode.PER_CHANNEL and site.transpose:
        first = start // site.n
        count = length // site.n
        scale = np.asarray(scale).reshape(-1)[first : first + count].reshape(-1, 1)
        offset = np.asarray(offset).reshape(-1)[first : first + count].reshape(-1, 1)
    elif mode is AscendQuantMode.PER_CHANNEL:
        scale = np.asarray(scale).reshape(1, -1)
        offset = np.asarray(offset).reshape(1, -1)
    return ascend_antiquant(
        rows, scale, offset, mode=mode, dst_dtype=_dst_dtype(site), is_transpose=site.transpose
    ).reshape(-1)


def _per_token(
    site: Site,
    source: np.ndarray,
    scale: np.ndarray | None,
    offset: np.ndarray | None,
    rows_of: np.ndarray | None = None,
) -> np.ndarray:
    """Per-axis quantization on a non-last axis as PER_TOKEN: rows of the trailing elements, each row's
    scale that of its channel (row r is channel r mod C)."""
    assert scale is not None and site.channels is not None
    rows = source.reshape(-1, site.n)
    scales = np.asarray(scale).reshape(-1)
    offsets = np.broadcast_to(np.asarray(offset).reshape(-1), scales.shape)
    index = np.arange(rows.shape[0]) if rows_of is None else rows_of  # which rows of the tensor these are
    channel = index % scales.size  # the site's per-row table (or per channel: r mod C)
    row_scale = scales[channel].reshape(-1, 1)
    row_offset = offsets[channel].reshape(-1, 1)

    destination = {
        "int8": np.int8,
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
    }[site.dst_type]
    return ascend_quant(
        rows,
        row_scale,
        row_offset,
        mode=AscendQuantMode.PER_TOKEN,
        dst_dtype=destination,
        round_mode=site.round_mode,
        src_dtype=np.dtype(site.src_type),
    ).reshape(source.shape)

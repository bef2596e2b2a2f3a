"""A model file's initializer weights located in protobuf's wire format, so they are mapped, not parsed.

NOTE: parsing a model with protobuf copies every weight twice (the file read into bytes, then into the
proto), and taking raw_data out of the proto for shape inference copies it once more: 0.08-0.09 s and
32 K page faults for a 60 MB BERT, about what onnxruntime's session takes to build. Here the file is
memory-mapped, the wire format is walked down to each main-graph initializer's raw_data field (a few
hundred fields read, never the weights themselves), and protobuf parses a copy of the model with those
fields left out. The weights stay views of the mapped file, read only by whoever uses them.

Anything this walk does not expect (groups, a graph field given twice, a tensor with two raw_data fields,
a length past the end) makes `strip_raw_data` return None, and the caller parses the file as usual: that
path also produces protobuf's own error for a file that is not a model. A tensor of more than
TENSOR_FIELDS fields (strings, unpacked numbers: one field each) is left whole, raw_data included, so that
the walk stays a few fields per tensor.

The views keep the file mapped and open (load.py's `map_file` says who may use them).
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onnx import ModelProto

# Field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_RAW_DATA = 9
# Fields read per initializer before it is left whole: a tensor with raw_data has its dims, type, name and
# location around it (one field per dim when unpacked).
TENSOR_FIELDS = 64
# Wire types (protobuf encoding): what follows a field's tag.
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


# An initializer's raw_data kept out of its proto: a view of the mapped model file, or bytes.
RawData = bytes | memoryview


class WireError(Exception):
    """The bytes are not the wire format this walk expects."""


@dataclass(frozen=True)
class Field:
    number: int
    wire_type: int
    start: int  # the tag's first byte
    value_start: int  # a length-delimited field's payload (after its length), else its value
    end: int


@dataclass
class StrippedModel:
    """The parsed model without its initializers' raw_data, and those raw_data as views of the file,
    by initializer position in `model.graph.initializer` (initializers without raw_data are absent)."""

    model: ModelProto
    raw_data: dict[int, memoryview]


def strip_raw_data(path: Path) -> StrippedModel | None:
    """The model at `path` parsed without its main graph's initializer raw_data, which stays in a
    read-only mapping of the file; None when the file is not the wire format expected (see the NOTE)."""
    with path.open("rb") as file:
        if path.stat().st_size == 0:
            return None
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    data = memoryview(mapped)
    try:
        stripped, spans = _strip_model(data)
    except WireError:
        return None
    model = ModelProto()
    model.ParseFromString(stripped)
    return StrippedModel(model, {index: data[start:end] for index, (start, end) in spans.items()})


def _strip_model(data: memoryview) -> tuple[bytes, dict[int, tuple[int, int]]]:
    graphs = [field for field in _fields(data, 0, len(data)) if field.number == MODEL_GRAPH]
    if len(graphs) != 1 or graphs[0].wire_type != LENGTH_DELIMITED:
        raise WireError("expected one graph field")
    graph = graphs[0]
    parts: list[bytes | memoryview] = []
    spans: dict[int, tuple[int, int]] = {}
    position = graph.value_start
    for index, initializer in enumerate(
        field for field in _fields(data, graph.value_start, graph.end) if field.number == GRAPH_INITIALIZER
    ):
        if initializer.wire_type != LENGTH_DELIMITED:
            raise WireError("an initializer that is not a message")
        fields = itertools.islice(_fields(data, initializer.value_start, initializer.end), TENSOR_FIELDS + 1)
        tensor_fields = list(fields)
        if len(tensor_fields) > TENSOR_FIELDS:
            continue  # left whole
        raw = [field for field in tensor_fields if field.number == TENSOR_RAW_DATA]
        if not raw:
            continue
        if len(raw) != 1 or raw[0].wire_type != LENGTH_DELIMITED:
            raise WireError("an initializer with more than one raw_data")
        spans[index] = (raw[0].value_start, raw[0].end)
        tensor = bytes(data[initializer.value_start : raw[0].start]) + bytes(
            data[raw[0].end : initializer.end]
        )
        parts += [data[position : initializer.start], _tag(GRAPH_INITIALIZER), _varint(len(tensor)), tensor]
        position = initializer.end
    parts.append(data[position : graph.end])
    graph_bytes = b"".join(parts)
    model = [
        data[: graph.start],
        _tag(MODEL_GRAPH),
        _varint(len(graph_bytes)),
        graph_bytes,
        data[graph.end :],
    ]
    return b"".join(model), spans


def _fields(data: memoryview, start: int, end: int) -> Iterator[Field]:
    """The fields of the message in data[start:end], in order."""
    position = start
    while position < end:
        tag, value_start = _read_varint(data, position, end)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            _, field_end = _read_varint(data, value_start, end)
        elif wire_type == LENGTH_DELIMITED:
            length, value_start = _read_varint(data, value_start, end)
            field_end = value_start + length
        elif wire_type in (FIXED64, FIXED32):
            field_end = value_start + (8 if wire_type == FIXED64 else 4)
        else:  # groups (deprecated, not in onnx.proto) and invalid types
            raise WireError(f"wire type {wire_type}")
        if number == 0 or field_end > end:
            raise WireError("field number 0 or a field past its message")
        yield Field(number, wire_type, position, value_start, field_end)
        position = field_end


def _read_varint(data: memoryview, position: int, end: int) -> tuple[int, int]:
    """The varint at `position` and the position after it."""
    value = shift = 0
    while position < end and shift < 64:
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            return value, position
        shift += 7
    raise WireError("a varint past its message or longer than 10 bytes")


def _varint(value: int) -> bytes:
    encoded = bytearray()
    while value >= 0x80:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def _tag(number: int) -> bytes:
    return _varint(number << 3 | LENGTH_DELIMITED)

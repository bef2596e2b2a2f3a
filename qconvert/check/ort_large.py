"""An onnxruntime session for a ModelProto of any size: over protobuf's 2 GiB limit, the large weights go
to onnxruntime beside the proto (issue 23).

`SerializeToString` refuses a message of 2 GiB or more, so a model whose weights were loaded from external
data cannot be handed to onnxruntime as bytes. Its initializers of at least `DETACH_BYTES` are passed as
OrtValues (`SessionOptions.add_external_initializers`) and the proto is serialized without them; their
raw_data is put back afterwards, so the caller's model is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import EncodeError
from onnx import ModelProto, TensorProto, helper

PROTOBUF_LIMIT = 2**31 - 1
DETACH_BYTES = 2**20  # weights this large go beside the proto (the graph itself stays small)
_LOCATION = "qconvert-ort-initializer"  # never read: onnxruntime takes these names from the OrtValues


def inference_session(model: ModelProto, options: Any, providers: list[str]) -> Any:
    """`onnxruntime.InferenceSession` of `model`, serialized whole when it fits in a protobuf message."""
    import onnxruntime as ort

    try:  # encoded once, as before (ByteSize would encode the whole model once more)
        serialized: bytes | None = model.SerializeToString()
    except EncodeError:  # past the limit (ByteSize raises it too)
        serialized = None
    if serialized is not None and len(serialized) < PROTOBUF_LIMIT:
        return ort.InferenceSession(serialized, options, providers=providers)
    del serialized
    detached: list[tuple[TensorProto, bytes, int | None]] = []
    try:
        names, values = [], []
        for tensor in model.graph.initializer:
            if tensor.data_type == TensorProto.STRING or len(tensor.raw_data) < DETACH_BYTES:
                continue
            data = tensor.raw_data
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            if dtype.itemsize * int(np.prod(tensor.dims)) != len(data):  # packed 4-bit types stay inline
                continue
            names.append(tensor.name)
            values.append(ort.OrtValue.ortvalue_from_numpy(np.frombuffer(data, dtype).reshape(tensor.dims)))
            detached.append(
                (tensor, data, tensor.data_location if tensor.HasField("data_location") else None)
            )
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
            tensor.external_data.add(key="location", value=_LOCATION)
        options.add_external_initializers(names, values)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
        session.qconvert_initializers = values  # pyright: ignore[reportAttributeAccessIssue]
        return session
    finally:
        for tensor, data, location in detached:  # the caller's model as it was
            tensor.ClearField("external_data")
            tensor.ClearField("data_location")
            if location is not None:  # onnx's loader of external data leaves DEFAULT set
                tensor.data_location = location
            tensor.raw_data = data


__all__ = ["PROTOBUF_LIMIT", "inference_session"]

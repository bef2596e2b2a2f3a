"""ONNX frontend: lifts ONNX graphs (float or QDQ) into the qconvert IR."""

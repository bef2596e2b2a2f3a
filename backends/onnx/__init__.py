"""ONNX backend: write the IR back out as an ONNX model (QDQ form: quant casts become Q/DQ nodes)."""

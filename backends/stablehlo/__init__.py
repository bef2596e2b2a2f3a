"""StableHLO backend: lower the IR to StableHLO text (quantized, integer or qdq form), run it via jaxlib."""

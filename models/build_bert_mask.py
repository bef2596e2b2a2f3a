"""Build a BERT-style encoder whose export adds a float-min attention mask, the way Hugging Face BERT does.

Offline and deterministic (seeded, single-threaded). Run from anywhere:

    .venv/bin/python models/build_bert_mask.py [--out DIR]                   # the committed sample (~0.5 MB)
    .venv/bin/python models/build_bert_mask.py --layers 6 --hidden 384 --heads 12 --seq 64 --out /tmp/x

Inputs `input_ids` i64[batch, seq] and `attention_mask` i64[batch, seq] (1 = token, 0 = padding; the batch
dimension is dynamic, the sequence length static). Outputs `last_hidden_state` f32[batch, seq, hidden] and
`sentence_embedding` f32[batch, hidden], the mask-weighted mean of the hidden states (sentence-transformers'
mean pooling).

The mask is exactly Hugging Face BERT's `get_extended_attention_mask`: `(1.0 - mask[:, None, None, :]) *
torch.finfo(torch.float32).min`, ADDED to `QK^T / sqrt(d)` before Softmax. In the TorchScript export that is
Unsqueeze, Unsqueeze, Cast, Sub, Mul(-3.4028235e38) computed once, then one Add per layer. Those tensors (the
mask after Mul, and every layer's scores + mask) hold -3.4e38 at padded positions: a calibrated range that
includes them leaves nothing for the real scores, which is how statically quantized BERT exports collapse.

Weights: BERT's initialisation (Linear and Embedding weights normal(0, 0.02), biases 0, LayerNorm 1 / 0),
then `--train-steps` Adam steps (default 300, lr 3e-3, batches of 32; about 15 s for the sample) on a
synthetic task that needs sharp attention: predict, at each real token, the id of the previous token (a
vocabulary-wide classifier head, discarded at export; padding and position 0 get no loss). The sample reaches
~1.0 accuracy. Padding positions carry id 0, which never occurs as a real token. Untrained BERT-init scores
are all close to 0 (uniform attention, so a collapsed quantized mask changes little); trained, attention is
sharp and the hidden states depend on it, as in a real BERT. `--train-steps 0` keeps the initial weights.

Data: `calibration_data()` and `evaluation_data()` below are numpy-only generators (no torch import), usable
as `module:function` data sources; every batch mixes full-length and padded rows (lengths uniform in
[seq/4, seq], at least one row padded), and the evaluation set uses a different seed (held out).

Writes DIR/bert_mask.onnx (float) and bert_mask.inputs.npz (one padded evaluation batch of 4).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 0
STEM = "bert_mask"
OPSET = 17
INPUT_NAMES = ["input_ids", "attention_mask"]
OUTPUT_NAMES = ["last_hidden_state", "sentence_embedding"]
PAD_ID = 0
TRAIN_BATCH = 32
LEARNING_RATE = 3e-3


@dataclass(frozen=True)
class EncoderConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    seq: int = 32
    vocab: int = 128
    ffn: int = 0  # 0: 4 x hidden
    train_steps: int = 300
    mask_value: float | None = None  # None: torch.finfo(torch.float32).min (Hugging Face); e.g. -10000.0

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden


SAMPLE = EncoderConfig()  # the committed model


# ----------------------------------------------------------------------------------------------------------
# Data (numpy only, so that `module:function` data sources do not pull torch into the calibrating process)


def random_batch(rng: np.random.Generator, batch: int, seq: int, vocab: int) -> dict[str, np.ndarray]:
    """Random ids in [1, vocab), padded at the end with PAD_ID; row lengths uniform in [seq/4, seq].

    At least one row of every batch is padded and, for batches of 2 or more, one row is full length, so
    every batch has both a padded and an unpadded sequence.
    """
    lengths = rng.integers(max(1, seq // 4), seq + 1, size=batch)
    lengths[0] = min(lengths[0], seq - 1)
    if batch > 1:
        lengths[1] = seq
    ids = rng.integers(1, vocab, size=(batch, seq), dtype=np.int64)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids[mask == 0] = PAD_ID
    return {"input_ids": ids, "attention_mask": mask}


def batches(
    seed: int, count: int, batch: int = 4, config: EncoderConfig = SAMPLE
) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [random_batch(rng, batch, config.seq, config.vocab) for _ in range(count)]


def calibration_data() -> Iterator[dict[str, np.ndarray]]:
    """32 batches of 4 (128 sequences) for the sample model, seed 1."""
    yield from batches(SEED + 1, 32)


def evaluation_data() -> Iterator[dict[str, np.ndarray]]:
    """Held out: 64 batches of 4 (256 sequences) for the sample model, seed 3."""
    yield from batches(SEED + 3, 64)


def task_targets(ids: np.ndarray) -> np.ndarray:
    """The synthetic task: at each position, the id of the previous token (position 0 has none: ignored)."""
    return np.roll(ids, 1, axis=1)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """numpy twin of the exported pooling (for checks)."""
    m = mask[..., None].astype(np.float32)
    return (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)


# ----------------------------------------------------------------------------------------------------------
# The torch model (torch imported here only)


def build_model(config: EncoderConfig) -> Any:
    """The encoder as a torch module, with BERT's initialisation (seeded)."""
    import torch
    from torch import nn

    head_dim = config.hidden // config.heads

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h = config.hidden
            self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
            self.ln1 = nn.LayerNorm(h, eps=1e-12)
            self.ff1 = nn.Linear(h, config.ffn_width)
            self.ff2 = nn.Linear(config.ffn_width, h)
            self.gelu = nn.GELU()  # exact (erf), as BERT
            self.ln2 = nn.LayerNorm(h, eps=1e-12)

        def heads(self, x: torch.Tensor) -> torch.Tensor:
            # -1 for the batch keeps the exported Reshape shapes constant with a dynamic batch
            return x.reshape(-1, config.seq, config.heads, head_dim).transpose(1, 2)

        def forward(self, x: torch.Tensor, extended_mask: torch.Tensor) -> torch.Tensor:
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
            att = torch.softmax(scores + extended_mask, dim=-1)
            ctx = (att @ v).transpose(1, 2).reshape(-1, config.seq, config.hidden)
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.ff2(self.gelu(self.ff1(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(config.vocab, config.hidden)
            self.pos = nn.Embedding(config.seq, config.hidden)
            self.ln = nn.LayerNorm(config.hidden, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(config.layers))
            self.register_buffer("positions", torch.arange(config.seq), persistent=False)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # Hugging Face BERT's get_extended_attention_mask, dtype float32 (older exports: -10000.0)
            fill = torch.finfo(torch.float32).min if config.mask_value is None else config.mask_value
            extended = (1.0 - mask[:, None, None, :].to(torch.float32)) * fill
            x = self.ln(self.tok(ids) + self.pos(self.positions))
            for layer in self.layers:
                x = layer(x, extended)
            m = mask.unsqueeze(-1).to(torch.float32)
            pooled = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
            return x, pooled

    torch.manual_seed(SEED)
    model = Encoder()
    for module in model.modules():  # BertPreTrainedModel._init_weights
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    return model


def train(model: Any, config: EncoderConfig) -> tuple[Any, float]:
    """`config.train_steps` Adam steps on the synthetic task; returns the model, last-50-step accuracy."""
    import torch
    from torch import nn

    head = nn.Linear(config.hidden, config.vocab)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    rng = np.random.default_rng(SEED)
    model.train()
    correct = total = 0.0
    for step in range(config.train_steps):
        data = random_batch(rng, TRAIN_BATCH, config.seq, config.vocab)
        ids, mask = torch.from_numpy(data["input_ids"]), torch.from_numpy(data["attention_mask"])
        target = torch.from_numpy(task_targets(data["input_ids"]))
        weight = mask.to(torch.float32)
        weight[:, 0] = 0.0  # no previous token
        opt.zero_grad()
        hidden, _ = model(ids, mask)
        logits = head(hidden)
        losses = loss_fn(logits.reshape(-1, config.vocab), target.reshape(-1))
        loss = (losses * weight.reshape(-1)).sum() / weight.sum()
        loss.backward()
        opt.step()
        if step >= config.train_steps - 50:
            hit = (logits.argmax(-1) == target).to(torch.float32) * weight
            correct += float(hit.sum())
            total += float(weight.sum())
    model.eval()
    return model, correct / total if total else float("nan")


def export(model: Any, config: EncoderConfig, float_path: Path) -> None:
    import torch
    from _common import finish_export  # here: the data generators above must import without onnx/torch

    data = random_batch(np.random.default_rng(SEED), 2, config.seq, config.vocab)
    dummy = (torch.from_numpy(data["input_ids"]), torch.from_numpy(data["attention_mask"]))
    batch_axis = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            dummy,
            str(float_path),
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            dynamic_axes={name: batch_axis for name in INPUT_NAMES + OUTPUT_NAMES},
            opset_version=OPSET,
            dynamo=False,
        )
    finish_export(float_path, "build_bert_mask.py")


def build(config: EncoderConfig, out: Path, stem: str = STEM) -> Path:
    """Build, train, export; returns the float model's path (also writes `<stem>.inputs.npz`)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model, accuracy = train(build_model(config), config)
    float_path = out / f"{stem}.onnx"
    export(model, config, float_path)
    sample = batches(SEED + 2, 1, batch=4, config=config)[0]
    np.savez(out / f"{stem}.inputs.npz", allow_pickle=False, **sample)
    if config.train_steps:
        print(f"synthetic-task token accuracy over the last 50 training steps: {accuracy:.4f}")
    return float_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    d = SAMPLE
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: models/)")
    parser.add_argument("--stem", default=STEM, help=f"output file stem (default {STEM})")
    parser.add_argument("--layers", type=int, default=d.layers, help=f"encoder layers (default {d.layers})")
    parser.add_argument("--hidden", type=int, default=d.hidden, help=f"model width (default {d.hidden})")
    parser.add_argument("--heads", type=int, default=d.heads, help=f"attention heads (default {d.heads})")
    parser.add_argument("--seq", type=int, default=d.seq, help=f"sequence length (default {d.seq})")
    parser.add_argument("--vocab", type=int, default=d.vocab, help=f"token vocabulary (default {d.vocab})")
    parser.add_argument("--ffn", type=int, default=0, help="feed-forward width (default 4 x hidden)")
    parser.add_argument("--train-steps", type=int, default=d.train_steps, help=f"default {d.train_steps}")
    parser.add_argument(
        "--mask-value",
        type=float,
        default=None,
        help="what padded positions add to the scores (default: float32 min, as Hugging Face; e.g. -10000)",
    )
    args = parser.parse_args(argv)
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    config = EncoderConfig(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        seq=args.seq,
        vocab=args.vocab,
        ffn=args.ffn,
        train_steps=args.train_steps,
        mask_value=args.mask_value,
    )
    path = build(config, args.out, args.stem)
    print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

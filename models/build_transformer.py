"""Build the sample transformer encoder: 2 layers, hidden 64, 4 heads, trained briefly on a synthetic task.

Offline and deterministic (seeded, single-threaded). Run from anywhere:

    .venv/bin/python models/build_transformer.py [--out DIR]

Size options (defaults: the committed sample) build larger encoders, e.g. benchmarks/import_onnx.py's
MiniLM-shaped one: `--layers 6 --hidden 384 --heads 12 --vocab 30522 --train-steps 0 --qdq-only
--stem encoder6x384` (`--ffn` defaults to 4 x hidden; `--train-steps 0` keeps the initial weights;
`--qdq-only` writes the float and QDQ models only).

The encoder is BERT-shaped (post-LayerNorm): token embedding (Gather) + learned positions, LayerNormalization,
then per layer self-attention (MatMul/Add projections, QK^T / sqrt(d), Softmax, MatMul), residual Add,
LayerNormalization, feed-forward MatMul/Add - GELU (exact, exported as Erf) - MatMul/Add, residual Add,
LayerNormalization; a per-token 2-class head. Synthetic task (needs attention): for each position, does its
token occur anywhere else in the sequence? Token ids are uniform random, so no data set is needed.

Writes models/tiny_encoder.onnx (float), tiny_encoder.qdq.onnx, tiny_encoder.qop.onnx and
tiny_encoder.inputs.npz, and prints task accuracy and the cosine of the quantized hidden states to float.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from _common import HERE, cosine, describe, finish_export, op_counts, quantize, session
from onnxruntime.quantization import QuantFormat
from torch import nn

SEED = 0
VOCAB = 32
BATCH, SEQ = 2, 16  # static shapes of the exported graph
HIDDEN, HEADS, FFN, LAYERS = 64, 4, 256, 2
OPSET = 17
TRAIN_STEPS, TRAIN_BATCH = 400, 64
CALIB_BATCHES = 32
EVAL_BATCHES = 256
INPUT_NAME = "input_ids"
OUTPUT_NAMES = ["last_hidden_state", "logits"]

STEM = "tiny_encoder"

# QOperator variant: the op types whose QOperator form is an ONNX QLinear op or one of the com.microsoft
# ops qconvert's frontend lifts (QLinearMatMul, QLinearAdd, QLinearMul; Gather/Reshape/Transpose stay
# plain ops on int8 tensors). Left float, between DequantizeLinear/QuantizeLinear: Softmax (would be
# com.microsoft QLinearSoftmax), LayerNormalization, Erf, Div, Sqrt.
QOP_OP_TYPES = ["MatMul", "Add", "Mul", "Gather", "Reshape", "Transpose"]


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN)
        self.k = nn.Linear(HIDDEN, HIDDEN)
        self.v = nn.Linear(HIDDEN, HIDDEN)
        self.o = nn.Linear(HIDDEN, HIDDEN)
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.ff1 = nn.Linear(HIDDEN, FFN)
        self.ff2 = nn.Linear(FFN, HIDDEN)
        self.gelu = nn.GELU()  # exact (erf) form
        self.ln2 = nn.LayerNorm(HIDDEN)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.reshape(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)  # [b, h, s, d]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HIDDEN // HEADS), dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.ff2(self.gelu(self.ff1(x))))


class TinyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Parameter(torch.randn(SEQ, HIDDEN) * 0.1)
        self.ln = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, 2)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.ln(self.tok(ids) + self.pos)
        for layer in self.layers:
            x = layer(x)
        return x, self.head(x)


def random_ids(rng: np.random.Generator, batch: int) -> np.ndarray:
    return rng.integers(0, VOCAB, size=(batch, SEQ), dtype=np.int64)


def labels(ids: np.ndarray) -> np.ndarray:
    """1 where the token occurs elsewhere in its sequence."""
    same = ids[:, :, None] == ids[:, None, :]
    return (same.sum(-1) > 1).astype(np.int64)


def train() -> TinyEncoder:
    torch.manual_seed(SEED)
    model = TinyEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(SEED)
    model.train()
    for _ in range(TRAIN_STEPS):
        ids = random_ids(rng, TRAIN_BATCH)
        opt.zero_grad()
        _, logits = model(torch.from_numpy(ids))
        loss = loss_fn(logits.reshape(-1, 2), torch.from_numpy(labels(ids)).reshape(-1))
        loss.backward()
        opt.step()
    model.eval()
    return model


def export(model: TinyEncoder, float_path: Path) -> None:
    dummy = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (dummy,),
            str(float_path),
            input_names=[INPUT_NAME],
            output_names=OUTPUT_NAMES,
            opset_version=OPSET,
            dynamo=False,
        )
    finish_export(float_path, "build_transformer.py")


def main(argv: list[str] | None = None) -> int:
    global VOCAB, HIDDEN, HEADS, FFN, LAYERS, TRAIN_STEPS
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: models/)")
    # Size options (benchmarks/import_onnx.py builds a 6-layer, 384-wide, 30522-token encoder with them);
    # the defaults build the committed sample model.
    parser.add_argument("--layers", type=int, default=LAYERS, help=f"encoder layers (default {LAYERS})")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help=f"model width (default {HIDDEN})")
    parser.add_argument("--heads", type=int, default=HEADS, help=f"attention heads (default {HEADS})")
    parser.add_argument("--ffn", type=int, default=None, help="feed-forward width (default 4 x hidden)")
    parser.add_argument("--vocab", type=int, default=VOCAB, help=f"token vocabulary (default {VOCAB})")
    parser.add_argument(
        "--train-steps", type=int, default=TRAIN_STEPS, help=f"0 keeps the weights untrained ({TRAIN_STEPS})"
    )
    parser.add_argument("--stem", default=STEM, help=f"output file stem (default {STEM})")
    parser.add_argument(
        "--qdq-only", action="store_true", help="write the float and QDQ models only (no QOperator, no eval)"
    )
    args = parser.parse_args(argv)
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    VOCAB, HIDDEN, HEADS, LAYERS = args.vocab, args.hidden, args.heads, args.layers
    FFN = args.ffn if args.ffn is not None else 4 * args.hidden
    TRAIN_STEPS = args.train_steps
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stem = args.stem
    float_path, qdq_path, qop_path = (out / f"{stem}{s}.onnx" for s in ("", ".qdq", ".qop"))
    inputs_path = out / f"{stem}.inputs.npz"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = train()
    export(model, float_path)

    calib_rng = np.random.default_rng(SEED + 1)
    calib = [{INPUT_NAME: random_ids(calib_rng, BATCH)} for _ in range(CALIB_BATCHES)]
    quantize(float_path, qdq_path, calib, QuantFormat.QDQ)
    if args.qdq_only:
        print(describe(float_path))
        print(describe(qdq_path))
        return 0
    quantize(float_path, qop_path, calib, QuantFormat.QOperator, op_types_to_quantize=QOP_OP_TYPES)

    sample = random_ids(np.random.default_rng(SEED + 2), BATCH)
    np.savez(inputs_path, allow_pickle=False, **{INPUT_NAME: sample})

    eval_rng = np.random.default_rng(SEED + 3)
    evals = [random_ids(eval_rng, BATCH) for _ in range(EVAL_BATCHES)]
    results = {}
    for label, path in (("float", float_path), ("qdq", qdq_path), ("qop", qop_path)):
        sess = session(path)
        outs = [[np.asarray(o) for o in sess.run(OUTPUT_NAMES, {INPUT_NAME: ids})] for ids in evals]
        hidden = np.stack([o[0] for o in outs])
        logits = np.stack([o[1] for o in outs])
        results[label] = (hidden, logits)
        acc = float((logits.argmax(-1) == np.stack([labels(ids) for ids in evals])).mean())
        print(f"{label:5s} synthetic-task token accuracy {acc:.4f}  {describe(path)}")
        print(f"      ops {op_counts(path)}")
    for label in ("qdq", "qop"):
        hidden, logits = results[label]
        cos_h = cosine(hidden, results["float"][0])
        # per-batch minimum, the figure the tests bound on the sample input
        min_cos = min(cosine(h, f) for h, f in zip(hidden, results["float"][0]))
        agree = float((logits.argmax(-1) == results["float"][1].argmax(-1)).mean())
        print(
            f"{label}: cosine(last_hidden_state) vs float {cos_h:.5f} over {EVAL_BATCHES} batches "
            f"(min per batch {min_cos:.5f}); logits argmax agrees on {agree:.4f} of tokens"
        )
    print(describe(inputs_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

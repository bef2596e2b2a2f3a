"""Build the sample CNN: train on the 8x8 digits bundled with scikit-learn, export to ONNX, quantize it.

Offline and deterministic (seeded, single-threaded). Run from anywhere:

    .venv/bin/python models/build_cnn.py [--out DIR]

Writes models/digits_cnn.onnx (float), digits_cnn.qdq.onnx (QDQ), digits_cnn.qop.onnx (QOperator) and
digits_cnn.inputs.npz, and prints the test-split accuracy of the three models as onnxruntime runs them
(graph optimizations off).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from _common import HERE, describe, finish_export, op_counts, quantize, session
from onnxruntime.quantization import QuantFormat
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

SEED = 0
BATCH = 8  # static batch dimension of the exported graph
OPSET = 17
EPOCHS = 40
CALIB_SAMPLES = 256  # training images fed to the calibrator, BATCH at a time
INPUT_NAME = "image"
OUTPUT_NAME = "logits"

STEM = "digits_cnn"


class DigitsCNN(nn.Module):
    """Conv-Relu-MaxPool-Conv-Relu-GlobalAveragePool-Flatten-Gemm on 1x8x8 images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        x = torch.flatten(self.gap(x), 1)
        return self.fc(x)


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    pixels, target = load_digits(return_X_y=True)  # bundled with scikit-learn: no download
    x = (np.asarray(pixels, np.float32) / 16.0).reshape(-1, 1, 8, 8)  # pixels 0..16 -> [0, 1], NCHW
    y = np.asarray(target, np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=SEED, stratify=y)
    return np.asarray(x_train), np.asarray(x_test), np.asarray(y_train), np.asarray(y_test)


def train(x_train: np.ndarray, y_train: np.ndarray) -> DigitsCNN:
    torch.manual_seed(SEED)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 32):
            idx = perm[i : i + 32]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model.eval()
    return model


def export(model: DigitsCNN, float_path: Path) -> None:
    dummy = torch.zeros(BATCH, 1, 8, 8)
    torch.onnx.export(
        model,
        (dummy,),
        str(float_path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        opset_version=OPSET,
        dynamo=False,
    )
    finish_export(float_path, "build_cnn.py", infer_shapes=False)  # the committed model has no value_info


def batches_of(x: np.ndarray) -> list[np.ndarray]:
    """Split into static-size batches, padding the last with zero images."""
    out = []
    for i in range(0, len(x), BATCH):
        b = x[i : i + BATCH]
        if len(b) < BATCH:
            b = np.concatenate([b, np.zeros((BATCH - len(b), *b.shape[1:]), b.dtype)])
        out.append(np.ascontiguousarray(b))
    return out


def predict(path: Path, x: np.ndarray) -> np.ndarray:
    sess = session(path)
    logits = np.concatenate([np.asarray(sess.run(None, {INPUT_NAME: b})[0]) for b in batches_of(x)])
    return logits[: len(x)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: models/)")
    out: Path = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    float_path, qdq_path, qop_path = (out / f"{STEM}{s}.onnx" for s in ("", ".qdq", ".qop"))
    inputs_path = out / f"{STEM}.inputs.npz"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    x_train, x_test, y_train, y_test = load_data()
    model = train(x_train, y_train)
    with torch.no_grad():
        torch_acc = float((model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
    export(model, float_path)

    calib = [{INPUT_NAME: b} for b in batches_of(x_train[:CALIB_SAMPLES])]
    quantize(float_path, qdq_path, calib, QuantFormat.QDQ)
    quantize(float_path, qop_path, calib, QuantFormat.QOperator)

    np.savez(inputs_path, allow_pickle=False, **{INPUT_NAME: np.ascontiguousarray(x_test[:BATCH])})

    print(f"train {len(x_train)} / test {len(x_test)} images; torch float test accuracy {torch_acc:.4f}")
    logits = {}
    for label, path in (("float", float_path), ("qdq", qdq_path), ("qop", qop_path)):
        logits[label] = predict(path, x_test)
        acc = float((logits[label].argmax(1) == y_test).mean())
        print(f"{label:5s} test accuracy {acc:.4f}  {describe(path)}")
        print(f"      ops {op_counts(path)}")
    for label in ("qdq", "qop"):
        agree = float((logits[label].argmax(1) == logits["float"].argmax(1)).mean())
        print(f"{label} argmax agrees with float on {agree:.4f} of test images")
    print(describe(inputs_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What torch.onnx.export (the TorchScript exporter users run, dynamic batch axes) writes for common
layers and tensor functions, converted to StableHLO with the inputs' static shapes and run on XLA:CPU
against onnxruntime: the float-op coverage as real exports exercise it (exporter patterns such as Resize
scales computed from Shape, Pad from a Concat of constants, masks through Where/Expand).

Bounds: integer and boolean outputs exactly; float outputs within `ABSOLUTE` times the largest
|expected| (sums in another order, the engine's exp/log/erf).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import require_module

pytestmark = pytest.mark.engine

ABSOLUTE = 1e-5


def export(module: object, inputs: dict[str, np.ndarray], opset: int) -> bytes:
    torch = require_module("torch")
    buffer = io.BytesIO()
    tensors = tuple(torch.from_numpy(v) for v in inputs.values())
    names = list(inputs)
    with torch.no_grad():
        torch.onnx.export(
            module,
            tensors,
            buffer,
            input_names=names,
            opset_version=opset,
            dynamo=False,
            dynamic_axes={name: {0: "batch"} for name in names},
        )
    return buffer.getvalue()


def check_export(module: object, inputs: dict[str, np.ndarray], must_hold: set[str], opset: int = 17) -> None:
    """Export, check the export holds the `must_hold` op types (what the test is about), convert, compare."""
    require_module("jax")
    import onnx
    import onnxruntime as ort

    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    model_bytes = export(module, inputs, opset)
    model = onnx.load_from_string(model_bytes)
    missing = must_hold - {node.op_type for node in model.graph.node}
    assert not missing, f"the export no longer holds {sorted(missing)}"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    shapes = {name: value.shape for name, value in inputs.items()}
    text = stablehlo_text(import_onnx(model, input_shapes=shapes), form="qdq", inline_weights=True)
    assert '"onnx.' not in text, "an onnx op was left in the module"
    actual = run.run(text, list(inputs.values()), engine="xla")
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"output {index}: {a.shape} != {e.shape}"
        if e.dtype.kind in "biu":
            np.testing.assert_array_equal(a, e, err_msg=f"output {index}")
        else:
            bound = ABSOLUTE * max(float(np.abs(e).max()), 1.0)
            np.testing.assert_allclose(a, e, rtol=0, atol=bound, err_msg=f"output {index}")


def test_vision_layers() -> None:
    torch = require_module("torch")
    nn, functional = torch.nn, torch.nn.functional
    torch.manual_seed(0)

    class Vision(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 16, 3, padding=1)
            self.group_norm = nn.GroupNorm(2, 4)
            self.instance_norm = nn.InstanceNorm2d(4, affine=True)
            self.prelu = nn.PReLU(4)
            self.batch_norm = nn.BatchNorm2d(4).eval()

        def forward(self, x: object, grid: object) -> tuple[object, ...]:
            up = functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            cubic = functional.interpolate(x, size=(5, 7), mode="bicubic", align_corners=True)
            nearest = functional.interpolate(x, scale_factor=2, mode="nearest")
            shuffled = functional.pixel_shuffle(self.conv(x), 2)
            unshuffled = functional.pixel_unshuffle(x, 2)
            activations = (
                functional.hardswish(x) + functional.hardsigmoid(x) + functional.mish(x) + functional.silu(x)
                + functional.elu(x) + functional.selu(x) + functional.softplus(x) + self.prelu(x)
            )  # fmt: skip
            padded = functional.pad(x, (1, 2, 0, 1), mode="reflect") + functional.pad(
                x, (1, 2, 0, 1), mode="replicate"
            )
            sampled = functional.grid_sample(x, grid, align_corners=False, padding_mode="border")
            pooled = functional.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
            normalized = self.group_norm(x) + self.instance_norm(x) + self.batch_norm(x)
            moved = torch.flip(x, [3]) + torch.roll(x, 1, 2)
            return (
                up, cubic, nearest, shuffled, unshuffled, activations, padded, sampled, pooled, normalized,
                moved,
                functional.normalize(x, dim=1), torch.logsumexp(x, dim=1), torch.cumsum(x, dim=2),
                functional.adaptive_avg_pool2d(x, 1),
            )  # fmt: skip

    rng = np.random.default_rng(3)
    inputs = {
        "x": rng.uniform(-2, 2, (2, 4, 8, 8)).astype(np.float32),
        "grid": rng.uniform(-1.2, 1.2, (2, 5, 6, 2)).astype(np.float32),
    }
    vision_ops = {
        "Resize",
        "GridSample",
        "DepthToSpace",
        "InstanceNormalization",
        "BatchNormalization",
        "Pad",
    }
    vision_ops |= {"HardSwish", "HardSigmoid", "Elu", "Selu", "Softplus", "PRelu", "AveragePool", "CumSum"}
    check_export(Vision().eval(), inputs, vision_ops | {"ReduceL2", "ReduceLogSumExp", "GlobalAveragePool"})


def test_sequence_functions() -> None:
    torch = require_module("torch")
    nn, functional = torch.nn, torch.nn.functional
    torch.manual_seed(0)

    class Sequence(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(20, 8)

        def forward(self, tokens: object, x: object) -> tuple[object, ...]:
            embedded = self.embedding(tokens) + x
            values, indices = torch.topk(embedded, 3, dim=-1)
            length = x.shape[1]
            causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
            scores = torch.einsum("bsd,btd->bst", embedded, x).masked_fill(causal, float("-inf"))
            positions = torch.cumsum(tokens.ne(0).long(), dim=1) * tokens.ne(0).long()
            gathered = torch.gather(embedded, 2, indices)
            updated = embedded.clone()
            updated[:, 0] = 0.0
            return (
                values, indices, functional.log_softmax(scores, dim=-1), positions, gathered, updated,
                embedded.argmax(dim=-1), functional.one_hot(tokens % 5, 5), embedded.norm(dim=-1),
                torch.clamp(embedded, -0.5, 0.5), torch.remainder(tokens, 3), torch.floor_divide(tokens, 4),
                torch.erf(embedded), embedded.max(dim=1).values, torch.isnan(embedded.log()),
            )  # fmt: skip

    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 20, (2, 6)).astype(np.int64)
    tokens[1, 4:] = 0  # padding
    inputs = {"tokens": tokens, "x": rng.uniform(-1, 1, (2, 6, 8)).astype(np.float32)}
    sequence_ops = {"TopK", "Einsum", "Trilu", "CumSum", "GatherElements", "ScatterND", "ArgMax", "OneHot"}
    sequence_ops |= {"LogSoftmax", "Mod", "ReduceL2", "Erf", "IsNaN", "Log", "Not"}
    check_export(Sequence().eval(), inputs, sequence_ops)

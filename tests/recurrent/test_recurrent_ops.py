"""LSTM, GRU and com.microsoft DynamicQuantizeLSTM end to end: torch exports (and hand-built graphs for the
attributes torch never writes), run by onnxruntime, by qconvert's interpreter and, converted to StableHLO,
by XLA:CPU.

Bounds:
- DynamicQuantizeLSTM (quantize_dynamic of a torch LSTM): bit-exact, interpreter and XLA, against
  onnxruntime with one intra-op thread (with more threads onnxruntime quantizes H per chunk of batch
  rows, see qconvert/interpret_recurrent.py).
- LSTM / GRU / RNN (float): `FLOAT_BOUND` absolute. The outputs are of order 1 (h = o * tanh(c), a
  GRU's a convex mix of tanh values; the ReLU / Elu cases stay small over these few steps), each step's
  products sum at most `I + H` terms in another order than MLAS (about (I + H) * 2**-24 relative to the
  sum of |terms|), and XLA's logistic / tanh differ from MLAS's by a few ulps; over the few steps here
  that stays well under 1e-5 (measured: at most 2.1e-7 over every float case of this file, interpreter
  and XLA).
- MLAS logistic / tanh (numerics): bit-exact against onnxruntime's Sigmoid / Tanh.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

FLOAT_BOUND = 1e-5
RNG = np.random.default_rng(7)


def require_onnxruntime_exact_int8(int8: bool = True) -> None:
    """The bit-exact claims model onnxruntime on an x86-64 CPU with VNNI (or AMX): its u8 x s8 GEMM is then
    an exact int32 sum (`vpdpbusd`), and its logistic / tanh the FMA3 kernels. AVX2 / AVX-512BW CPUs
    without VNNI saturate int16 pair sums (`vpmaddubsw`) and other CPUs run other kernels: skip there."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    vnni = re.search(r"\b(avx512_vnni|avx_vnni|amx_int8)\b", flags)
    if (int8 and not vnni) or not re.search(r"\bfma\b", flags):
        pytest.skip(
            "onnxruntime's int8 GEMM / MLAS activations on this CPU are not the ones modelled (no VNNI / FMA)"
        )


def ort_run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def ours(
    model: onnx.ModelProto | str, feeds: dict[str, np.ndarray], engine: str = "xla"
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(interpreter outputs, outputs of the StableHLO module on `engine`) of the model lifted with the feeds'
    shapes (`engine`: "xla", or "interpreter" for StableHLO's reference interpreter)."""
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx
    from qconvert.interpret import interpret, output_names

    shapes = {name: array.shape for name, array in feeds.items()}
    module = import_onnx(model, shapes)
    interpreted = interpret(module, feeds)
    interpreted_list = [interpreted[name] for name in output_names(module)]
    text = stablehlo_text(module, form="qdq", inline_weights=True)
    assert '"onnx.' not in text, "an onnx op was left in the module"
    return interpreted_list, [np.asarray(a) for a in run.run(text, list(feeds.values()), engine=engine)]


def assert_close(actual: list[np.ndarray], expected: list[np.ndarray], bound: float, what: str) -> None:
    assert len(actual) == len(expected), what
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a.shape == e.shape, f"{what} output {index}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype == np.float32, f"{what} output {index}: {a.dtype} vs {e.dtype}"
        if bound == 0:
            mismatches = int(np.sum(a != e))
            assert mismatches == 0, f"{what} output {index}: {mismatches} of {a.size} elements differ"
        else:
            worst = float(np.max(np.abs(a - e)))
            assert worst <= bound, f"{what} output {index}: |difference| {worst:.3g} > {bound}"


# Torch exports -----------------------------------------------------------------------------------------
def torch_export(
    path: Path, cell: str, *, bidirectional: bool, batch_first: bool, initial_states: bool, layers: int = 1
) -> dict[str, np.ndarray]:
    """Export a small torch LSTM / GRU as users do (dynamic axes on batch and time); returns its feeds."""
    torch = require_module("torch")
    torch.manual_seed(3)
    kind, _, nonlinearity = cell.partition("-")  # "RNN-relu": torch.nn.RNN(nonlinearity="relu")
    options = {"nonlinearity": nonlinearity} if nonlinearity else {}
    recurrent = getattr(torch.nn, kind)(
        6, 12, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, **options
    )

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = recurrent

        def forward(self, x, *states):  # type: ignore[no-untyped-def]
            y, final = self.rnn(x, *states)
            finals = final if isinstance(final, tuple) else (final,)
            return (y, *finals)

    x = RNG.normal(size=(2, 5, 6) if batch_first else (5, 2, 6)).astype(np.float32)
    feeds = {"x": x}
    directions = 2 if bidirectional else 1
    args = [torch.from_numpy(x)]
    if initial_states:
        h0 = RNG.normal(scale=0.5, size=(directions * layers, 2, 12)).astype(np.float32)
        feeds["h0"] = h0
        state = torch.from_numpy(h0)
        if kind == "LSTM":
            c0 = RNG.normal(scale=0.5, size=(directions * layers, 2, 12)).astype(np.float32)
            feeds["c0"] = c0
            state = (state, torch.from_numpy(c0))
        args.append(state)
    outputs = ["y", "h"] + (["c"] if kind == "LSTM" else [])
    time_axis, batch_axis = (1, 0) if batch_first else (0, 1)
    dynamic = {"x": {time_axis: "time", batch_axis: "batch"}}
    torch.onnx.export(
        Model().eval(), tuple(args), str(path), input_names=list(feeds), output_names=outputs,
        dynamic_axes=dynamic, opset_version=17, dynamo=False,
    )  # fmt: skip
    return feeds


TORCH_CASES = [
    pytest.param("LSTM", False, False, False, id="lstm-forward"),
    pytest.param("LSTM", True, False, False, id="lstm-bidirectional"),
    pytest.param("LSTM", True, False, True, id="lstm-bidirectional-initial-states"),
    pytest.param("LSTM", False, True, True, id="lstm-batch-first-initial-states"),
    pytest.param("GRU", False, False, False, id="gru-forward"),
    pytest.param("GRU", True, True, True, id="gru-bidirectional-batch-first-initial-state"),
    pytest.param("RNN", True, False, True, id="rnn-bidirectional-initial-state"),
    pytest.param("RNN-relu", False, True, False, id="rnn-relu-batch-first"),
    pytest.param("LSTM-2", True, False, False, id="lstm-2-layers-bidirectional"),
]


@pytest.mark.engine
@pytest.mark.parametrize(("cell", "bidirectional", "batch_first", "initial_states"), TORCH_CASES)
def test_torch_export_matches_onnxruntime(
    tmp_path: Path, cell: str, bidirectional: bool, batch_first: bool, initial_states: bool
) -> None:
    path = tmp_path / "model.onnx"
    layers = 2 if cell == "LSTM-2" else 1
    cell = cell.removesuffix("-2")
    feeds = torch_export(
        path, cell, bidirectional=bidirectional, batch_first=batch_first, initial_states=initial_states,
        layers=layers,
    )  # fmt: skip
    exported = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert exported.count(cell.partition("-")[0]) == layers
    expected = ort_run(str(path), feeds)
    interpreted, xla = ours(str(path), feeds)
    assert_close(interpreted, expected, FLOAT_BOUND, "interpreter")
    assert_close(xla, expected, FLOAT_BOUND, "xla")


@pytest.mark.engine
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-direction", "per-channel"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
def test_dynamic_quantize_lstm_is_bit_exact(tmp_path: Path, per_channel: bool, bidirectional: bool) -> None:
    require_onnxruntime_exact_int8()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float_path, quantized_path = tmp_path / "lstm.onnx", tmp_path / "lstm_int8.onnx"
    feeds = torch_export(
        float_path, "LSTM", bidirectional=bidirectional, batch_first=False, initial_states=True
    )
    quantize_dynamic(
        str(float_path), str(quantized_path), weight_type=QuantType.QInt8, per_channel=per_channel
    )
    nodes = onnx.load(str(quantized_path)).graph.node
    assert [n.op_type for n in nodes if n.domain == "com.microsoft"] == ["DynamicQuantizeLSTM"]
    expected = ort_run(str(quantized_path), feeds)
    interpreted, xla = ours(str(quantized_path), feeds)
    assert_close(interpreted, expected, 0, "interpreter")
    assert_close(xla, expected, 0, "xla")
    if bidirectional and per_channel:  # the while loop on StableHLO's reference interpreter too
        assert_close(ours(str(quantized_path), feeds, "interpreter")[1], expected, 0, "stablehlo interpreter")
    # The quantization is visible: the float model's outputs differ from the quantized ones.
    assert not np.array_equal(ort_run(str(float_path), feeds)[0], expected[0])


def packed_export(path: Path) -> dict[str, np.ndarray]:
    """A torch LSTM over a padded batch (pack_padded_sequence / pad_packed_sequence, unsorted lengths): the
    exporter feeds the lengths to the LSTM's sequence_lens at run time."""
    torch = require_module("torch")
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.LSTM(6, 8, bidirectional=True)

        def forward(self, x, lengths):  # type: ignore[no-untyped-def]
            y, (h, _) = self.rnn(pack_padded_sequence(x, lengths, enforce_sorted=False))
            return pad_packed_sequence(y, total_length=x.shape[0])[0], h

    torch.manual_seed(5)
    feeds = {"x": RNG.normal(size=(5, 3, 6)).astype(np.float32), "lengths": np.array([5, 2, 4], np.int64)}
    args = (torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["lengths"]))
    torch.onnx.export(
        Model().eval(), args, str(path), input_names=list(feeds), output_names=["y", "h"], opset_version=17,
        dynamo=False,
    )  # fmt: skip
    lstm = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "LSTM")
    assert len(lstm.input) > 4 and lstm.input[4], "the export feeds sequence_lens"
    return feeds


@pytest.mark.engine
def test_torch_packed_sequence_matches_onnxruntime(tmp_path: Path) -> None:
    path = tmp_path / "packed.onnx"
    feeds = packed_export(path)
    expected = ort_run(str(path), feeds)
    interpreted, xla = ours(str(path), feeds)
    assert_close(interpreted, expected, FLOAT_BOUND, "interpreter")
    assert_close(xla, expected, FLOAT_BOUND, "xla")
    assert np.all(expected[0][2:, 1] == 0), "row 1 (length 2) is padding after step 2"


@pytest.mark.engine
def test_quantized_packed_sequence_is_bit_exact(tmp_path: Path) -> None:
    """quantize_dynamic of the packed export: onnxruntime's numbers bit for bit with the lengths given at
    run time, on the interpreter and XLA."""
    require_onnxruntime_exact_int8()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float_path, quantized_path = tmp_path / "packed.onnx", tmp_path / "packed_int8.onnx"
    feeds = packed_export(float_path)
    quantize_dynamic(str(float_path), str(quantized_path), weight_type=QuantType.QInt8)
    expected = ort_run(str(quantized_path), feeds)
    interpreted, xla = ours(str(quantized_path), feeds)
    assert_close(interpreted, expected, 0, "interpreter")
    assert_close(xla, expected, 0, "xla")


# Attributes torch does not write ---------------------------------------------------------------------
def lstm_graph(
    op_type: str,
    hidden: int,
    inputs: dict[str, np.ndarray | None],
    constants: dict[str, np.ndarray],
    **attributes: object,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One LSTM / GRU node over graph inputs (`inputs`, None for an absent optional input) and
    initializers (`constants`), every output a graph output."""
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"][
        : 8 if op_type == "LSTM" else 6
    ]
    names = []
    for name in order:
        present = name in constants or inputs.get(name) is not None
        names.append(name if present else "")
    while names and not names[-1]:
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if op_type == "LSTM" else [])
    node = helper.make_node(op_type, names, outputs, hidden_size=hidden, **attributes)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    graph = helper.make_graph(
        [node],
        "recurrent",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


def weights(op_type: str, directions: int, hidden: int, inputs: int) -> dict[str, np.ndarray]:
    gates = 4 if op_type == "LSTM" else 3
    return {
        "W": RNG.normal(scale=0.4, size=(directions, gates * hidden, inputs)).astype(np.float32),
        "R": RNG.normal(scale=0.4, size=(directions, gates * hidden, hidden)).astype(np.float32),
        "B": RNG.normal(scale=0.3, size=(directions, 2 * gates * hidden)).astype(np.float32),
    }


ATTRIBUTE_CASES = [
    pytest.param("LSTM", "forward", {"clip": 0.7, "input_forget": 1}, False, id="lstm-clip-input-forget"),
    pytest.param("LSTM", "reverse", {}, True, id="lstm-reverse-peepholes-sequence-lens"),
    pytest.param(
        "LSTM", "bidirectional",
        {"activations": ["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "Elu", "ScaledTanh"],
         "activation_alpha": [0.3, 0.2, 1.1, 0.9], "activation_beta": [0.4, 1.5]},
        True, id="lstm-bidirectional-activations-sequence-lens",
    ),
    pytest.param("GRU", "bidirectional", {"linear_before_reset": 0}, True, id="gru-reset-before-linear"),
    pytest.param("GRU", "forward", {"layout": 1, "clip": 1.5}, False, id="gru-layout-1-clip"),
]  # fmt: skip


@pytest.mark.engine
@pytest.mark.parametrize(("op_type", "direction", "attributes", "with_lengths"), ATTRIBUTE_CASES)
def test_attributes_match_onnxruntime(
    op_type: str, direction: str, attributes: dict[str, object], with_lengths: bool
) -> None:
    directions, hidden, size, batch, steps = 2 if direction == "bidirectional" else 1, 5, 4, 3, 4
    layout = int(attributes.get("layout", 0))  # type: ignore[call-overload]
    constants = weights(op_type, directions, hidden, size)
    if with_lengths:
        constants["sequence_lens"] = np.array([4, 2, 3], np.int32)
    if op_type == "LSTM" and direction == "reverse":
        constants["P"] = RNG.normal(scale=0.5, size=(directions, 3 * hidden)).astype(np.float32)
    state_shape = (batch, directions, hidden) if layout else (directions, batch, hidden)
    inputs: dict[str, np.ndarray | None] = {
        "X": RNG.normal(size=(batch, steps, size) if layout else (steps, batch, size)).astype(np.float32),
        "initial_h": RNG.normal(scale=0.5, size=state_shape).astype(np.float32),
    }
    if op_type == "LSTM":
        inputs["initial_c"] = RNG.normal(scale=0.5, size=state_shape).astype(np.float32)
    model, feeds = lstm_graph(op_type, hidden, inputs, constants, direction=direction, **attributes)
    if layout == 0:
        expected = ort_run(model, feeds)
    else:  # onnxruntime refuses layout 1: the same node in layout 0 on transposed data, transposed back
        batch_major = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
        time_major = {k: np.ascontiguousarray(np.transpose(v, batch_major[k])) for k, v in feeds.items()}
        attributes_0 = {**attributes, "layout": 0}
        model_0, _ = lstm_graph(op_type, hidden, time_major, constants, direction=direction, **attributes_0)
        y, *states = ort_run(model_0, time_major)
        expected = [np.transpose(y, (2, 0, 1, 3))] + [np.transpose(s, (1, 0, 2)) for s in states]
    interpreted, xla = ours(model, feeds)
    assert_close(interpreted, expected, FLOAT_BOUND, "interpreter")
    assert_close(xla, expected, FLOAT_BOUND, "xla")
    if with_lengths and layout == 0:  # rows past their length are zero in Y (onnxruntime's and ours)
        assert np.all(expected[0][3:, :, 1] == 0) and np.all(xla[0][3:, :, 1] == 0)


@pytest.mark.engine
def test_sequence_lens_at_run_time_matches_onnxruntime() -> None:
    """sequence_lens fed as a graph input: the while loop reads and writes each row at its own time."""
    inputs: dict[str, np.ndarray | None] = {
        "X": RNG.normal(size=(4, 3, 4)).astype(np.float32),
        "sequence_lens": np.array([4, 1, 3], np.int32),
    }
    model, feeds = lstm_graph("LSTM", 5, inputs, weights("LSTM", 2, 5, 4), direction="bidirectional")
    expected = ort_run(model, feeds)
    interpreted, xla = ours(model, feeds)
    assert_close(interpreted, expected, FLOAT_BOUND, "interpreter")
    assert_close(xla, expected, FLOAT_BOUND, "xla")
    assert np.all(xla[0][1:, :, 1] == 0) and np.all(xla[0][3:, :, 2] == 0) and np.any(xla[0][2, :, 2] != 0)


@pytest.mark.engine
def test_quantized_lstm_sequence_lens_at_run_time_is_bit_exact() -> None:
    """DynamicQuantizeLSTM with its lengths fed at run time, all shorter than X: onnxruntime quantizes X
    over the max(sequence_lens) = 3 steps that run only; the loop zeroes the steps past them first."""
    require_onnxruntime_exact_int8()
    model, feeds = quantized_lstm_node(
        "bidirectional", [3, 2, 1], ["Y", "Y_h", "Y_c"], False, False, lengths_at_run_time=True
    )
    feeds["X"][3:] *= 40.0  # steps that never run, far outside the range of those that do
    expected = ort_run(model, feeds)
    interpreted, xla = ours(model, feeds)
    assert_close(interpreted, expected, 0, "interpreter")
    assert_close(xla, expected, 0, "xla")


# Numerics ------------------------------------------------------------------------------------------
def test_mlas_activations_equal_onnxruntime() -> None:
    require_onnxruntime_exact_int8(int8=False)
    from qconvert.numerics.onnxruntime_recurrent import logistic_mlas, tanh_mlas

    x = np.concatenate(
        [RNG.uniform(-25, 25, 100_000), RNG.normal(0, 1, 100_000), RNG.uniform(-1e-3, 1e-3, 5_000),
         [0.0, -0.0, 9.0, -9.0, 18.0, -18.0, 1e30, -1e30]]
    ).astype(np.float32)  # fmt: skip
    for op_type, ours_function in (("Sigmoid", logistic_mlas), ("Tanh", tanh_mlas)):
        graph = helper.make_graph(
            [helper.make_node(op_type, ["x"], ["y"])],
            op_type,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        (expected,) = ort_run(model, {"x": x})
        mismatches = int(np.sum(ours_function(x) != expected))
        assert mismatches == 0, f"{op_type}: {mismatches} of {x.size} values differ from onnxruntime"


# DynamicQuantizeLSTM nodes quantize_dynamic does not write -------------------------------------------
def quantized_lstm_node(
    direction: str,
    lengths: list[int] | None,
    outputs: list[str],
    unsigned: bool,
    peepholes: bool,
    lengths_at_run_time: bool = False,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One com.microsoft DynamicQuantizeLSTM with int8 (per column) or uint8 (per direction, zero point
    not 0) weights, initial states, optional sequence_lens / peepholes, and the given outputs."""
    directions, batch, steps, size, hidden = 2 if direction == "bidirectional" else 1, 3, 5, 6, 7
    if unsigned:
        w = RNG.integers(0, 256, (directions, size, 4 * hidden)).astype(np.uint8)
        r = RNG.integers(0, 256, (directions, hidden, 4 * hidden)).astype(np.uint8)
        w_zero, r_zero = np.full(directions, 128, np.uint8), np.full(directions, 120, np.uint8)
    else:
        w = RNG.integers(-127, 128, (directions, size, 4 * hidden)).astype(np.int8)
        r = RNG.integers(-127, 128, (directions, hidden, 4 * hidden)).astype(np.int8)
        w_zero, r_zero = (
            np.zeros((directions, 4 * hidden), np.int8),
            np.zeros((directions, 4 * hidden), np.int8),
        )
    constants = {
        "W": w,
        "R": r,
        "B": RNG.normal(scale=0.3, size=(directions, 8 * hidden)).astype(np.float32),
        "W_scale": RNG.uniform(0.002, 0.01, w_zero.shape).astype(np.float32),
        "W_zero_point": w_zero,
        "R_scale": RNG.uniform(0.002, 0.01, r_zero.shape).astype(np.float32),
        "R_zero_point": r_zero,
    }
    if lengths is not None and not lengths_at_run_time:
        constants["sequence_lens"] = np.array(lengths, np.int32)
    if peepholes:
        constants["P"] = RNG.normal(scale=0.5, size=(directions, 3 * hidden)).astype(np.float32)
    order = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    order += ["W_scale", "W_zero_point", "R_scale", "R_zero_point"]
    feeds = {
        "X": RNG.normal(size=(steps, batch, size)).astype(np.float32),
        "initial_h": RNG.normal(scale=0.5, size=(directions, batch, hidden)).astype(np.float32),
        "initial_c": RNG.normal(scale=0.5, size=(directions, batch, hidden)).astype(np.float32),
    }
    if lengths is not None and lengths_at_run_time:
        feeds["sequence_lens"] = np.array(lengths, np.int32)
    names = [n if n in constants or n in feeds else "" for n in order]
    shapes = {"Y": [steps, directions, batch, hidden], "Y_h": [directions, batch, hidden]}
    shapes["Y_c"] = shapes["Y_h"]
    node_outputs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")]
    while not node_outputs[-1]:
        node_outputs.pop()
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        names,
        node_outputs,
        domain="com.microsoft",
        hidden_size=hidden,
        direction=direction,
    )
    graph = helper.make_graph(
        [node],
        "quantized_lstm",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model, feeds


@pytest.mark.engine
@pytest.mark.parametrize(
    ("direction", "lengths", "outputs", "unsigned", "peepholes"),
    [
        pytest.param("forward", None, ["Y", "Y_h", "Y_c"], True, True, id="uint8-peepholes"),
        pytest.param("reverse", [5, 2, 4], ["Y", "Y_h", "Y_c"], False, True, id="reverse-lengths"),
        pytest.param(
            "bidirectional", [5, 0, 4], ["Y", "Y_h", "Y_c"], False, False, id="bidirectional-length-0"
        ),
        # Without Y onnxruntime's finished rows keep their last state in the H the next product quantizes.
        pytest.param("forward", [5, 2, 4], ["Y_h", "Y_c"], False, False, id="no-Y-lengths"),
    ],
)
def test_dynamic_quantize_lstm_node_is_bit_exact(
    direction: str, lengths: list[int] | None, outputs: list[str], unsigned: bool, peepholes: bool
) -> None:
    require_onnxruntime_exact_int8()
    model, feeds = quantized_lstm_node(direction, lengths, outputs, unsigned, peepholes)
    expected = ort_run(model, feeds)
    interpreted, xla = ours(model, feeds)
    assert_close(interpreted, expected, 0, "interpreter")
    assert_close(xla, expected, 0, "xla")


# Attribute decoding ------------------------------------------------------------------------------------
def test_activation_parameters_are_consumed_in_order_with_onnx_defaults() -> None:
    from qconvert.recurrent import Activation, decode_attributes

    decoded = decode_attributes(
        "LSTM",
        {
            "hidden_size": 4,
            "direction": "bidirectional",
            "activations": ["HardSigmoid", "Tanh", "LeakyRelu", "Sigmoid", "ThresholdedRelu", "Affine"],
            "activation_alpha": [0.3, 0.05],
            "activation_beta": [0.6],
        },
        "node 'x'",
    )
    assert decoded.activations == (
        (Activation("hardsigmoid", 0.3, 0.6), Activation("tanh"), Activation("leakyrelu", 0.05)),
        # alpha / beta lists exhausted: the ONNX operators' defaults
        (Activation("sigmoid"), Activation("thresholdedrelu", 1.0), Activation("affine", 1.0, 0.0)),
    )
    assert decoded.reversed_directions == [False, True] and decoded.clip is None
    gru = decode_attributes("GRU", {"hidden_size": 2}, "node 'g'")
    assert gru.activations == ((Activation("sigmoid"), Activation("tanh")),) and not gru.linear_before_reset


@pytest.mark.parametrize(
    ("op_type", "attributes", "message"),
    [
        ("LSTM", {"hidden_size": 4, "activations": ["Sigmoid", "Tanh"]}, "2 activations for 1 direction"),
        ("GRU", {"hidden_size": 4, "activations": ["Sigmoid", "Swish"]}, "unknown activation 'swish'"),
        ("LSTM", {"hidden_size": 4, "direction": "sideways"}, "direction='sideways'"),
        ("DynamicQuantizeLSTM", {"hidden_size": 4, "layout": 1}, "layout=1 is not supported"),
        ("RNN", {}, "hidden_size attribute is required"),
    ],
)
def test_bad_attributes_name_the_node(op_type: str, attributes: dict[str, object], message: str) -> None:
    from qconvert.errors import InputError
    from qconvert.recurrent import decode_attributes

    with pytest.raises(InputError, match="node 'n7'.*" + message.replace("(", r"\(")):
        decode_attributes(op_type, attributes, "node 'n7'")

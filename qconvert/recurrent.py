"""What ONNX LSTM, GRU, RNN and com.microsoft DynamicQuantizeLSTM mean, written once for every executor.

The interpreter (numpy, qconvert/interpret_recurrent.py) and the StableHLO lowering
(backends/stablehlo/onnx_recurrent.py) both call `run_recurrent` with their own `RecurrentMath`
(the arithmetic: numpy arrays or StableHLO values) and `Projection` (the matrix products: float, or
dynamically quantized int8 as onnxruntime's quantized LSTM). Everything else lives here: attribute
decoding and defaults, input positions, gate order, bias, peepholes, clip, `input_forget`,
`linear_before_reset`, directions, `sequence_lens`, `layout`, and the outputs Y / Y_h / Y_c.

Conventions (ONNX spec, onnxruntime's deep CPU kernels for the order of float operations):

- LSTM gates `iofc` (W: [D, 4H, I], R: [D, 4H, H], B: [D, 8H] = Wb then Rb, P: [D, 3H] = i, o, f);
  per step `gates = X_t W^T + H_{t-1} R^T`, then per gate `+ C P` (i, f with C_{t-1}, o with C_t),
  `+ (Wb + Rb)` (the two biases summed first, as onnxruntime), clip, activation:
  `i = f(.)`, `f = 1 - i` when `input_forget` else `f(.)`, `c = g(.)`, `C_t = C_{t-1} f + i c`,
  `o = f(.)`, `H_t = h(C_t) o`.
- GRU gates `zrh` (W: [D, 3H, I], R: [D, 3H, H], B: [D, 6H]); `z = f(Xz + H Rz^T + Wbz + Rbz)`,
  `r` likewise, `h = g(Xh + (r H) Rh^T + Rbh + Wbh)` or with `linear_before_reset`
  `h = g(Xh + r (H Rh^T + Rbh) + Wbh)`, `H_t = (1 - z) h + z H_{t-1}`.
- RNN (W: [D, H, I], R: [D, H, H], B: [D, 2H]): `H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`.
- DynamicQuantizeLSTM: an LSTM whose W [D, I, 4H] and R [D, H, 4H] are int8 / uint8 with scales and
  zero points (inputs 8-11, one per direction or per direction and column); `layout` is not allowed.
- `sequence_lens`: a row b runs `len_b` steps (reverse: over its first `len_b` time steps, backwards);
  Y is zero past `len_b`, Y_h / Y_c hold the state at its last step (zero when `len_b` is 0).
- `layout` 1: X [B, T, I], states [B, D, H], Y [B, T, D, H] (0: X [T, B, I], Y [T, D, B, H]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import ArrayAttr, DenseArrayAttr, FloatAttr, IntegerAttr, StringAttr
from qconvert.ir.core import Operation
from qconvert.ir.dialects.onnx import node_name

T = TypeVar("T")

LSTM_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
GRU_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h")
QUANTIZED_LSTM_INPUTS = (*LSTM_INPUTS, "W_scale", "W_zero_point", "R_scale", "R_zero_point")
OP_TYPES = {
    "LSTM": LSTM_INPUTS,
    "GRU": GRU_INPUTS,
    "RNN": GRU_INPUTS,
    "DynamicQuantizeLSTM": QUANTIZED_LSTM_INPUTS,
}
# Activations per direction and their defaults.
DEFAULT_ACTIVATIONS = {
    "LSTM": ("sigmoid", "tanh", "tanh"),
    "DynamicQuantizeLSTM": ("sigmoid", "tanh", "tanh"),
    "GRU": ("sigmoid", "tanh"),
    "RNN": ("tanh",),
}

# Activation name (lower case) -> (default alpha, default beta) as the ONNX operators of that name
# define them (the spec: "default values are the same as of corresponding ONNX operators"); None
# where the function takes no such parameter. Affine / ScaledTanh are the former ONNX ops' defaults.
# onnxruntime (rnn_helpers.cc) takes 0 for an absent alpha / beta of ThresholdedRelu, Affine and
# ScaledTanh: a node relying on those defaults computes otherwise there (no exporter writes one).
ACTIVATION_DEFAULTS: dict[str, tuple[float | None, float | None]] = {
    "sigmoid": (None, None),
    "tanh": (None, None),
    "relu": (None, None),
    "softsign": (None, None),
    "softplus": (None, None),
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None),
    "elu": (1.0, None),
    "hardsigmoid": (0.2, 0.5),
    "affine": (1.0, 0.0),
    "scaledtanh": (1.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class Activation:
    name: str  # lower case, as in ACTIVATION_DEFAULTS
    alpha: float = 0.0
    beta: float = 0.0


@dataclass(frozen=True, slots=True)
class RecurrentAttributes:
    """The decoded attributes of one LSTM / GRU / DynamicQuantizeLSTM node."""

    op_type: str
    hidden_size: int
    direction: str  # forward | reverse | bidirectional
    activations: tuple[tuple[Activation, ...], ...]  # per direction: (f, g, h) LSTM, (f, g) GRU
    clip: float | None
    input_forget: bool
    layout: int
    linear_before_reset: bool

    @property
    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def reversed_directions(self) -> list[bool]:
        """Per direction index, whether it runs backwards in time."""
        if self.direction == "bidirectional":
            return [False, True]
        return [self.direction == "reverse"]

    @property
    def has_cell(self) -> bool:
        """Whether the op carries a cell state C (the LSTMs)."""
        return self.op_type in ("LSTM", "DynamicQuantizeLSTM")


def op_attributes(op: Operation) -> tuple[str, RecurrentAttributes]:
    """The ONNX op type of a lifted `onnx.[<domain>.]<Op>` recurrent op and its decoded attributes."""
    op_type = op.name.rpartition(".")[2]
    values: dict[str, object] = {}
    for name, attribute in op.attributes.items():
        if isinstance(attribute, IntegerAttr | FloatAttr | StringAttr):
            values[name] = attribute.value
        elif isinstance(attribute, DenseArrayAttr):
            values[name] = list(attribute.values)
        elif isinstance(attribute, ArrayAttr):
            values[name] = [getattr(e, "value", e) for e in attribute.elements]
    node = node_name(op)
    where = f"{op_type} node '{node}'" if node is not None else f"{op_type} node"
    return op_type, decode_attributes(op_type, values, where)


def decode_attributes(op_type: str, attributes: Mapping[str, object], where: str) -> RecurrentAttributes:
    """Attributes as plain Python values (`hidden_size` int, `activations` list of str, ...) -> the
    decoded form with every default filled in; `where` names the node in error messages."""
    if op_type not in OP_TYPES:
        raise InputError(f"{where}: {op_type} is not a recurrent op")
    direction = str(attributes.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise InputError(f"{where}: direction={direction!r} (forward, reverse or bidirectional)")
    if "hidden_size" not in attributes:
        raise InputError(f"{where}: the hidden_size attribute is required here")
    hidden_size = int(attributes["hidden_size"])  # type: ignore[call-overload]
    directions = 2 if direction == "bidirectional" else 1
    default_names = list(DEFAULT_ACTIVATIONS[op_type])
    per_direction = len(default_names)
    names = [str(n).lower() for n in attributes.get("activations") or default_names * directions]  # type: ignore[attr-defined]
    if len(names) != per_direction * directions:
        raise InputError(
            f"{where}: {len(names)} activations for {directions} direction(s); {op_type} takes "
            f"{per_direction} per direction"
        )
    alphas = [float(v) for v in attributes.get("activation_alpha") or []]  # type: ignore[attr-defined]
    betas = [float(v) for v in attributes.get("activation_beta") or []]  # type: ignore[attr-defined]
    decoded: list[Activation] = []
    for name in names:  # alpha / beta are consumed in order by the functions that take them
        if name not in ACTIVATION_DEFAULTS:
            raise InputError(f"{where}: unknown activation {name!r}")
        default_alpha, default_beta = ACTIVATION_DEFAULTS[name]
        alpha = beta = 0.0
        if default_alpha is not None:
            alpha = alphas.pop(0) if alphas else default_alpha
        if default_beta is not None:
            beta = betas.pop(0) if betas else default_beta
        decoded.append(Activation(name, alpha, beta))
    grouped = tuple(tuple(decoded[d * per_direction : (d + 1) * per_direction]) for d in range(directions))
    clip = attributes.get("clip")
    layout = int(attributes.get("layout", 0))  # type: ignore[call-overload]
    if layout not in (0, 1) or (layout == 1 and op_type == "DynamicQuantizeLSTM"):
        raise InputError(f"{where}: layout={layout} is not supported by {op_type}")
    return RecurrentAttributes(
        op_type=op_type,
        hidden_size=hidden_size,
        direction=direction,
        activations=grouped,
        clip=None if clip is None else float(clip),  # type: ignore[arg-type]
        input_forget=bool(int(attributes.get("input_forget", 0))),  # type: ignore[call-overload]
        layout=layout,
        linear_before_reset=bool(int(attributes.get("linear_before_reset", 0))),  # type: ignore[call-overload]
    )


def output_shapes(attributes: RecurrentAttributes, x_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """The shapes of Y, Y_h (and Y_c for LSTMs) for an input X of `x_shape`, in the node's layout."""
    directions, hidden = attributes.num_directions, attributes.hidden_size
    if attributes.layout == 0:
        length, batch = x_shape[0], x_shape[1]
        y, state = (length, directions, batch, hidden), (directions, batch, hidden)
    else:
        batch, length = x_shape[0], x_shape[1]
        y, state = (batch, length, directions, hidden), (batch, directions, hidden)
    return [y, state, state] if attributes.has_cell else [y, state]


class RecurrentMath(Protocol[T]):
    """The arithmetic `run_recurrent` needs, on one executor's values (all float32)."""

    def add(self, a: T, b: T) -> T: ...
    def subtract(self, a: T, b: T) -> T: ...
    def multiply(self, a: T, b: T) -> T: ...
    def divide(self, a: T, b: T) -> T: ...
    def scale(self, a: T, factor: float) -> T: ...  # a * f32(factor)
    def offset(self, a: T, amount: float) -> T: ...  # a + f32(amount)
    def rsub(self, amount: float, a: T) -> T: ...  # f32(amount) - a
    def maximum(self, a: T, bound: float) -> T: ...
    def minimum(self, a: T, bound: float) -> T: ...
    def where_greater(self, a: T, bound: float, then: T, otherwise: T) -> T: ...
    def sigmoid(self, a: T) -> T: ...
    def tanh(self, a: T) -> T: ...
    def exp(self, a: T) -> T: ...
    def log(self, a: T) -> T: ...
    def abs(self, a: T) -> T: ...
    def columns(self, a: T, start: int, size: int) -> T: ...  # a[:, start:start + size]
    def row(self, a: T, index: int) -> T: ...  # a[index]: one direction of a [D, ...] tensor
    def zeros(self, rows: int, columns: int) -> T: ...
    def leading(self, sequence: T, count: int) -> T: ...  # sequence[:count] along the time axis
    def select_rows(self, mask: T, then: T, otherwise: T) -> T: ...  # per row b, mask a row vector
    def stack(self, arrays: Sequence[T], axis: int) -> T: ...  # a new axis
    def transpose(self, a: T, permutation: Sequence[int]) -> T: ...
    def lengths(self, values: list[int]) -> T: ...  # known sequence lengths as this executor's vector
    def length_mask(self, lengths: T, step: int) -> T: ...  # rows with step < length
    def zeros_like(self, a: T) -> T: ...
    def zero_steps_from(self, sequence: T, lengths: T) -> T: ...  # sequence[t] = 0 for t >= max(lengths)
    def scan(
        self,
        inputs: T,
        carried: list[T],
        step: Callable[[T, list[T], T | None], tuple[T, list[T]]],
        backwards: bool,
        lengths: T | None,
        length: int,
    ) -> tuple[T, list[T]]:
        """The loop over time. Step k = 0 .. n-1 (n = len(inputs), the steps that run) calls
        `step(x, carried, active)`: row b's x is `inputs[t_b, b]` and its output goes to `Y[t_b, b]`
        (Y [length, B, H], zero where nothing is written), with t_b = k forwards, and backwards
        `len_b - 1 - k` while the row runs (k < len_b) and k after; `active` is the row mask k < len_b,
        None without `lengths` (every row runs all n = length steps). Returns (Y, final carried)."""
        ...


class Projection(Protocol[T]):
    """The matrix products of one direction: float (`X W^T`) or onnxruntime's dynamically quantized GEMM."""

    def inputs(self, sequence: T) -> T: ...  # [n, B, I] -> X_t W^T for every step, [n, B, gates * H]
    def hidden(self, h: T, onto: T | None, gate: slice | None = None) -> T: ...  # (onto +) H R[gate]^T


@dataclass(slots=True)
class RecurrentInputs(Generic[T]):
    """The node's inputs on one executor, by ONNX name; absent optional inputs None."""

    x: T
    bias: T | None  # [D, 2 * gates * H]
    initial_h: T | None
    initial_c: T | None
    peepholes: T | None  # [D, 3H]
    sequence_lens: (
        np.ndarray | T | None
    )  # known values (a constant, the interpreter's input), or a run-time value
    sequence_length: int
    batch_size: int

    @classmethod
    def by_name(
        cls,
        x: T,
        optional: Callable[[str], T | None],
        sequence_lens: np.ndarray | T | None,
        sequence_length: int,
        batch_size: int,
    ) -> RecurrentInputs[T]:
        """The inputs with the optional ones read by their ONNX input name (`optional("B")`, None when
        absent), so that each executor names them in one place: here."""
        return cls(
            x=x,
            bias=optional("B"),
            initial_h=optional("initial_h"),
            initial_c=optional("initial_c"),
            peepholes=optional("P"),
            sequence_lens=sequence_lens,
            sequence_length=sequence_length,
            batch_size=batch_size,
        )


@dataclass(slots=True)
class RecurrentOutputs(Generic[T]):
    y: T
    y_h: T
    y_c: T | None


def activate(math: RecurrentMath[T], activation: Activation, x: T) -> T:
    """One RNN activation function, by the ONNX operator of that name."""
    name, alpha, beta = activation.name, activation.alpha, activation.beta
    if name == "sigmoid":
        return math.sigmoid(x)
    if name == "tanh":
        return math.tanh(x)
    if name == "relu":
        return math.maximum(x, 0.0)
    if name == "leakyrelu":  # max(x, 0) + alpha * min(x, 0): each term exact where the other is 0
        return math.add(math.maximum(x, 0.0), math.scale(math.minimum(x, 0.0), alpha))
    if name == "thresholdedrelu":
        return math.where_greater(x, alpha, x, math.scale(x, 0.0))
    if name == "elu":  # alpha * (exp(min(x, 0)) - 1) is 0 for x >= 0
        return math.add(
            math.maximum(x, 0.0), math.scale(math.offset(math.exp(math.minimum(x, 0.0)), -1.0), alpha)
        )
    if name == "hardsigmoid":
        return math.maximum(math.minimum(math.offset(math.scale(x, alpha), beta), 1.0), 0.0)
    if name == "affine":
        return math.offset(math.scale(x, alpha), beta)
    if name == "scaledtanh":
        return math.scale(math.tanh(math.scale(x, beta)), alpha)
    if name == "softsign":
        return math.divide(x, math.offset(math.abs(x), 1.0))
    if name == "softplus":
        return math.log(math.offset(math.exp(x), 1.0))
    raise AssertionError(name)


def _clip(math: RecurrentMath[T], x: T, clip: float | None) -> T:
    if clip is None:
        return x
    return math.maximum(math.minimum(x, clip), -clip)


def run_recurrent(
    math: RecurrentMath[T],
    attributes: RecurrentAttributes,
    inputs: RecurrentInputs[T],
    projections: Sequence[Projection[T]],
    *,
    sequence_output: bool = True,
) -> RecurrentOutputs[T]:
    """Run every direction and assemble Y, Y_h (and Y_c for LSTMs) in the node's layout.

    `projections[d]` holds direction d's weights. `sequence_output` says whether the node's Y is
    requested: onnxruntime then feeds rows past their length a zero state in the next product (which
    only the quantized product can see, through its dynamic range), else their last state.
    """
    hidden = attributes.hidden_size
    x = inputs.x if attributes.layout == 0 else math.transpose(inputs.x, (1, 0, 2))
    batch, length = inputs.batch_size, inputs.sequence_length
    lengths: T | None = None  # None: every row runs every step
    longest = length  # the steps that run (onnxruntime computes only those, and quantizes X over them)
    if isinstance(inputs.sequence_lens, np.ndarray):
        known = [int(v) for v in inputs.sequence_lens.reshape(-1)]
        if len(known) != batch or any(not 0 <= v <= length for v in known):
            raise InputError(f"sequence_lens {known} must hold {batch} values in [0, {length}]")
        longest = max(known, default=0)
        if any(v != length for v in known):
            lengths = math.lengths(known)
    elif inputs.sequence_lens is not None:  # known at run time only: every step is looped over
        lengths = inputs.sequence_lens
        # onnxruntime never reads X past max(sequence_lens), nor lets it into X's dynamic quantization
        # range: zeros there leave the range as it is (it always holds 0) and feed only discarded rows.
        x = math.zero_steps_from(x, lengths)
    initial_h = inputs.initial_h
    initial_c = inputs.initial_c
    if attributes.layout == 1:
        initial_h = None if initial_h is None else math.transpose(initial_h, (1, 0, 2))
        initial_c = None if initial_c is None else math.transpose(initial_c, (1, 0, 2))
    ys, hs, cs = [], [], []
    for direction, backwards in enumerate(attributes.reversed_directions):
        h0 = math.zeros(batch, hidden) if initial_h is None else math.row(initial_h, direction)
        bias = None if inputs.bias is None else math.row(inputs.bias, direction)
        c0 = None
        if attributes.has_cell:
            c0 = math.zeros(batch, hidden) if initial_c is None else math.row(initial_c, direction)
        peepholes = None if inputs.peepholes is None else math.row(inputs.peepholes, direction)
        y, h, c = _run_direction(
            math, attributes, attributes.activations[direction], projections[direction], x,
            longest, lengths, length, backwards, h0, c0, bias, peepholes, sequence_output,
        )  # fmt: skip
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y_all = math.stack(ys, 1)  # [T, D, B, H]
    y_h = math.stack(hs, 0)  # [D, B, H]
    y_c = math.stack(cs, 0) if attributes.has_cell else None  # type: ignore[arg-type]
    if attributes.layout == 1:
        y_all = math.transpose(y_all, (2, 0, 1, 3))
        y_h = math.transpose(y_h, (1, 0, 2))
        y_c = None if y_c is None else math.transpose(y_c, (1, 0, 2))
    return RecurrentOutputs(y_all, y_h, y_c)


def lstm_cell(
    math: RecurrentMath[T], attributes: RecurrentAttributes, activations: tuple[Activation, ...], gates: T,
    c: T, fused_bias: T | None, peepholes: T | None,
) -> tuple[T, T]:  # fmt: skip
    """One LSTM step from the summed products `gates` (X_t W^T + H_{t-1} R^T, iofc): (H_t, C_t)."""
    hidden = attributes.hidden_size
    f_act, g_act, h_act = activations

    def gate(index: int, cell: T | None, peephole_index: int | None, count: int = 1) -> T:
        """Gates index .. index + count - 1 (iofc) before their activation: + C P, + bias, clip."""
        value = math.columns(gates, index * hidden, count * hidden)
        if peepholes is not None and peephole_index is not None and cell is not None:
            value = math.add(
                value, math.multiply(cell, math.columns(peepholes, peephole_index * hidden, hidden))
            )
        if fused_bias is not None:
            value = math.add(value, math.columns(fused_bias, index * hidden, count * hidden))
        return _clip(math, value, attributes.clip)

    if peepholes is None:  # i, o, f share f() and none waits for C_t: one call, elementwise the same
        iof = activate(math, f_act, gate(0, None, None, count=3))
        i, o = math.columns(iof, 0, hidden), math.columns(iof, hidden, hidden)
        f = math.rsub(1.0, i) if attributes.input_forget else math.columns(iof, 2 * hidden, hidden)
        g = activate(math, g_act, gate(3, None, None))
        c_new = math.add(math.multiply(c, f), math.multiply(i, g))
        return math.multiply(activate(math, h_act, c_new), o), c_new
    i = activate(math, f_act, gate(0, c, 0))  # iofc; peepholes i, o, f
    f = math.rsub(1.0, i) if attributes.input_forget else activate(math, f_act, gate(2, c, 2))
    g = activate(math, g_act, gate(3, None, None))
    c_new = math.add(math.multiply(c, f), math.multiply(i, g))
    o = activate(math, f_act, gate(1, c_new, 1))
    return math.multiply(activate(math, h_act, c_new), o), c_new


def gru_cell(
    math: RecurrentMath[T], attributes: RecurrentAttributes, activations: tuple[Activation, ...],
    projection: Projection[T], x_gates: T, h: T, bias: T | None,
) -> T:  # fmt: skip
    """One GRU step from X_t W^T (`x_gates`, zrh): H_t."""
    hidden = attributes.hidden_size
    f_act, g_act = activations

    def plus(value: T, *bias_parts: int) -> T:  # + the named parts of B (zrh of Wb, then zrh of Rb)
        for index in bias_parts:
            if bias is not None:
                value = math.add(value, math.columns(bias, index * hidden, hidden))
        return value

    zr = projection.hidden(h, None, slice(0, 2 * hidden))
    z_pre = plus(math.add(math.columns(x_gates, 0, hidden), math.columns(zr, 0, hidden)), 0, 3)
    r_pre = plus(math.add(math.columns(x_gates, hidden, hidden), math.columns(zr, hidden, hidden)), 1, 4)
    z = activate(math, f_act, _clip(math, z_pre, attributes.clip))
    r = activate(math, f_act, _clip(math, r_pre, attributes.clip))
    x_h = math.columns(x_gates, 2 * hidden, hidden)
    if attributes.linear_before_reset:
        recurrent = plus(projection.hidden(h, None, slice(2 * hidden, 3 * hidden)), 5)
        h_pre = plus(math.add(x_h, math.multiply(r, recurrent)), 2)
    else:
        recurrent = projection.hidden(math.multiply(r, h), None, slice(2 * hidden, 3 * hidden))
        h_pre = plus(math.add(x_h, recurrent), 5, 2)
    candidate = activate(math, g_act, _clip(math, h_pre, attributes.clip))
    return math.add(math.multiply(math.rsub(1.0, z), candidate), math.multiply(z, h))


def rnn_cell(
    math: RecurrentMath[T], attributes: RecurrentAttributes, activations: tuple[Activation, ...],
    projection: Projection[T], x_gates: T, h: T, bias: T | None,
) -> T:  # fmt: skip
    """One RNN step: `H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`."""
    hidden = attributes.hidden_size
    value = projection.hidden(h, x_gates)
    if bias is not None:
        value = math.add(value, math.add(math.columns(bias, 0, hidden), math.columns(bias, hidden, hidden)))
    return activate(math, activations[0], _clip(math, value, attributes.clip))


def _run_direction(
    math: RecurrentMath[T], attributes: RecurrentAttributes, activations: tuple[Activation, ...],
    projection: Projection[T], x: T, longest: int, lengths: T | None, length: int, backwards: bool, h: T,
    c: T | None, bias: T | None, peepholes: T | None, sequence_output: bool,
) -> tuple[T, T, T | None]:  # fmt: skip
    """One direction over the `longest` steps that run of X's `length`: (Y [T, B, H] in
    time order, final H, final C or None). With `lengths`, row b runs its first `len_b` steps (backwards
    from time `len_b - 1` in reverse); its Y is zero after, its state held."""
    hidden = attributes.hidden_size
    zeros = math.zeros_like(h)
    fused_bias = bias  # LSTM: Wb + Rb, summed once, as onnxruntime does
    if attributes.has_cell and bias is not None:
        fused_bias = math.add(math.columns(bias, 0, 4 * hidden), math.columns(bias, 4 * hidden, 4 * hidden))

    def cell(x_gates: T, states: list[T]) -> tuple[T, list[T]]:
        """One step from the states the products read: [H] (GRU, RNN) or [H, C] (LSTM)."""
        if attributes.op_type == "RNN":
            h_new = rnn_cell(math, attributes, activations, projection, x_gates, states[0], bias)
            return h_new, [h_new]
        if not attributes.has_cell:
            h_new = gru_cell(math, attributes, activations, projection, x_gates, states[0], bias)
            return h_new, [h_new]
        gates = projection.hidden(states[0], x_gates)
        h_new, c_new = lstm_cell(math, attributes, activations, gates, states[1], fused_bias, peepholes)
        return h_new, [h_new, c_new]

    def step(x_gates: T, carried: list[T], active: T | None) -> tuple[T, list[T]]:
        """`carried` = [H as the next product reads it (onnxruntime's buffer), H, (C)]."""
        visible, *states = carried
        output, new_states = cell(x_gates, [visible, *states[1:]])
        if active is None:
            return output, [output, *new_states]
        new_states = [math.select_rows(active, new, old) for new, old in zip(new_states, states, strict=True)]
        output = math.select_rows(active, output, zeros)
        return output, [output if sequence_output else new_states[0], *new_states]

    states = [h] if c is None else [h, c]
    if longest == 0:  # every row has length 0
        y = math.stack([zeros] * length, 0)
        carried = [h, *states]
    else:
        projected = projection.inputs(math.leading(x, longest))  # X_t W^T of the steps that run, in one go
        y, carried = math.scan(projected, [h, *states], step, backwards, lengths, length)
    final = carried[1:]
    if lengths is not None:  # rows of length 0 end with zero states (onnxruntime)
        ran = math.length_mask(lengths, 0)
        final = [math.select_rows(ran, state, zeros) for state in final]
    return y, final[0], (final[1] if attributes.has_cell else None)


__all__ = [
    "ACTIVATION_DEFAULTS",
    "OP_TYPES",
    "Activation",
    "Projection",
    "RecurrentAttributes",
    "RecurrentInputs",
    "RecurrentMath",
    "RecurrentOutputs",
    "activate",
    "gru_cell",
    "lstm_cell",
    "decode_attributes",
    "op_attributes",
    "output_shapes",
    "rnn_cell",
    "run_recurrent",
]

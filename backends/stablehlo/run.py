"""Run StableHLO text on the engines jaxlib ships: its MLIR verifier, the StableHLO reference
interpreter (`stablehlo.eval_module`) and XLA:CPU.

jax is imported lazily, on first use, so this module imports without the `stablehlo` extra; using it
then raises an `InputError` that says which extra to install.

Facts about jaxlib 0.10.2 this module relies on (see ../shared/engines/README.md); what the conversion
must write otherwise for these engines is their profile, `engine_profile.JAXLIB`:
- jaxlib's Python context does not register the `quant` dialect; deserializing a portable artifact
  that uses a quant type loads it. We do that once and keep the context (`_context`).
- XLA rejects quant types ("can't be translated to XLA HLO"): `run_xla` first applies
  `stablehlo-legalize-quant-to-math`, which leaves `chlo` ops that XLA accepts.
- XLA:CPU's simplifier rewrites `x / c` and `x / broadcast(y)` (also `x / exp(y)`, nested divisions) into
  a multiplication by a reciprocal, an ulp off for many x. `run_xla` puts every floating-point division's
  operands behind an `optimization_barrier` (`_divide_as_specified`), so XLA:CPU executes the program's
  StableHLO semantics (divide correctly rounded, as the interpreter and onnxruntime); whoever compiles
  our output with XLA directly gets XLA's reciprocal rewrite wherever the program has no barrier.
- XLA:CPU has no fast kernel for integer (nor f64) convolutions (a 512-channel k3 layer: ~1 s per run, f32
  8 ms). `run_xla` runs an integer convolution as f32 convolutions of base-2**b digits and an integer
  dot_general in f64, where the sums provably stay exact (`_fast_integer_products`: the same i32 result);
  the artifact keeps its i32 arithmetic.
- `DenseElementsAttr` converts to numpy only for byte-sized integers and f16/f32/f64; other element
  types (i4, i2, bf16, f8…) go through their printed form and qconvert's attribute parser.
- Quant storage spelled `u8` (`!quant.uniform<u8:f32, ...>`) is parsed as signless i8, so both the
  interpreter and quant-to-math treat it as signed: values clamp at 127 and a zero point of 128 reads as
  -128 (llvm/llvm-project#185952; xfails in tests/unit/test_numerics.py and test_run.py). Spelled `ui8`
  it is unsigned on both engines. Plain `ui8` tensors are unsigned everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

from qconvert.errors import InputError, QConvertError, VerifyError

ENTRY = "main"
QUANT_TO_MATH = "builtin.module(func.func(stablehlo-legalize-quant-to-math))"

# A module that uses a quant type; deserializing its portable artifact loads the quant dialect.
_BOOTSTRAP = """module {
  func.func @bootstrap(%x: tensor<1xf32>) -> tensor<1xf32> {
    %q = stablehlo.uniform_quantize %x : (tensor<1xf32>) -> tensor<1x!quant.uniform<i8:f32, 1.0:0>>
    %y = stablehlo.uniform_dequantize %q : (tensor<1x!quant.uniform<i8:f32, 1.0:0>>) -> tensor<1xf32>
    return %y : tensor<1xf32>
  }
}"""

CHLO_TO_STABLEHLO = "builtin.module(func.func(chlo-legalize-to-stablehlo))"
_QUANT_TYPE = re.compile(r"!quant\.")
_CHLO_OP = re.compile(r"\bchlo\.")
_SUB_BYTE_DTYPES = {
    "i4": ml_dtypes.int4,
    "ui4": ml_dtypes.uint4,
    "i2": ml_dtypes.int2,
    "ui2": ml_dtypes.uint2,
}


class EngineError(QConvertError):
    """The engine failed while running a module that verified (exit code 1: the check failed)."""

    exit_code = 1


@dataclass(frozen=True)
class _Jax:
    """The jax/jaxlib modules this runner uses, imported once."""

    jax: ModuleType
    ir: Any
    passmanager: Any
    stablehlo: Any
    backend: Any
    xla_client: Any
    make_ir_context: Any


@functools.cache
def _jax() -> _Jax:
    try:
        import jax
        import jax._src.interpreters.mlir as jax_mlir
        from jax._src.lib import xla_client
        from jax.extend import backend
        from jaxlib.mlir import ir, passmanager
        from jaxlib.mlir.dialects import stablehlo
    except ImportError as e:
        raise InputError(
            f"the StableHLO engines need jax and jaxlib ({e}); "
            "install them with `pip install 'qconvert[stablehlo]'`"
        ) from None
    return _Jax(jax, ir, passmanager, stablehlo, backend, xla_client, jax_mlir.make_ir_context)


@functools.cache
def _context() -> Any:
    """jaxlib's MLIR context with the quant dialect loaded and the StableHLO passes registered."""
    jx = _jax()
    context = jx.make_ir_context()
    artifact = jx.stablehlo.serialize_portable_artifact_str(_BOOTSTRAP, jx.stablehlo.get_current_version())
    jx.stablehlo.deserialize_portable_artifact(context, artifact)
    context.dialects["quant"]  # raises if the bootstrap stopped loading it
    jx.stablehlo.register_stablehlo_passes()
    return context


def _diagnostic_text(error: Exception) -> str:
    """jaxlib's diagnostics, one per line, with their notes (MLIRError keeps them structured)."""
    diagnostics = getattr(error, "error_diagnostics", None)
    if not diagnostics:
        return str(error).strip()
    lines: list[str] = []

    def add(diagnostic: Any, indent: str) -> None:
        lines.append(f"{indent}{diagnostic.location}: {diagnostic.message}")
        for note in diagnostic.notes:
            add(note, indent + "  ")

    for diagnostic in diagnostics:
        add(diagnostic, "")
    return "\n".join(lines)


def _parse(text: str) -> Any:
    """Parse and verify `text` in the cached context; jaxlib's diagnostics become a VerifyError."""
    jx = _jax()
    context = _context()
    with context:
        try:
            module = jx.ir.Module.parse(text)
        except jx.ir.MLIRError as e:
            # Module.parse verifies too, so most invalid modules fail here.
            raise VerifyError(f"jaxlib rejected the StableHLO module:\n{_diagnostic_text(e)}") from None
        try:
            module.operation.verify()
        except jx.ir.MLIRError as e:
            raise VerifyError(
                f"jaxlib's verifier rejected the StableHLO module:\n{_diagnostic_text(e)}"
            ) from None
    return module


def verify(text: str) -> None:
    """Parse and verify StableHLO text in jaxlib's MLIR context (quant dialect loaded)."""
    _parse(text)


def uses_quant_types(text: str) -> bool:
    return _QUANT_TYPE.search(text) is not None


def _run_pass(module: Any, pipeline: str, name: str) -> None:
    """Run a pass pipeline on `module` in place (inside the cached context); failures are EngineErrors."""
    jx = _jax()
    try:
        jx.passmanager.PassManager.parse(pipeline).run(module.operation)
    except jx.ir.MLIRError as e:
        raise EngineError(f"{name} failed:\n{_diagnostic_text(e)}") from None


def legalize_quant_to_math(text: str) -> str:
    """Apply `stablehlo-legalize-quant-to-math`: quant-typed ops become integer/float StableHLO and CHLO."""
    module = _parse(text)
    with _context():
        _run_pass(module, QUANT_TO_MATH, "stablehlo-legalize-quant-to-math")
        return str(module)


# --- XLA: divisions as the spec says ------------------------------------------------------------------


def _broadcast_to(value: Any, result_type: Any, dimensions: Sequence[int] | None) -> Any:
    """`value` broadcast to `result_type` as chlo's implicit broadcasting does: along `dimensions` when
    given, else aligned to the trailing dimensions (numpy's rule)."""
    jx = _jax()
    if value.type == result_type:
        return value
    rank = jx.ir.RankedTensorType(value.type).rank
    result_rank = jx.ir.RankedTensorType(result_type).rank
    mapped = list(dimensions) if dimensions is not None else list(range(result_rank - rank, result_rank))
    return jx.stablehlo.BroadcastInDimOp(result_type, value, mapped).result


def _expand_broadcast_divide(op: Any) -> Any | None:
    """Replace a static-shaped `chlo.broadcast_divide` by explicit broadcasts and a `stablehlo.divide`
    (what XLA would lower it to) and return the new divide; None (op kept) for dynamic shapes.

    Only this chlo op is legalized: `chlo-legalize-to-stablehlo` would also rewrite ops XLA implements
    natively (chlo.erf becomes a polynomial whose results differ from XLA's erf in the last bits)."""
    jx = _jax()
    result_type = op.results[0].type
    lhs, rhs = op.operands
    values = (lhs, rhs, op.results[0])
    if not all(isinstance(v.type, jx.ir.RankedTensorType) and v.type.has_static_shape for v in values):
        return None
    # chlo's broadcast_dimensions map the lower-rank operand into the higher-rank one.
    dimensions = None
    if "broadcast_dimensions" in op.attributes:
        dimensions = list(jx.ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    lhs_rank, rhs_rank = (jx.ir.RankedTensorType(v.type).rank for v in (lhs, rhs))
    with jx.ir.InsertionPoint(op), op.location:
        lhs = _broadcast_to(lhs, result_type, dimensions if lhs_rank < rhs_rank else None)
        rhs = _broadcast_to(rhs, result_type, dimensions if rhs_rank < lhs_rank else None)
        divide = jx.stablehlo.DivOp(lhs, rhs, results=[result_type])
    op.results[0].replace_all_uses_with(divide.result)
    op.erase()
    return divide.operation


def _divide_as_specified(module: Any) -> None:
    """Put each floating-point division's operands behind one `stablehlo.optimization_barrier`.

    XLA:CPU's algebraic simplifier turns `x / c` and `x / broadcast(y)` into `x * (1 / …)` (an ulp off
    for many x, which moves quantize ties), and also rewrites `x / exp(y)`, `x / pow(y, z)` and, looking at
    the dividend, `(x / y) / z` into `x / (y * z)`; it cannot see through a barrier, so each division stays
    one correctly rounded divide, as the StableHLO spec (and the interpreter, and onnxruntime) compute it.
    Integer division is left alone: XLA keeps it exact. `stablehlo-legalize-quant-to-math` emits
    `chlo.broadcast_divide(x, scale)`, which is first expanded so the barrier sits between the broadcast
    and the divide (a dynamic-shaped one is left to XLA).
    """
    jx = _jax()
    chlo_divides: list[Any] = []
    divides: list[Any] = []

    def collect(op: Any) -> Any:
        if op.name == "chlo.broadcast_divide":
            chlo_divides.append(op)
        elif op.name == "stablehlo.divide":
            divides.append(op)
        return jx.ir.WalkResult.ADVANCE

    module.operation.walk(collect)  # collect first: the rewrites below would disturb the walk
    divides += [d for d in map(_expand_broadcast_divide, chlo_divides) if d is not None]
    for op in divides:
        element_type = jx.ir.ShapedType(op.results[0].type).element_type
        if isinstance(element_type, jx.ir.IntegerType):
            continue
        with jx.ir.InsertionPoint(op), op.location:
            barrier = jx.stablehlo.OptimizationBarrierOp(list(op.operands))
        for index, value in enumerate(barrier.results):
            op.operands[index] = value


# --- XLA: integer products through f64 ----------------------------------------------------------------

# Below 2**53 every partial sum of integer products is an integer f64 holds exactly, in any order.
_F64_EXACT = 2**53
_F32_EXACT = 2**24
_MOST_DIGITS = 4  # beyond this many f32 convolutions, the i32 one is left to XLA
_I32_MAX = 2**31 - 1
# Ops whose result's values are some of their operands' values (the bound carries over unchanged).
_VALUE_PRESERVING = frozenset(
    {
        "stablehlo.broadcast_in_dim",
        "stablehlo.reshape",
        "stablehlo.transpose",
        "stablehlo.slice",
        "stablehlo.reverse",
        "stablehlo.pad",
        "stablehlo.concatenate",
        "stablehlo.convert",
        "stablehlo.dynamic_slice",
        "stablehlo.gather",
        "stablehlo.select",
    }
)


def _type_bound(element_type: Any) -> int | None:
    """The largest magnitude an integer element type holds (None: not an integer)."""
    jx = _jax()
    if not isinstance(element_type, jx.ir.IntegerType):
        return None
    integer = jx.ir.IntegerType(element_type)
    return 2**integer.width - 1 if integer.is_unsigned else 2 ** (integer.width - 1)


def _magnitude_bound(value: Any, memo: dict[Any, int | None]) -> int | None:
    """An upper bound of |x| over the integer tensor `value`, from its producers: the storage type of what
    was widened (`convert` of an i8), a constant's values, sums of bounds through add / subtract, and
    unchanged through ops that move values around; else its element type's range. None: not an integer."""
    jx = _jax()
    if value in memo:
        return memo[value]
    memo[value] = None  # a cycle cannot occur in SSA, but a re-entry must not recurse forever
    bound = _type_bound(jx.ir.ShapedType(value.type).element_type)
    owner = value.owner
    if bound is not None and isinstance(owner, jx.ir.OpView | jx.ir.Operation):
        operation = owner.operation
        name = operation.name
        operands = list(operation.operands)
        if name == "stablehlo.constant":
            array = np.abs(np.asarray(attribute_to_numpy(operation.attributes["value"]), np.int64))
            bound = min(bound, int(array.max(initial=0)))
        elif name in _VALUE_PRESERVING:
            if name in ("stablehlo.select",):
                operands = operands[1:]  # the predicate is not a value of the result
            elif name in ("stablehlo.dynamic_slice", "stablehlo.gather"):
                operands = operands[:1]  # indices are not values of the result
            bounds = [_magnitude_bound(operand, memo) for operand in operands]
            if bounds and all(b is not None for b in bounds):
                bound = min(bound, max(bounds))  # type: ignore[type-var]
        elif name in ("stablehlo.add", "stablehlo.subtract"):
            bounds = [_magnitude_bound(operand, memo) for operand in operands]
            if all(b is not None for b in bounds):
                bound = min(bound, sum(bounds))  # type: ignore[arg-type]
    memo[value] = bound
    return bound


def _reduction_length(op: Any) -> int:
    """How many products one result element of an integer convolution / dot_general sums."""
    jx = _jax()
    lhs_shape = jx.ir.RankedTensorType(op.operands[0].type).shape
    rhs_shape = jx.ir.RankedTensorType(op.operands[1].type).shape
    if op.name == "stablehlo.convolution":
        numbers = jx.stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        # input features per group x kernel window: the kernel's size over its output features
        return int(np.prod(rhs_shape, dtype=np.int64)) // rhs_shape[numbers.kernel_output_feature_dimension]
    numbers = jx.stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    return int(np.prod([lhs_shape[d] for d in numbers.lhs_contracting_dimensions], dtype=np.int64))


def _f32_digit_plan(length: int, bounds: Sequence[int]) -> tuple[int, int, list[int]] | None:
    """How to split one operand of an integer convolution into base-2**bits digits so that each digit's
    f32 convolution sums integers below 2**24 (exact in f32): (operand index, bits, each digit's
    magnitude bound), the fewest digits of either operand; None when more than `_MOST_DIGITS` are needed."""
    best: tuple[int, int, list[int]] | None = None
    for index in (0, 1):
        other = bounds[1 - index]
        largest_digit = (_F32_EXACT - 1) // max(length * other, 1)  # a digit's magnitude may reach this
        if largest_digit < 1:
            continue
        bits = largest_digit.bit_length() - 1 if largest_digit < 2**31 else 30
        if bits < 1:
            digits = [bounds[index]] if bounds[index] <= largest_digit else []
        else:
            digits, rest = [], bounds[index]
            while rest > largest_digit and len(digits) <= _MOST_DIGITS:
                digits.append(2**bits - 1)  # the low digit: a & (2**bits - 1)
                rest = -(-rest // 2**bits)  # |a >> bits| <= ceil(|a| / 2**bits)
            digits.append(rest)
        if not digits or len(digits) > _MOST_DIGITS:
            continue
        if best is None or len(digits) < len(best[2]):
            best = (index, bits, digits)
    return best


def _integer_convolution_in_f32(op: Any, plan: tuple[int, int, list[int]]) -> Any:
    """`op` (an integer convolution) as f32 convolutions of one operand's base-2**bits digits with the
    other operand, each exact (`_f32_digit_plan`), converted to i32 and summed shifted back into place:
    i32 arithmetic, so the sum equals the i32 convolution's (wrapping alike). Returns the result value."""
    jx = _jax()
    index, bits, digits = plan
    result_type = jx.ir.RankedTensorType(op.results[0].type)
    i32 = jx.ir.IntegerType.get_signless(32)
    f32 = jx.ir.F32Type.get()

    def retyped(value: Any, element: Any) -> Any:
        shape = jx.ir.RankedTensorType(value.type).shape
        return jx.stablehlo.ConvertOp(jx.ir.RankedTensorType.get(shape, element), value).result

    def splat(like: Any, number: int) -> Any:
        tensor_type = jx.ir.RankedTensorType(like.type)
        attribute = jx.ir.DenseElementsAttr.get_splat(tensor_type, jx.ir.IntegerAttr.get(i32, number))
        return jx.stablehlo.ConstantOp(attribute).result

    operands = list(op.operands)
    rest = operands[index]
    if jx.ir.RankedTensorType(rest.type).element_type != i32:
        rest = retyped(rest, i32)  # exact: the plan bounded its magnitude well below 2**31
    pieces: list[Any] = []
    for _ in digits[:-1]:
        pieces.append(jx.stablehlo.AndOp(rest, splat(rest, 2**bits - 1)).result)
        rest = jx.stablehlo.ShiftRightArithmeticOp(rest, splat(rest, bits)).result
    pieces.append(rest)
    other = retyped(operands[1 - index], f32)
    total = None
    for position, piece in enumerate(pieces):
        convolved_operands = [retyped(piece, f32), other] if index == 0 else [other, retyped(piece, f32)]
        product = jx.ir.Operation.create(
            op.name,
            results=[jx.ir.RankedTensorType.get(result_type.shape, f32)],
            operands=convolved_operands,
            attributes={name: op.attributes[name] for name in op.attributes},
        ).result
        term = retyped(product, i32)
        if position:
            term = jx.stablehlo.ShiftLeftOp(term, splat(term, bits * position)).result
        total = term if total is None else jx.stablehlo.AddOp(total, term).result
    assert total is not None
    return total if result_type.element_type == i32 else retyped(total, result_type.element_type)


def _integer_product_in_f64(op: Any, largest_sum: int) -> Any:
    """`op` (an integer dot_general) computed in f64 (exact below 2**53) and converted back."""
    jx = _jax()
    result_type = jx.ir.RankedTensorType(op.results[0].type)
    f64 = jx.ir.F64Type.get()
    operands = [
        jx.stablehlo.ConvertOp(
            jx.ir.RankedTensorType.get(jx.ir.RankedTensorType(o.type).shape, f64), o
        ).result
        for o in op.operands
    ]
    product = jx.ir.Operation.create(
        op.name,
        results=[jx.ir.RankedTensorType.get(result_type.shape, f64)],
        operands=operands,
        attributes={name: op.attributes[name] for name in op.attributes},
    ).result
    if largest_sum > _I32_MAX and jx.ir.IntegerType(result_type.element_type).width < 64:
        # f64 -> i64 is exact here; i64 -> i32 truncates, i.e. wraps like an i32 accumulator
        wide = jx.ir.RankedTensorType.get(result_type.shape, jx.ir.IntegerType.get_signless(64))
        product = jx.stablehlo.ConvertOp(wide, product).result
    return jx.stablehlo.ConvertOp(result_type, product).result


def _fast_integer_products(module: Any) -> int:
    """Run XLA:CPU's fast float kernels for the integer `convolution` / `dot_general` ops (i32 result)
    whose sums provably stay exact in floating point, from the reduction length and the operands'
    magnitude bounds (`_magnitude_bound`):

    - a convolution as f32 convolutions of one operand split into base-2**b digits, each digit's sums
      below 2**24, recombined by i32 shifts and adds (`_integer_convolution_in_f32`; measured on XLA:CPU,
      512 channels x k3 x 256 frames: i32 0.86 s, f64 1.46 s, f32 8 ms per convolution);
    - a dot_general in f64 when its sums stay below 2**53 (i32 13 ms, f64 7 ms for the same size).

    Exact, not approximate: every product and partial sum is an integer the float type represents
    exactly, whatever the summation order. The artifact keeps its i32 arithmetic; only XLA's copy changes.
    Returns how many ops were rewritten."""
    jx = _jax()
    candidates: list[Any] = []

    def collect(op: Any) -> Any:
        if op.name in ("stablehlo.convolution", "stablehlo.dot_general"):
            candidates.append(op)
        return jx.ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    memo: dict[Any, int | None] = {}
    rewritten = 0
    for op in candidates:
        values = [*op.operands, op.results[0]]
        if len(op.operands) != 2 or not all(
            isinstance(v.type, jx.ir.RankedTensorType) and v.type.has_static_shape for v in values
        ):
            continue
        result_type = jx.ir.RankedTensorType(op.results[0].type)
        if _type_bound(result_type.element_type) is None:
            continue  # a float product: XLA's own kernels already
        bounds = [_magnitude_bound(operand, memo) for operand in op.operands]
        if any(b is None for b in bounds):
            continue
        length = _reduction_length(op)
        with jx.ir.InsertionPoint(op), op.location:
            if op.name == "stablehlo.convolution":
                i32_result = result_type.element_type == jx.ir.IntegerType.get_signless(32)
                plan = _f32_digit_plan(length, bounds) if i32_result else None  # type: ignore[arg-type]
                if plan is None:
                    continue
                result = _integer_convolution_in_f32(op, plan)
            else:
                largest_sum = length * bounds[0] * bounds[1]  # type: ignore[operator]
                if largest_sum >= _F64_EXACT:
                    continue
                result = _integer_product_in_f64(op, largest_sum)
        op.results[0].replace_all_uses_with(result)
        op.erase()
        rewritten += 1
    return rewritten


# --- numpy <-> MLIR attributes (the interpreter's values) ---------------------------------------------


def _entry_type(module: Any, entry: str) -> Any:
    """The entry function's FunctionType."""
    jx = _jax()
    for op in module.body.operations:
        if op.operation.name == "func.func" and jx.ir.StringAttr(op.attributes["sym_name"]).value == entry:
            return jx.ir.FunctionType(jx.ir.TypeAttr(op.attributes["function_type"]).value)
    raise InputError(f"the StableHLO module has no function @{entry}")


def _to_attribute(array: np.ndarray, tensor_type: Any, position: int) -> Any:
    """A DenseElementsAttr of the function's argument type holding `array`'s values.

    The buffer is reinterpreted, not converted: the argument's element type decides (so `ui8`, `i4`
    stored one per byte, `bf16` as 16-bit words all work), and a size mismatch is an InputError.
    """
    jx = _jax()
    ranked = jx.ir.RankedTensorType(tensor_type)
    element_type = ranked.element_type
    if list(array.shape) != list(ranked.shape):
        raise InputError(f"input {position}: shape {list(array.shape)} does not match {tensor_type}")
    array = np.require(array, requirements="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    if array.dtype == np.bool_:
        buffer = array
    else:
        width = array.dtype.itemsize
        buffer = array.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
    try:
        return jx.ir.DenseElementsAttr.get(buffer, type=element_type, shape=list(array.shape))
    except ValueError as e:
        raise InputError(
            f"input {position}: a {array.dtype} array cannot be passed as {tensor_type}: {e}"
        ) from None


def attribute_to_numpy(attribute: Any) -> np.ndarray:
    """A jaxlib DenseElementsAttr as a numpy array; element types numpy's buffer protocol lacks (i4, i2,
    bf16, f8) are read from the printed attribute by qconvert's parser, which maps them to ml_dtypes."""
    shaped = _jax().ir.ShapedType(attribute.type)
    element = str(shaped.element_type)
    sub_byte = _SUB_BYTE_DTYPES.get(element)
    if sub_byte is None:
        try:
            return np.array(attribute).reshape(shaped.shape)
        except (RuntimeError, TypeError, ValueError):
            pass
    if sub_byte is not None and 0 in shaped.shape:
        return np.zeros(shaped.shape, sub_byte)  # qconvert's parser fails on an empty sub-byte `dense<>`
    from qconvert.ir.attribute_parser import AttributeParser
    from qconvert.ir.attributes import DenseElementsAttr

    parsed = AttributeParser(str(attribute)).parse_attribute()
    assert isinstance(parsed, DenseElementsAttr), f"not a dense attribute: {attribute}"
    array = np.array(parsed.array).reshape(shaped.shape)  # `dense<>` parses flat
    # The parser keeps sub-byte integers in int8/uint8; XLA returns ml_dtypes' int4 & co: agree with XLA.
    return array.astype(sub_byte) if sub_byte is not None else array


# --- engines ------------------------------------------------------------------------------------------


def run_interpreter(text: str, inputs: Sequence[np.ndarray], entry: str = ENTRY) -> list[np.ndarray]:
    """Run `entry` of `text` on the StableHLO reference interpreter (quant types run natively)."""
    jx = _jax()
    module = _parse(text)
    with _context():
        if _CHLO_OP.search(text):
            # The interpreter aborts the process ("LLVM ERROR: Unsupported op") on chlo ops such as
            # chlo.erf; StableHLO's interpreter pipeline legalizes them first.
            try:
                jx.passmanager.PassManager.parse(CHLO_TO_STABLEHLO).run(module.operation)
            except jx.ir.MLIRError as e:
                raise EngineError(f"chlo-legalize-to-stablehlo failed:\n{_diagnostic_text(e)}") from None
        function_type = _entry_type(module, entry)
        types = list(function_type.inputs)
        if len(types) != len(inputs):
            raise InputError(f"@{entry} takes {len(types)} inputs, {len(inputs)} given")
        for result_type in function_type.results:
            # eval_module computes complex results, then aborts the whole process (an uncaught C++
            # exception) converting them back to Python: refuse before running.
            if "complex<" in str(result_type):
                raise EngineError(
                    f"@{entry} returns {result_type}: jaxlib's eval_module aborts the process on complex "
                    "results; return stablehlo.real and stablehlo.imag of it instead"
                )
        arguments = [_to_attribute(np.asarray(a), t, i) for i, (a, t) in enumerate(zip(inputs, types))]
        try:
            results = jx.stablehlo.eval_module(module, arguments)
        except Exception as e:  # jaxlib raises a bare RuntimeError("interpreter failed") after printing
            raise EngineError(f"the StableHLO interpreter failed on @{entry}: {e}") from None
        return [attribute_to_numpy(r) for r in results]


class _ExecutableCache:
    """Compiled XLA executables by module text; compiling dominates small runs."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self.entries: OrderedDict[str, Any] = OrderedDict()

    def get(self, text: str) -> Any:
        """The executable of `text` (keyed by the text before quant-to-math, so a hit skips that too)."""
        key = hashlib.sha256(text.encode()).hexdigest()
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        executable = _compile(xla_text(text))
        self.entries[key] = executable
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return executable


def _compile(text: str) -> Any:
    jx = _jax()
    cpu = jx.backend.get_backend("cpu")
    device = cpu.local_devices()[0]
    try:
        return cpu.compile_and_load(text, jx.xla_client.DeviceList((device,)), jx.xla_client.CompileOptions())
    except Exception as e:  # XlaRuntimeError
        raise EngineError(f"XLA:CPU could not compile the module: {e}") from None


_EXECUTABLES = _ExecutableCache()


def xla_text(text: str) -> str:
    """The text XLA compiles: verified, quant types legalized to math when there are any, and every
    floating-point division made to divide as the spec says (`_divide_as_specified`)."""
    module = _parse(text)
    with _context():
        if uses_quant_types(text):
            _run_pass(module, QUANT_TO_MATH, "stablehlo-legalize-quant-to-math")
        _divide_as_specified(module)
        _fast_integer_products(module)
        return str(module)


def run_xla(text: str, inputs: Sequence[np.ndarray], entry: str = ENTRY) -> list[np.ndarray]:
    """Compile `text` on XLA:CPU (after quant-to-math when it has quant types, with divisions made exact:
    `xla_text`) and run it.

    XLA compiles the function named `main`; inputs are numpy arrays of the argument types (ml_dtypes for
    int4/bf16/…); outputs come back as numpy arrays of the result types.
    """
    if entry != ENTRY:
        raise InputError(f"XLA runs the function @{ENTRY}, not @{entry}")
    return _execute(_EXECUTABLES.get(text), inputs)


def _execute(executable: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a compiled XLA:CPU executable on numpy inputs."""
    jx = _jax()
    device = jx.backend.get_backend("cpu").local_devices()[0]
    try:
        # Without x64, device_put would narrow i64/f64 inputs to 32 bits.
        with jx.jax.enable_x64(True):
            arguments = [jx.jax.device_put(np.asarray(a), device) for a in inputs]
        outputs = executable.execute(arguments)
    except Exception as e:
        raise EngineError(f"XLA:CPU failed to run the module: {e}") from None
    return [np.asarray(o) for o in outputs]


def run(text: str, inputs: Sequence[np.ndarray], engine: str = "xla") -> list[np.ndarray]:
    """Run on `engine` ("interpreter" or "xla")."""
    if engine == "interpreter":
        return run_interpreter(text, inputs)
    if engine == "xla":
        return run_xla(text, inputs)
    raise InputError(f"unknown StableHLO engine {engine!r}: expected 'interpreter' or 'xla'")

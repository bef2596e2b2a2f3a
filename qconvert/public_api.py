"""The Python API's verbs: `qconvert.calibrate(...)`, `qconvert.check(...)`, `qconvert.convert(...)`, ...

Each verb shares its name with the package or module that implements it (qconvert/calibrate/,
qconvert/check/, qconvert/convert.py, qconvert/run.py), and Python binds `qconvert.calibrate` to that
package as soon as anything imports it. So the package itself is made callable: each one calls
`make_callable(__name__, ...)` when it is imported, which gives it the class `CallableModule`; calling it
runs the verb's function, with the function's signature for `help()` and notebooks' completion.

Errors raised through the API speak of parameters, not of command-line flags: the functions are shared
with the CLI and name its flags (`--method entropi: unknown calibration method`); `in_parameters`
rewrites those to the parameter the caller passed (`method entropi: ...`).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from collections.abc import Mapping
from typing import Any

from qconvert.errors import QConvertError

# Per verb: a flag -> the parameter that carries it, where the name differs beyond dashes and underscores.
PARAMETERS: dict[str, dict[str, str]] = {
    "calibrate": {
        "-o/--output": "out",
        "--output": "out",
        "--out": "out",
        "--ranges": "ranges_path",
        "--json": "json_path",
        "--executor": "engine",
        "--evaluate": "evaluate_samples",
        "--worst-tensors": "evaluate_tensors",
        "--target-output": "target_outputs",
        "--target-metric": "target_metrics",
        "--sentinel-override": "sentinel_overrides",
        "--num-bins": "method_options['num_bins']",
        "--num-quantized-bins": "method_options['num_quantized_bins']",
        "--percentile": "method_options['percentile']",
        "--activation-type": "scheme['activation_type']",
        "--weight-type": "scheme['weight_type']",
        "--per-channel": "scheme['per_channel']",
        "--per-tensor-weights": "scheme['per_channel']",
        "--block-size": "scheme['block_size']",
        "--reduce-range": "scheme['reduce_range']",
        "--float8-scale": "scheme['float8_scale']",
        "--symmetric-activations": "scheme['activation_symmetric']",
        "--asymmetric-weights": "scheme['weight_symmetric']",
        "--op-types": "scheme['op_types_to_quantize']",
        "--exclude-op-types": "scheme['op_types_to_exclude']",
        "--nodes": "scheme['nodes_to_quantize']",
        "--exclude-nodes": "scheme['nodes_to_exclude']",
        "--overrides": "scheme['tensor_overrides']",
    },
    "check": {
        "--data": "inputs",
        "--input-shape": "input_shapes",
        "--json": "the report's write_json",
        "--quiet": "show_progress",
        "--atol": "tolerances.atol",
        "--rtol": "tolerances.rtol",
        "--max-lsb": "tolerances.max_lsb",
        "--max-mismatch-fraction": "tolerances.max_mismatch_fraction",
        "--min-sqnr": "tolerances.min_sqnr",
    },
    "convert": {"--input-shape": "input_shapes"},
    "import_onnx": {"--input-shape": "input_shapes"},
    "run": {},
}
_FLAG = re.compile(r"(?<![\w-])(-o/--output|--[a-z][a-z0-9-]*)(?![\w-])")


def in_parameters(message: str, verb: str) -> str:
    """`message` with each command-line flag named as the parameter of `verb` that carries it."""
    names = PARAMETERS.get(verb, {})

    def parameter(match: re.Match[str]) -> str:
        flag = match.group(1)
        return "`" + names.get(flag, flag.removeprefix("--").replace("-", "_")) + "`"

    return _FLAG.sub(parameter, message)


def call_speaking_of_parameters(verb: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)`; a QConvertError it raises is re-raised naming parameters, not flags."""
    try:
        return function(*args, **kwargs)
    except QConvertError as error:
        rewritten = in_parameters(error.message, verb)
        if rewritten != error.message:
            error.message = rewritten
            error.args = (rewritten, *error.args[1:])
        raise


# module name -> (module holding the verb's function, the function's name, the verb)
_VERBS: dict[str, tuple[str, str, str]] = {}


def _function(module_name: str) -> tuple[Any, str]:
    holder, name, verb = _VERBS[module_name]
    return getattr(importlib.import_module(holder), name), verb


class CallableModule(types.ModuleType):
    """A package or module that runs its verb when called: `qconvert.calibrate("m.onnx", "data/")`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        function, verb = _function(self.__name__)
        return call_speaking_of_parameters(verb, function, *args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:  # help() and completion show the verb's parameters
        return inspect.signature(_function(self.__name__)[0])


def make_callable(module_name: str, holder: str, function_name: str, verb: str) -> None:
    """Make the module `module_name` call `holder.function_name` (imported on the first call)."""
    _VERBS[module_name] = (holder, function_name, verb)
    module = sys.modules[module_name]
    if not isinstance(module, CallableModule):
        module.__class__ = CallableModule


def api_function(verb: str, function: Any) -> Any:
    """`function` as the API exposes it (`qconvert.import_onnx`): errors naming parameters."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return call_speaking_of_parameters(verb, function, *args, **kwargs)

    call.__name__ = call.__qualname__ = getattr(function, "__name__", verb)
    call.__doc__ = function.__doc__
    call.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
    call.__wrapped__ = function  # type: ignore[attr-defined]
    return call


def short_repr(kind: str, fields: Mapping[str, object]) -> str:
    """`CalibrationResult(method='minmax', ranges=9, ...)`: the fields that are not None."""
    shown = ", ".join(f"{name}={value!r}" for name, value in fields.items() if value is not None)
    return f"{kind}({shown})"

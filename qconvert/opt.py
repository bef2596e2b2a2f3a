"""`qconvert opt`: an `mlir-opt` for the quant dialect (split input, verify diagnostics, pass flags).

The flags behave as mlir-opt's do, with single- or double-dash spellings, so upstream lit tests run
unmodified: `qconvert opt %s -split-input-file -verify-diagnostics`, `--lower-quant-ops=rounding=onnx`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qconvert.atomic_file import atomic_text_file
from qconvert.backends import BACKEND_PASS_MODULES
from qconvert.cli_summary import WriteSummary, count_ops
from qconvert.did_you_mean import closest, did_you_mean
from qconvert.errors import Diagnostic, InputError, Location, ParseError, QConvertError
from qconvert.ir.core import Operation
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.ir.verify import verify
from qconvert.passes import PASS_MODULES, get_pass

# The core passes and the backends' own (each backend declares its passes with its registry entry).
ALL_PASS_MODULES = {**PASS_MODULES, **BACKEND_PASS_MODULES}
SPLIT_MARKER = re.compile(r"^// -----.*$", re.M)
# mlir-opt's output between the outputs of two chunks (a failed chunk's output is empty).
OUTPUT_SPLIT_MARKER = "// -----\n"
# As upstream's verifier reads them (mlir/lib/IR/Diagnostics.cpp), one per line: the text runs to the last
# `}}` of the line.
EXPECTATION = re.compile(
    r"expected-(?P<severity>error|note|warning|remark)(?P<regex>-re)? *(?:@(?P<where>[+-]\d+|above|below))? *"
    r"\{\{(?P<text>.*)\}\}[ \t\r]*$"
)
USAGE = """usage: qconvert opt [FILE|-] [-o OUT] [--split-input-file] [--verify-diagnostics]
                    [--allow-unregistered-dialect] [--verify-each] [--emit-bytecode]
                    [--lower-quant-ops[=rounding=mlir|onnx]] [--normalize-quant-types]
                    [--strip-func-quant-types] [--canonicalize[=test-convergence]] [--inline]
                    [--dce] [--stablehlo-legalize-qdq-to-quantized-op[=fuse-arithmetic=true]]
                    [--pass-pipeline=...] [--json SUMMARY.json]

Reads MLIR text (the quant dialect and the ops its passes emit), verifies it, runs the passes in the
order given and prints the result, as mlir-opt does. Flags take one or two dashes.
Exit codes: 0 success; 1 parse/verify errors or unmet diagnostics; 2 bad usage."""


@dataclass
class OptOptions:
    """What `qconvert opt` was asked to do."""

    input_path: str = "-"
    output_path: str | None = None
    split_input_file: bool = False
    verify_diagnostics: bool = False
    allow_unregistered_dialect: bool = False
    verify_each: bool = True
    passes: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    json_path: str | None = None  # --json PATH: a summary of what was written (qconvert/cli_summary.py)


# mlir-opt's own flags (besides the passes), for "did you mean" on a misspelled one
OPT_FLAGS = (
    "split-input-file",
    "verify-diagnostics",
    "allow-unregistered-dialect",
    "verify-each",
    "emit-bytecode",
    "pass-pipeline",
    "json",
)


def parse_arguments(arguments: Sequence[str]) -> OptOptions:
    """Read mlir-opt style flags; anything unknown is a usage error (exit 2)."""
    options = OptOptions()
    positional: list[str] = []
    iterator = iter(arguments)
    for argument in iterator:
        if argument == "-" or not argument.startswith("-"):
            positional.append(argument)
            continue
        flag, _, value = argument.lstrip("-").partition("=")
        if flag in ("h", "help"):
            raise InputError(USAGE)
        if flag == "o":
            options.output_path = value or next(iterator, None)
            if options.output_path is None:
                raise InputError("-o needs a file name")
        elif flag == "split-input-file":
            options.split_input_file = True
        elif flag == "verify-diagnostics":
            options.verify_diagnostics = True
        elif flag == "allow-unregistered-dialect":
            options.allow_unregistered_dialect = True
        elif flag == "verify-each":
            options.verify_each = value.lower() not in ("0", "false")
        elif flag == "json":
            options.json_path = value or next(iterator, None)
            if options.json_path is None:
                raise InputError("--json needs a file name ('-': stdout)")
        elif flag == "emit-bytecode":
            pass  # we only have the text format; the round trip through it is what the tests need
        elif flag == "pass-pipeline":
            options.passes += parse_pipeline(value.strip("'\""))
        elif flag in ALL_PASS_MODULES:
            options.passes.append((flag, parse_pass_options(flag, value)))
        else:
            match = closest(flag, [*ALL_PASS_MODULES, *OPT_FLAGS])
            hint = f"; did you mean '--{match}'?" if match else ""
            raise InputError(f"unknown command line argument '{argument}'{hint}; try 'qconvert opt --help'")
    if options.json_path == "-" and options.output_path in (None, "-"):
        raise InputError("--json - and the output on stdout: give -o PATH or --json PATH (one stdout)")
    if len(positional) > 1:
        raise InputError(f"expected one input file, got {len(positional)}: {' '.join(positional)}")
    if positional:
        options.input_path = positional[0]
    return options


def parse_pass_options(name: str, text: str) -> dict[str, str]:
    """`rounding=onnx,x=y` or `{rounding=onnx}` -> {"rounding": "onnx", ...}; `{flag}` -> {"flag": ""}."""
    text = text.strip().strip("'\"").strip("{}")
    options: dict[str, str] = {}
    for item in filter(None, re.split(r"[,\s]+", text)):
        key, _, value = item.partition("=")
        options[key] = value  # no `=value`: a unit option, true for a boolean (`test-convergence`)
    return options


def parse_pipeline(text: str) -> list[tuple[str, dict[str, str]]]:
    """`builtin.module(func.func(lower-quant-ops{rounding=onnx}))`: the passes in order, anchors dropped."""
    passes = []
    for match in re.finditer(r"([a-z][a-z0-9-]*)(\{[^}]*\})?(?=\s*[,)]|\s*$)", text):
        name, body = match.group(1), match.group(2) or ""
        if name in ("builtin.module", "func.func", "any"):
            continue
        if name not in ALL_PASS_MODULES:
            raise InputError(
                f"unknown pass '{name}' in pipeline '{text}'{did_you_mean(name, ALL_PASS_MODULES)}"
            )
        passes.append((name, parse_pass_options(name, body)))
    return passes


@dataclass
class Chunk:
    text: str
    line_offset: int


def split_chunks(text: str, split: bool) -> list[Chunk]:
    """The `// -----`-separated chunks, each with the number of lines before it (for locations)."""
    if not split:
        return [Chunk(text, 0)]
    chunks = []
    start = 0
    for marker in SPLIT_MARKER.finditer(text):
        chunks.append(Chunk(text[start : marker.start()], text.count("\n", 0, start)))
        start = marker.end()
    chunks.append(Chunk(text[start:], text.count("\n", 0, start)))
    return chunks


def process_chunk(chunk: Chunk, filename: str, options: OptOptions) -> Operation:
    """Parse, verify and transform one chunk; raises the first error."""
    module = parse_module(
        chunk.text,
        filename,
        line_offset=chunk.line_offset,
        options=ParserOptions(allow_unregistered_dialect=options.allow_unregistered_dialect),
    )
    verify(module)
    completed: list[str] = []
    for name, pass_options in options.passes:
        pass_ = get_pass(name, pass_options, ALL_PASS_MODULES)
        try:
            pass_.run(module)
            if options.verify_each:
                verify(module)
        except QConvertError as error:
            error.add_note(f"in pass '{name}' after {completed}")
            raise
        completed.append(name)
    return module


@dataclass(frozen=True)
class Expectation:
    line: int  # 0 when the offset names no line of the file (never met)
    severity: str
    text: str
    loc: Location
    # `expected-*-re`: the compiled RE2 pattern (linear-time matching; see `compile_expectation_regex`).
    regex: Any = None

    def matches(self, diagnostic: Diagnostic) -> bool:
        if diagnostic.severity != self.severity or diagnostic.loc is None or diagnostic.loc.line != self.line:
            return False
        if self.regex is not None:
            return self.regex.search(diagnostic.message) is not None
        return self.text in diagnostic.message


def compile_expectation_regex(text: str) -> Any:
    """The pattern of an `expected-*-re` text: `{{...}}` parts are regular expressions, the rest literal.

    Compiled with RE2 (google-re2), which matches in time linear in the message whatever the pattern, as
    llvm::Regex does for mlir-opt: Python's `re` backtracks, and `{{(.|.|.)*Z}}` never returns.

    Raises:
        ValueError: upstream's message for a `{{` without its `}}` or a pattern that does not compile.
    """
    import re2  # google-re2: imported here, as only `--verify-diagnostics` with `-re` needs it

    pattern: list[str] = []
    rest = text
    while rest:
        start = rest.find("{{")
        if start < 0:
            pattern.append(re2.escape(rest))
            break
        pattern.append(re2.escape(rest[:start]))
        rest = rest[start + 2 :]
        end = rest.find("}}")
        if end < 0:
            raise ValueError("found start of regex with no end '}}'")
        pattern.append(f"({rest[:end]})")
        rest = rest[end + 2 :]
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own log line to stderr; the diagnostic says it
    try:
        return re2.compile("".join(pattern), options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", errors="replace")
        raise ValueError(f"invalid regex: {reason}") from None


def collect_expectations(chunk: Chunk, filename: str) -> tuple[list[Expectation], list[Diagnostic]]:
    """`// expected-error@+1 {{text}}` comments of a chunk, each resolved to the line it expects; and the
    errors in those comments themselves (a regex that does not compile), at the comment."""
    expectations = []
    problems = []
    lines = chunk.text.split("\n")
    absolute = chunk.line_offset + 1
    for index, line in enumerate(lines):
        match = EXPECTATION.search(line)
        if match is None:
            continue
        loc = Location(filename, index + absolute, match.start() + 1)
        where = match.group("where")
        target = index + absolute
        if where in ("above", "below"):
            target += -1 if where == "above" else 1
        elif where is not None:
            digits = where[1:].lstrip("0")
            # An offset past every line of any file (and past Python's int-from-text limit) names none.
            target = target + int(where) if len(digits) <= 9 else 0
        regex = None
        if match.group("regex") is not None:
            try:
                regex = compile_expectation_regex(match.group("text"))
            except ValueError as error:
                problems.append(Diagnostic(loc, "error", str(error)))
                continue
        expectations.append(
            Expectation(
                line=max(target, 0),
                severity=match.group("severity"),
                text=match.group("text"),
                loc=loc,
                regex=regex,
            )
        )
    return expectations, problems


def check_diagnostics(expectations: list[Expectation], diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """mlir-opt's `-verify-diagnostics`: every diagnostic expected, every expectation met."""
    problems = []
    unmet = list(expectations)
    for diagnostic in diagnostics:
        found = next((e for e in unmet if e.matches(diagnostic)), None)
        if found is None:
            problems.append(
                Diagnostic(diagnostic.loc, "error", f"unexpected {diagnostic.severity}: {diagnostic.message}")
            )
        else:
            unmet.remove(found)
    for expectation in unmet:
        problems.append(
            Diagnostic(
                expectation.loc,
                "error",
                f'expected {expectation.severity} "{expectation.text}" was not produced',
            )
        )
    return problems


def render_diagnostic(diagnostic: Diagnostic, source_lines: Sequence[str]) -> str:
    """`file:line:col: error: message`, then the source line and a caret, as MLIR prints them."""
    text = str(diagnostic)
    loc = diagnostic.loc
    if loc is not None and 0 < loc.line <= len(source_lines):
        line = source_lines[loc.line - 1]
        text += f"\n{line}\n{' ' * (loc.column - 1)}^"
    return text


@dataclass
class OptResult:
    output: str
    diagnostics: list[str]
    exit_code: int
    summary: WriteSummary | None = None  # the ops written, when --json or a terminal asks for a summary


def run_opt(text: str, filename: str, options: OptOptions) -> OptResult:
    """Run `qconvert opt` on a buffer: the printed modules, rendered diagnostics and the exit code."""
    outputs: list[str] = []  # one per chunk, empty for a chunk that failed
    messages: list[str] = []
    exit_code = 0
    source_lines = text.split("\n")
    wanted = options.json_path is not None or sys.stderr.isatty()  # a walk of the output, only when read
    summary = WriteSummary("opt", "quant-dialect IR", []) if wanted else None
    for chunk in split_chunks(text, options.split_input_file):
        outputs.append("")
        try:
            try:
                module = process_chunk(chunk, filename, options)
                # As mlir-opt writes each module: its text, then a newline after its last line.
                outputs[-1] = print_module(module).rstrip("\n") + "\n\n"
                if summary is not None:
                    count_ops(module, summary)
            except RecursionError:  # a backstop: the parser's depth limit is meant to stop this first
                raise ParseError("nesting too deep", Location(filename, chunk.line_offset + 1, 1)) from None
            emitted: list[Diagnostic] = []
        except QConvertError as error:
            emitted = error.diagnostics()
            if not options.verify_diagnostics:
                for diagnostic in emitted:
                    messages.append(render_diagnostic(diagnostic, source_lines))
                for note in getattr(error, "__notes__", ()):
                    messages.append(f"note: {note}")
                exit_code = 1
                continue
        if options.verify_diagnostics:
            expectations, problems = collect_expectations(chunk, filename)
            problems += check_diagnostics(expectations, emitted)
            for problem in problems:
                messages.append(render_diagnostic(problem, source_lines))
            if problems:
                exit_code = 1
    return OptResult(OUTPUT_SPLIT_MARKER.join(outputs), messages, exit_code, summary)


def main(arguments: Sequence[str]) -> int:
    """The `qconvert opt` command line; returns the exit code."""
    try:
        options = parse_arguments(arguments)
        if options.input_path == "-":
            text, filename = sys.stdin.read(), "<stdin>"
        else:
            path = Path(options.input_path)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise InputError(f"could not open input file '{path}': {error}") from None
            filename = options.input_path
        if options.output_path is not None and options.output_path != "-":
            # Before any work, as the other verbs do: a folder that does not exist, a folder as the file.
            from qconvert.calibrate.outputs import check_output_paths

            check_output_paths({"-o": options.output_path}, {})  # the input may be rewritten in place
    except InputError as error:
        print(
            error.message if error.message.startswith("usage") else f"qconvert opt: {error.message}",
            file=sys.stderr,
        )
        return 0 if error.message.startswith("usage") else 2
    result = run_opt(text, filename, options)
    for message in result.diagnostics:
        print(message, file=sys.stderr)
    if options.output_path is not None and options.output_path != "-":
        if result.exit_code == 0:  # never leave a partial output behind
            try:
                with atomic_text_file(options.output_path) as stream:
                    stream.write(result.output)
            except InputError as error:
                print(f"qconvert opt: {error.message}", file=sys.stderr)
                return 2
            except OSError as error:
                print(
                    f"qconvert opt: cannot write '{options.output_path}': {error.strerror or error}",
                    file=sys.stderr,
                )
                return 2
    else:
        sys.stdout.write(result.output)
    if result.summary is not None and result.exit_code == 0:
        result.summary.outputs = [options.output_path or "-"]
        result.summary.notes = [f"pass {name}" for name, _ in options.passes]
        if options.json_path is not None:
            result.summary.write_json(options.json_path)
        if sys.stderr.isatty():  # piped (lit, FileCheck), stderr carries the diagnostics alone, as mlir-opt's
            print(result.summary.line(), file=sys.stderr)
    return result.exit_code

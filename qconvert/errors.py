"""The one error family of qconvert: every failure a user can cause is one of these, with a location."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    """A position in a source file, 1-based like MLIR's `file:line:col`."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One message at one location, as `--verify-diagnostics` matches them."""

    loc: Location | None
    severity: str
    message: str

    def __str__(self) -> str:
        prefix = f"{self.loc}: " if self.loc is not None else ""
        return f"{prefix}{self.severity}: {self.message}"


class QConvertError(Exception):
    """Base of every error qconvert reports to a user; prints as `file:line:col: error: message`.

    `related` holds further diagnostics emitted by the same failure (upstream sometimes emits two errors,
    e.g. `expected ':'` then `calibrated values must be present`), in emission order before this one.
    """

    exit_code = 2

    def __init__(
        self, message: str, loc: Location | None = None, related: tuple[Diagnostic, ...] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.related = related

    def diagnostics(self) -> list[Diagnostic]:
        return [*self.related, Diagnostic(self.loc, "error", self.message)]

    def __str__(self) -> str:
        prefix = f"{self.loc}: " if self.loc is not None else ""
        return f"{prefix}error: {self.message}"


class ParseError(QConvertError):
    """Malformed IR text; the message is upstream MLIR's wording where MLIR has the rule."""

    exit_code = 1


class VerifyError(QConvertError):
    """IR that parses but breaks a type or op invariant (upstream verifier wording)."""

    exit_code = 1


class InputError(QConvertError):
    """Bad input to a command (missing file, bad flag, bad model): exit code 2."""

    exit_code = 2


class Terminated(BaseException):
    """SIGTERM arrived (`kill`, `timeout`, a CI cancel, a service manager): raised by the CLI's handler so
    that every `finally` and context manager runs, as for Ctrl-C: worker processes end, temporary folders
    and half-written outputs go. A BaseException, like KeyboardInterrupt, so that no `except Exception`
    (around a user's data function, say) mistakes it for a failure of the code it interrupted."""

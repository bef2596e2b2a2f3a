"""A rich Console for a command's report on stdout, terminal or pipe.

Off a terminal rich assumes 80 columns and pads every table cell, and every centred title, to its
column's width: piped reports ended their lines in up to 130 blanks, which `grep`, `diff` and editors
show. Piped, the report is drawn into a buffer and written without them when the block ends, in what
the stream can encode (a Windows pipe is cp1252): ASCII boxes, and `?` for any other character it lacks.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _Buffer(io.StringIO):
    """Text for a stream, kept until written: with the stream's encoding, which rich reads to choose
    box characters that it can encode (ASCII ones for cp1252 or ascii)."""

    def __init__(self, encoding: str | None) -> None:
        super().__init__()
        self._encoding = encoding or "utf-8"

    @property
    def encoding(self) -> str:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self._encoding


@contextlib.contextmanager
def stdout_console(stdout: TextIO, piped_width: int | None = None) -> Iterator[Console]:
    """A Console on `stdout`; when it is not a terminal, `piped_width` columns (None: rich's 80) and
    lines written without trailing blanks when the block ends (nothing is written if it raises)."""
    if stdout.isatty():
        yield Console(file=stdout, highlight=False, soft_wrap=True)
        return
    buffer = _Buffer(getattr(stdout, "encoding", None))
    yield Console(file=buffer, highlight=False, soft_wrap=True, width=piped_width)
    text = "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
    stdout.write(text.encode(buffer.encoding, errors="replace").decode(buffer.encoding))


def grouped_notes(notes: list[str], shown: int = 3) -> list[str]:
    """Notes that differ only in the names they quote, as one line with a count: `per-channel ... for
    weight 'a.weight' ... (x5: 'a.weight', 'b.weight', 'c.weight', ...)`; others as given, in order."""
    import re

    groups: dict[str, list[str]] = {}
    for note in notes:
        groups.setdefault(re.sub(r"'[^']*'", "'*'", note), []).append(note)
    lines = []
    for members in groups.values():
        if len(members) == 1:
            lines.append(members[0])
            continue
        names = [re.findall(r"'[^']*'", note)[:1] for note in members]
        listed = ", ".join(name[0] for name in names[:shown] if name)
        more = ", ..." if len(members) > shown else ""
        lines.append(f"{members[0]} (x{len(members)} alike: {listed}{more})")
    return lines


def shown_rows(count: int, limit: int | None) -> int:
    """How many of `count` rows a summary lists: all when `limit` is None (--verbose) or they fit."""
    return count if limit is None or count <= limit else limit


class CountColumn(ProgressColumn):
    """`12/64`, or `12` while the total is unknown (a stream of samples: no `12/?`)."""

    def render(self, task: Task) -> Text:
        total = "" if task.total is None else f"/{int(task.total)}"
        return Text(f"{int(task.completed)}{total}", style="progress.download")


class KnownTotalColumn(ProgressColumn):
    """A column drawn only once the total is known (the bar, the ETA): an unknown total shows none."""

    def __init__(self, column: ProgressColumn) -> None:
        super().__init__()
        self.column = column

    def render(self, task: Task) -> Text:
        return Text("") if task.total is None else self.column.render(task)  # type: ignore[return-value]


class SamplesPerSecondColumn(ProgressColumn):
    """`123.4/s` (samples per second), from rich's smoothed speed of the task."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f}/s", style="progress.data.speed")


def progress_columns(unit: str = "") -> list[ProgressColumn]:
    """A progress line's columns after its description: with a known total a bar, `12/64 samples`, the
    rate, elapsed time and ETA; with an unknown total (a stream) `12 samples`, the rate and elapsed time."""
    return [
        KnownTotalColumn(BarColumn(bar_width=24)),
        CountColumn(),
        TextColumn(unit),
        SamplesPerSecondColumn(),
        TimeElapsedColumn(),
        KnownTotalColumn(TextColumn("ETA")),
        KnownTotalColumn(TimeRemainingColumn()),
    ]


@contextlib.contextmanager
def phase(description: str, enabled: bool = True) -> Iterator[None]:
    """A transient `⠋ converting model.onnx to stablehlo 0:00:03` line on stderr while a phase of unknown
    length runs (a terminal only, nothing when not `enabled`): long work is never silent."""
    from rich.progress import Progress, SpinnerColumn

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task(description, total=None)
        yield

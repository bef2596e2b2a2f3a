"""Reports people look at: one self-contained HTML page from a check or calibrate result (`qconvert
report`, `--report`), and Model Explorer node data from a check (`check --model-explorer`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from qconvert.atomic_file import atomic_text_file
from qconvert.errors import InputError
from qconvert.report.html import render_html
from qconvert.report.model_explorer import node_data, write_model_explorer


def read_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A `check --json` or `calibrate --json` file ('-': standard input), read; InputError naming the file
    when it is not one."""
    try:
        if os.fspath(path) == "-":  # a pipe: `qconvert check ... --json - | qconvert report -`
            import sys

            text = sys.stdin.buffer.read()
        else:
            with open(os.fspath(path), "rb") as stream:  # also '/dev/stdin'
                text = stream.read()
    except OSError as error:
        raise InputError(f"{os.fspath(path)}: cannot read it ({error.strerror})") from None
    try:
        result = json.loads(text)  # bytes: decoded here, so a binary file is 'not JSON' too
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{os.fspath(path)}: not JSON ({error})") from None
    if not isinstance(result, dict):
        raise InputError(f"{os.fspath(path)}: not a check or calibrate result (a JSON object)")
    return result


def write_report(result: Mapping[str, Any] | str | os.PathLike[str], output: str | os.PathLike[str]) -> None:
    """Write the HTML page of `result` (its JSON, or the path of a JSON file) to `output` ('-': stdout)."""
    source = ""
    if not isinstance(result, Mapping):
        source = os.fspath(result)
        result = read_result(result)
    page = render_html(result, source)
    with atomic_text_file(output) as stream:
        stream.write(page)


__all__ = ["node_data", "read_result", "render_html", "write_model_explorer", "write_report"]

"""The README's command lines name verbs and flags that exist (issue 22: its examples should run as written).

Every `qconvert VERB ...` in the README's sh / console blocks is parsed: the verb must be one of the CLI's,
each `-x` / `--flag` one of that verb's listed options (not a hidden old spelling). opt's flags are MLIR
passes, parsed by its own argparse front end, and are left out.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from qconvert.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(sh|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_commands() -> list[list[str]]:
    """Each qconvert command of the README's shell blocks, as words (continuations joined, comments cut)."""
    commands = []
    for _, block in FENCE.findall(README.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ")
            for part in re.split(r"&&|\|", line):
                words = shlex.split(part, comments=True)
                if words and words[0].endswith("qconvert") and len(words) > 1:
                    commands.append(words[1:])
    return commands


def test_the_readme_names_only_existing_verbs_and_flags() -> None:
    group = typer.main.get_command(app)
    context = typer.Context(group, info_name="qconvert")
    commands = readme_commands()
    assert len(commands) >= 25  # the workflow, the vocabulary, each verb's and backend's examples
    verbs = set(group.list_commands(context))
    for words in commands:
        verb = words[0]
        if verb.startswith("-"):
            assert verb in ("--version", "-h", "--help"), words
            continue
        assert verb in verbs, f"README: qconvert {verb}: no such verb ({' '.join(words)})"
        if verb == "opt":
            continue
        command = group.get_command(context, verb)
        listed = {
            name
            for parameter in command.params
            if not getattr(parameter, "hidden", False)
            for name in (*parameter.opts, *parameter.secondary_opts)
        } | {"-h", "--help"}
        for word in words[1:]:
            flag = word.split("=", 1)[0]
            if flag.startswith("-") and flag != "-":
                assert flag in listed, f"README: qconvert {verb} has no {flag} ({' '.join(words)})"

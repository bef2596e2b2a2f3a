"""Per-node problems grouped for a message: one line per (kind, reason) with a count and a few names.

A real model can have thousands of nodes the tool cannot take, mostly of a handful of op types (87
ConvInteger, 2,279 unsupported ops in one TTS model): a line per node buries the few facts that matter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

NAMES_SHOWN = 3  # node names given per group
GROUPS_SHOWN = 30  # groups listed; the rest are counted in one last line


@dataclass(frozen=True, slots=True)
class ProblemGroup:
    """The nodes of one kind (op type) that failed for one reason, in model order."""

    kind: str
    reason: str
    names: tuple[str, ...]

    def names_text(self, shown: int = NAMES_SHOWN) -> str:
        """`'a', 'b', 'c' and 84 more` (unnamed nodes are counted, not shown; "" when none has a name)."""
        named = [name for name in self.names if name][:shown]
        if not named:
            return ""
        rest = len(self.names) - len(named)
        quoted = ", ".join(f"'{name}'" for name in named)
        return f"{quoted} and {rest} more" if rest > 0 else quoted


def group_problems(problems: Iterable[tuple[str, str, str]]) -> list[ProblemGroup]:
    """(kind, node name, reason) triples -> groups by (kind, reason), the largest first (ties: first seen)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for kind, name, reason in problems:
        groups.setdefault((kind, reason), []).append(name)
    ordered = sorted(groups.items(), key=lambda item: -len(item[1]))  # stable: model order among ties
    return [ProblemGroup(kind, reason, tuple(names)) for (kind, reason), names in ordered]


def listing(
    groups: list[ProblemGroup], line_of: Callable[[ProblemGroup], str], shown: int = GROUPS_SHOWN
) -> str:
    """The groups' lines (`line_of(group)`), indented, at most `shown` of them and a count of the rest."""
    lines = [f"  {line_of(group)}" for group in groups[:shown]]
    rest = groups[shown:]
    if rest:
        count = sum(len(group.names) for group in rest)
        lines.append(f"  ... and {len(rest)} more kind(s) of problem, {count:,} node(s) in all")
    return "\n".join(lines)

"""`scoring-parity`'s inputs: JSONL lines read with their line numbers, every bad line found
before anything is scored and reported at once (the CLI prints each as ``FILE:LINE: message``
and exits 2), as the server reports every violation of a request at once.

Shape and types are checked before any engine starts. What needs the model's tokenizer and
limits (an over-long input, a limit of the checkpoint's config) is checked by
:func:`check_planned` with the plugin's own planning once the first engine is up, so the tool
refuses exactly what the server would refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.types import TruncationOptions

if TYPE_CHECKING:
    from scoring_server.parity.plugin_path import PluginPath

T = TypeVar("T")


class UsageError(Exception):
    """A bad command line, checkpoint or inputs file: reported in one line, exit 2."""


class BadInput(Exception):
    """Bad input lines: (line number, message) each; line None for the file as a whole."""

    def __init__(self, problems: list[tuple[int | None, str]]) -> None:
        super().__init__(f"{len(problems)} bad input line(s)")
        self.problems = sorted(problems, key=lambda p: p[0] or 0)

    def report(self, inputs: Path, cap: int) -> list[str]:
        """One line per bad line, the first `cap` of them, then how many more there are."""
        lines = [
            f"{inputs}:{number}: {_one_line(message)}" if number is not None else f"{inputs}: {_one_line(message)}"
            for number, message in self.problems[:cap]
        ]
        if len(self.problems) > cap:
            lines.append(f"{inputs}: {len(self.problems) - cap} more bad lines not shown")
        return lines


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based, counting blank lines, as an editor shows it
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Inputs:
    """The file's JSON objects, and the lines that are none (reported with the fields' problems)."""

    lines: list[Line]
    problems: list[tuple[int | None, str]]

    def __len__(self) -> int:
        return len(self.lines)


def read_lines(path: Path) -> Inputs:
    """The file's JSON objects, one a line; blank lines are skipped."""
    if not path.is_file():
        raise UsageError(f"--inputs {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--inputs {path}: cannot read it: {exc}") from None
    lines: list[Line] = []
    problems: list[tuple[int | None, str]] = []
    # Split on newlines only: JSON strings may hold U+2028 and other breaks str.splitlines() cuts at.
    for number, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append((number, f"not JSON: {exc.msg} (column {exc.colno})"))
            continue
        if not isinstance(data, dict):
            problems.append((number, f"not a JSON object but {json_type(data)}"))
            continue
        lines.append(Line(number, data))
    if not lines and not problems:
        raise BadInput([(None, "no input lines (one JSON object per line)")])
    return Inputs(lines, problems)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


class Fields:
    """One line's fields, read with their checks; `problems` says what is wrong."""

    def __init__(self, line: Line) -> None:
        self.line = line
        self.problems: list[str] = []

    def text(self, key: str) -> str:
        """A required, non-blank string."""
        value = self.line.data.get(key)
        if key not in self.line.data:
            self.problems.append(f"missing `{key}`")
        elif not isinstance(value, str):
            self.problems.append(f"`{key}` must be a string, not {json_type(value)}")
        elif not value.strip():
            self.problems.append(f"`{key}` must not be blank")
        else:
            return value
        return ""

    def texts(self, key: str) -> list[str]:
        """A required, non-empty list of strings."""
        value = self.line.data.get(key)
        if key not in self.line.data:
            self.problems.append(f"missing `{key}`")
        elif not isinstance(value, list):
            self.problems.append(f"`{key}` must be a list of strings, not {json_type(value)}")
        elif not value:
            self.problems.append(f"`{key}` must not be empty")
        else:
            bad = [i for i, v in enumerate(value) if not isinstance(v, str)]
            if not bad:
                return value
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            self.problems.append(f"`{key}[{bad[0]}]` must be a string, not {json_type(value[bad[0]])}{more}")
        return []


def checked(inputs: Inputs, read: Callable[[Fields], T]) -> list[T]:
    """`read` applied to every line; every bad line (not JSON, or with bad fields) reported at once."""
    out: list[T] = []
    problems = list(inputs.problems)
    for line in inputs.lines:
        fields = Fields(line)
        item = read(fields)
        if fields.problems:
            problems.append((line.number, "; ".join(fields.problems)))
        else:
            out.append(item)
    if problems:
        raise BadInput(problems)
    return out


async def check_planned(
    path: PluginPath,
    requests: list[tuple[int, Any]],
    truncation: TruncationOptions | None,
    field: Callable[[str], str] = lambda name: name,
) -> TruncationOptions | None:
    """Plans each line's request as the server does (validation, tokenization, token limits,
    truncation) and throws the plans away, before anything is scored, so every bad line is
    reported and none is half-scored. `field` renames a request field as the input line names
    it. Returns `truncation` with its limit resolved (the served limit where the command line
    gave none): what the reference must cut to."""
    processor = path.processor
    problems: list[tuple[int | None, str]] = []
    for number, request in requests:
        request_id = f"parity-check-{number}"
        try:
            await processor.plan_async(processor.parse_data(request), request_id, inline=True)
        except InvalidInputError as exc:
            limit = [v for v in exc.violations if v.field.startswith("truncation")]
            if limit and truncation is not None:
                raise UsageError(f"--truncation-max-tokens {truncation.max_tokens}: {limit[0].description}") from None
            problems.append((number, "; ".join(f"{field(v.field)}: {_hint(v.description)}" for v in exc.violations)))
        finally:
            processor.discard(request_id)
    if problems:
        raise BadInput(problems)
    if truncation is None:
        return None
    served = int(processor.max_model_len)
    return TruncationOptions(min(truncation.max_tokens or served, served), truncation.side)


# The plugin's messages tell a request's author to set `truncation`; here that is a flag.
_SET_TRUNCATION = re.compile(r"set `?truncation`?")


def _hint(description: str) -> str:
    return _SET_TRUNCATION.sub("pass --truncate", description)


def _one_line(message: str) -> str:
    return " ".join(message.split())

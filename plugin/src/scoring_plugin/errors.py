"""Input errors that name the offending request field.

The gRPC server turns these into INVALID_ARGUMENT with ``google.rpc.BadRequest`` field
violations; under ``vllm serve`` they surface as HTTP 400 because they subclass ValueError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


class NonFiniteOutputError(RuntimeError):
    """The model produced NaN or infinity: a model fault, never returned to callers as a
    result (the message says which item, never the values)."""


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class InvalidInputError(ValueError):
    def __init__(self, violations: list[FieldViolation]) -> None:
        if not violations:
            raise ValueError("InvalidInputError needs at least one violation")
        self.violations = violations
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))

    @classmethod
    def single(cls, field: str, description: str) -> InvalidInputError:
        return cls([FieldViolation(field, description)])

    @classmethod
    def from_validation(cls, exc: ValidationError) -> InvalidInputError:
        """A JSON request (``vllm serve``) that does not fit the input type, field by field."""
        return cls([FieldViolation(_field_path(e["loc"]), e["msg"]) for e in exc.errors()])


def text_violations(field: str, text: str, max_chars: int) -> list[FieldViolation]:
    """A text field's checks before any tokenizing: its length first (stripping a text over the
    limit is work the limit exists to save), then that it holds something to score."""
    if len(text) > max_chars:
        return [FieldViolation(field, f"{len(text)} characters exceed the limit of {max_chars}")]
    if not text.strip():
        return [FieldViolation(field, "must not be empty")]
    return []


def _field_path(loc: Sequence[Any]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else ("." if path else "") + str(part)
    return path or "data"

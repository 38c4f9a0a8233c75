"""Input errors that name the offending request field.

The gRPC server turns these into INVALID_ARGUMENT with ``google.rpc.BadRequest`` field
violations; under ``vllm serve`` they surface as HTTP 400 because they subclass ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass


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

"""The shared ``Truncation`` message to the plugin's options (rerank and ABSA requests)."""

from __future__ import annotations

from typing import Any

from scoring.v1 import common_pb2
from scoring_plugin.errors import InvalidInputError
from scoring_plugin.rerank.types import TruncationOptions, TruncationSide

_SIDES = {
    common_pb2.TRUNCATION_SIDE_UNSPECIFIED: TruncationSide.RIGHT,
    common_pb2.TRUNCATION_SIDE_RIGHT: TruncationSide.RIGHT,
    common_pb2.TRUNCATION_SIDE_LEFT: TruncationSide.LEFT,
}


def to_truncation(request: Any, documents: bool = False) -> TruncationOptions | None:
    """Absent message: no consent to truncate. Proto3 enums are open, so unknown sides are
    rejected by name here. `documents`: the RPC has rerank documents, the only items
    `max_document_tokens` bounds; elsewhere it is refused rather than silently ignored."""
    if not request.HasField("truncation"):
        return None
    truncation = request.truncation
    if truncation.side not in _SIDES:
        raise InvalidInputError.single("truncation.side", f"unknown value {truncation.side}")
    if truncation.HasField("max_document_tokens") and not documents:
        raise InvalidInputError.single(
            "truncation.max_document_tokens", "bounds rerank documents only; this call has none"
        )
    return TruncationOptions(
        max_tokens=truncation.max_tokens if truncation.HasField("max_tokens") else None,
        side=_SIDES[truncation.side],
        max_document_tokens=truncation.max_document_tokens if truncation.HasField("max_document_tokens") else None,
    )

"""What our poolers need from a step before they can pool: every request in it whole."""

from __future__ import annotations

from vllm.v1.pool.metadata import PoolingMetadata


def whole_request_lengths(pooling_metadata: PoolingMetadata, split_error: str) -> list[int]:
    """The step's token count per request. Our poolers read a request's tokens all at once
    (a pair's segments, a review's span), so a request split over steps (chunked prefill) is a
    configuration error, raised with ``split_error``, never pooled in halves."""
    cursor = pooling_metadata.get_pooling_cursor()
    if cursor.is_partial_prefill():
        raise RuntimeError(split_error)
    return cursor.num_scheduled_tokens_cpu.tolist()

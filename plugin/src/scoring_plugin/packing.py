"""Every pair of a call in one engine request, with attention that never crosses pairs.

vLLM's per-request cost (scheduling, IPC, output handling) was the wall of the one-request-per-pair
path on the H200, not the forward pass. A causal cross-encoder allows more than packing: every pair
of a call starts with the same head (prompt prefix + query), and a causal model's states for those
tokens cannot depend on what follows. So a packed rerank request is the head once, then each
pair's remainder (document + suffix), and its *layout* ``[head_len, segment_len, ...]`` travels in
the request's pooling parameters. The packed model attends from each segment to the head and to
the segment itself only, with the positions the pair would have alone: exactly the arithmetic of
the pair scored by itself, minus the repeated head. A bidirectional encoder (ABSA) shares nothing:
its layouts have an empty head, and each segment is a whole pair.

This module holds both halves: :func:`pack` (IO processor side) and :class:`AttentionPlan` (model
side: which keys each query group may read, the positions, where each segment's score is read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from vllm.tasks import PoolingTask

# PoolingParams.extra_kwargs key carrying a packed request's layout.
LAYOUT_KEY = "pair_layout"
# The pooling task of packed requests: the V1 runner hands the pooler's tensors back as they are.
PACKED_TASK: PoolingTask = "plugin"


@dataclass(frozen=True, slots=True)
class PackedRequest:
    token_ids: list[int]
    layout: list[int]  # [head_len, segment_len, ...]; sums to len(token_ids)
    prompts: list[int]  # the packed prompt (index into the plan) behind each segment


def pack(prompts: Sequence[Sequence[int]], head_len: int, budget: int) -> list[PackedRequest]:
    """Packs prompts that all start with the same ``head_len`` tokens, in order, into requests of
    at most ``budget`` tokens (the head repeated in each). Every prompt must fit alone."""
    if not prompts:
        return []
    head = list(prompts[0][:head_len])
    requests: list[PackedRequest] = []
    current: PackedRequest | None = None
    for index, prompt in enumerate(prompts):
        if list(prompt[:head_len]) != head:
            raise ValueError(f"prompt {index} does not start with the shared head")
        body = prompt[head_len:]
        if not body or head_len + len(body) > budget:
            raise ValueError(f"prompt {index} ({len(prompt)} tokens) cannot be packed within {budget}")
        if current is None or len(current.token_ids) + len(body) > budget:
            current = PackedRequest(list(head), [head_len], [])
            requests.append(current)
        current.token_ids.extend(body)
        current.layout.append(len(body))
        current.prompts.append(index)
    return requests


def layout_of(extra_kwargs: dict[str, object] | None, num_tokens: int) -> list[int]:
    """A request's layout; one without (warm-up, profiling, a plain prompt) is a single pair."""
    layout = (extra_kwargs or {}).get(LAYOUT_KEY)
    if layout is None:
        return [0, num_tokens]
    values = [int(v) for v in layout]  # type: ignore[union-attr]
    if len(values) < 2 or min(values[1:]) < 1 or values[0] < 0 or sum(values) != num_tokens:
        raise ValueError(f"pair layout {values[:8]} does not describe a request of {num_tokens} tokens")
    return values


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total)


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """Query groups in token order (each request's head, then each of its segments); group ``g``
    reads the keys ``kv_index[cu_k[g]:cu_k[g + 1]]``, causally aligned to the group's end."""

    positions: np.ndarray  # per token: its position inside its own pair
    kv_index: np.ndarray  # token rows, group after group
    cu_q: np.ndarray  # int32 group boundaries over the tokens
    cu_k: np.ndarray  # int32 group boundaries over kv_index
    max_q: int
    max_k: int
    score_rows: np.ndarray  # the last token of every segment, request after request
    segments: list[int]  # segments per request

    @classmethod
    def build(cls, layouts: Sequence[Sequence[int]]) -> AttentionPlan:
        """Layouts of the step's requests, in the order of their tokens."""
        range_starts: list[np.ndarray] = []
        range_lengths: list[np.ndarray] = []
        q_lengths: list[np.ndarray] = []
        kv_lengths: list[np.ndarray] = []
        pos_starts: list[np.ndarray] = []
        score_rows: list[np.ndarray] = []
        start = 0
        for layout in layouts:
            head = int(layout[0])
            segs = np.asarray(layout[1:], dtype=np.int64)
            seg_starts = start + head + np.cumsum(segs) - segs
            # Each segment group reads two key ranges: the head, then the segment itself.
            starts = np.stack([np.full(len(segs), start), seg_starts], axis=1).reshape(-1)
            lengths = np.stack([np.full(len(segs), head), segs], axis=1).reshape(-1)
            groups_q, groups_k, positions = segs, head + segs, np.full(len(segs), head)
            if head:  # the head's own group reads only the head
                starts = np.concatenate([[start], starts])
                lengths = np.concatenate([[head], lengths])
                groups_q = np.concatenate([[head], groups_q])
                groups_k = np.concatenate([[head], groups_k])
                positions = np.concatenate([[0], positions])
            range_starts.append(starts)
            range_lengths.append(lengths)
            q_lengths.append(groups_q)
            kv_lengths.append(groups_k)
            pos_starts.append(positions)
            score_rows.append(seg_starts + segs - 1)
            start += head + int(segs.sum())
        q_len = np.concatenate(q_lengths)
        kv_len = np.concatenate(kv_lengths)
        return cls(
            positions=_ranges(np.concatenate(pos_starts), q_len),
            kv_index=_ranges(np.concatenate(range_starts), np.concatenate(range_lengths)),
            cu_q=np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32),
            cu_k=np.concatenate([[0], np.cumsum(kv_len)]).astype(np.int32),
            max_q=int(q_len.max()),
            max_k=int(kv_len.max()),
            score_rows=np.concatenate(score_rows),
            segments=[len(layout) - 1 for layout in layouts],
        )

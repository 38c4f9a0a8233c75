"""Every pair of a call in one engine request, with attention that never crosses pairs.

vLLM's per-request cost (scheduling, IPC, output handling), not the forward pass, bounds a
one-request-per-pair path: it is paid once per pair. A causal cross-encoder allows more than
packing: every pair of a call starts with the same head (prompt prefix + query), and a causal
model's states for those tokens cannot depend on what follows. So a packed rerank request is the
head once, then each pair's remainder (document + suffix), and its *layout*
``[head_len, segment_len, ...]`` travels in the request's pooling parameters. The packed model
attends from each segment to the head and to the segment itself only, with the positions the pair
would have alone: exactly the arithmetic of the pair scored by itself, minus the repeated head. A
bidirectional encoder (ABSA) shares nothing: its layouts have an empty head, and each segment is a
whole pair.

This module holds both halves: :func:`pack` (IO processor side) and :class:`AttentionPlan` (model
side: which keys each query group may read, the positions, where each segment's score is read).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from vllm.tasks import PoolingTask

# PoolingParams.extra_kwargs key carrying a packed request's layout.
LAYOUT_KEY = "pair_layout"
# ... and, for a family with token types (BERT), where token type 1 starts inside each segment.
TYPE_STARTS_KEY = "second_segment_starts"
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


def token_types(extras: Sequence[dict[str, object] | None], layouts: Sequence[Sequence[int]],
                positions: np.ndarray) -> np.ndarray:
    """Per token of the step, its token type: 1 from its segment's second-segment start on
    (``TYPE_STARTS_KEY``), else 0; every token of a request without starts (warm-up, profiling,
    a tokenizer without token types) is type 0. ``positions``: each token's position inside its
    own pair (a headless plan's)."""
    starts: list[int] = []
    for extra, layout in zip(extras, layouts):
        given = (extra or {}).get(TYPE_STARTS_KEY)
        segments = len(layout) - 1
        if given is None:
            starts.extend([np.iinfo(np.int64).max] * segments)
            continue
        values = [int(v) for v in given]  # type: ignore[union-attr]
        if len(values) != segments or min(values) < 0:
            raise ValueError(f"second-segment starts {values[:8]} do not describe {segments} segments")
        starts.extend(values)
    lengths = np.fromiter((n for layout in layouts for n in layout[1:]), dtype=np.int64)
    return (positions >= np.repeat(np.asarray(starts, dtype=np.int64), lengths)).astype(np.int64)


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

    def key_starts(self) -> np.ndarray:
        """Each group's first key row, int32: where its prefix (its request's head) starts for a
        segment; for a head or a headless pair, its own first row (it has no prefix). With
        ``cu_q`` and ``cu_k`` this says where every group's keys are without ``kv_index``: the
        prefix is one run of rows, the group's own rows follow
        (:mod:`scoring_plugin.packed.segment_attention`)."""
        return self.kv_index[self.cu_k[:-1]].astype(np.int32)

    @classmethod
    def build(cls, layouts: Sequence[Sequence[int]]) -> AttentionPlan:
        """Layouts of the step's requests, in the order of their tokens.

        The engine core builds a plan every step, on the c=1 path, where each array operation
        costs several times what it does back to back (a step finds the core's caches cold). So
        a fixed number of operations whatever the number of requests, and fewer still where no
        request has a head (ABSA)."""
        if all(layout[0] == 0 for layout in layouts):
            return cls.whole_pairs(layouts)
        return cls.general(layouts)

    @classmethod
    def whole_pairs(cls, layouts: Sequence[Sequence[int]]) -> AttentionPlan:
        """Layouts without heads: every segment is a whole pair, a query group reading its own
        rows. The plan :meth:`general` builds for them."""
        lengths = np.fromiter(
            itertools.chain.from_iterable(layout[1:] for layout in layouts), dtype=np.int64
        )
        ends = np.cumsum(lengths)
        rows = np.arange(ends[-1])
        cu = np.concatenate([[0], ends]).astype(np.int32)
        longest = int(lengths.max())
        return cls(
            positions=rows - np.repeat(ends - lengths, lengths), kv_index=rows, cu_q=cu, cu_k=cu,
            max_q=longest, max_k=longest, score_rows=ends - 1, segments=[len(layout) - 1 for layout in layouts],
        )

    @classmethod
    def general(cls, layouts: Sequence[Sequence[int]]) -> AttentionPlan:
        """Any layouts, heads or not."""
        entries = np.fromiter(itertools.chain.from_iterable(layouts), dtype=np.int64)
        counts = np.fromiter((len(layout) for layout in layouts), dtype=np.int64, count=len(layouts))
        heads = np.cumsum(counts) - counts  # each request's head entry
        is_head = np.zeros(len(entries), dtype=bool)
        is_head[heads] = True
        starts = np.cumsum(entries) - entries  # each entry's first token
        request = np.repeat(np.arange(len(layouts)), counts)
        head_len, request_start = entries[heads][request], starts[heads][request]
        # Query groups: every segment, and every head that has tokens. A segment reads its
        # request's head, then itself; a head reads itself (the second range is empty).
        group = ~is_head | (entries > 0)
        q_len, q_head = entries[group], is_head[group]
        g_head_len, g_start, g_request_start = head_len[group], starts[group], request_start[group]
        own = np.where(q_head, 0, q_len)
        kv_len = g_head_len + own
        return cls(
            positions=_ranges(np.where(q_head, 0, g_head_len), q_len),
            kv_index=_ranges(
                np.stack([g_request_start, g_start], axis=1).reshape(-1),
                np.stack([g_head_len, own], axis=1).reshape(-1),
            ),
            cu_q=np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32),
            cu_k=np.concatenate([[0], np.cumsum(kv_len)]).astype(np.int32),
            max_q=int(q_len.max()),
            max_k=int(kv_len.max()),
            score_rows=(starts + entries - 1)[~is_head],
            segments=(counts - 1).tolist(),
        )

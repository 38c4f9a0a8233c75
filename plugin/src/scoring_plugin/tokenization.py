"""Tokenizer use that is safe from several planning threads at once, and cheap.

The server plans requests (tokenizes) in worker threads, so calls tokenize in parallel and the
event loop keeps serving (a Rust tokenizer releases the GIL while it encodes). A Rust tokenizer
may be read from many threads but not changed while one of them encodes ("Already borrowed"):
the Hugging Face wrapper changes it whenever a call asks for other truncation or padding than
the tokenizer holds. Our processors budget tokens themselves and never ask for either, so the
tokenizer is cleared of both once, at start, and then only read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def read_only(tokenizer: Any) -> Any:
    """Clears the truncation and padding a checkpoint's tokenizer.json may configure."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        if backend.truncation is not None:
            backend.no_truncation()
        if backend.padding is not None:
            backend.no_padding()
    return tokenizer


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens. With a Rust tokenizer this asks the backend
    directly for ids alone (no offsets, no wrapper objects): the wrapper's call builds Python
    objects the caller never reads, and tokenization is most of a call's host time."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [encoding.ids for encoding in encode(list(texts), add_special_tokens=False)]


def encode_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[Any]:
    """The backend's encodings (``ids``, ``offsets``, ``sequence_ids``) of each (first, second)
    pair, special tokens added. The wrapper's call builds Python lists for every field of every
    pair while holding the GIL: on packed ABSA calls that can outweigh the model's step, and
    the GIL is what every planning thread and the event loop share."""
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None or backend.padding is not None:
        raise ValueError("encode_pairs needs a tokenizer cleared by read_only()")
    return backend.encode_batch(list(pairs), add_special_tokens=True)


def encode_offsets(tokenizer: Any, texts: Sequence[str]) -> list[list[tuple[int, int]]] | None:
    """Each token's code-point offsets in its text (no special tokens), for texts whose windows
    report character spans; None for a tokenizer without a Rust backend. Asked only for the
    texts that need them: offsets cost a second encoding and a tuple per token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    return [encoding.offsets for encoding in backend.encode_batch(list(texts), add_special_tokens=False)]

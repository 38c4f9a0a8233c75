"""Cohere's rerank API (`POST /v1/rerank`, `POST /v2/rerank`): also what Jina's API and vLLM's
`/rerank` accept, and what the Cohere connectors of Elasticsearch, OpenSearch, LangChain,
LlamaIndex and Haystack send.

Cohere truncates long documents rather than refusing them (`max_tokens_per_doc`), so every
request here consents to truncation; `max_chunks_per_doc` (v1) scores a long document in up to
that many windows and keeps the best, as Cohere's chunking does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scoring.v1 import common_pb2, rerank_pb2
from scoring_plugin.errors import InvalidInputError
from scoring_server.http.errors import field_renamer

Document = str | dict[str, Any]
# Our request's fields as this API names them.
caller_field = field_renamer(
    {"truncation.max_document_tokens": "max_tokens_per_doc", "long_documents.max_windows": "max_chunks_per_doc"},
    "documents",
)


class CohereRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Cohere requires it; here absent means the default rerank model.
    model: str | None = None
    query: str
    documents: list[Document]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    max_tokens_per_doc: int | None = Field(default=None, ge=1)
    rank_fields: list[str] | None = None
    max_chunks_per_doc: int | None = Field(default=None, ge=1)
    # Cohere's queueing priority: accepted, not used (admission is first come, first served).
    priority: int | None = None

    def to_proto(self, request_id: str) -> rerank_pb2.RerankRequest:
        request = rerank_pb2.RerankRequest(query=self.query, request_id=request_id)
        for i, document in enumerate(self.documents):
            request.documents.add(text=self._text(i, document))
        if self.model is not None:
            request.model = self.model
        if self.top_n is not None:
            request.top_n = self.top_n
        truncation = common_pb2.Truncation()
        if self.max_tokens_per_doc is not None:
            truncation.max_document_tokens = self.max_tokens_per_doc
        request.truncation.CopyFrom(truncation)
        if self.max_chunks_per_doc is not None:
            request.long_documents.max_windows = self.max_chunks_per_doc
        return request

    def _text(self, index: int, document: Document) -> str:
        """A string, `{"text": ...}`, or (v1) an object whose `rank_fields` are scored as
        `field: value` lines, in the order given."""
        if isinstance(document, str):
            return document
        if self.rank_fields:
            missing = [f for f in self.rank_fields if f not in document]
            if len(missing) == len(self.rank_fields):
                raise InvalidInputError.single(f"documents[{index}]", f"has none of rank_fields {self.rank_fields}")
            return "\n".join(f"{f}: {document[f]}" for f in self.rank_fields if f in document)
        text = document.get("text")
        if not isinstance(text, str):
            raise InvalidInputError.single(
                f"documents[{index}].text", "a document object needs a string `text` (or give `rank_fields`)"
            )
        return text


def to_reply(
    response: rerank_pb2.RerankResponse, request: CohereRerankRequest, version: Literal["1", "2"]
) -> dict[str, Any]:
    results = []
    for result in response.results:
        item: dict[str, Any] = {"index": result.index, "relevance_score": result.score}
        if request.return_documents:
            document = request.documents[result.index]
            item["document"] = {"text": document} if isinstance(document, str) else document
        results.append(item)
    return {
        "id": response.request_id,
        "results": results,
        "meta": {
            "api_version": {"version": version},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": response.usage.prompt_tokens, "output_tokens": 0},
        },
    }

"""Text Embeddings Inference's rerank API (`POST /rerank`): `query` and `texts` in, a list of
`{index, score, text}` out, best first. As in TEI, over-long texts are refused unless `truncate`
is set, and `raw_scores` returns the score before the model's activation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scoring.v1 import common_pb2, rerank_pb2
from scoring_server.http.errors import field_renamer

# Our request's fields as this API names them.
caller_field = field_renamer({"documents": "texts", "truncation.side": "truncation_direction"}, "texts")
_SIDES = {"right": common_pb2.TRUNCATION_SIDE_RIGHT, "left": common_pb2.TRUNCATION_SIDE_LEFT}


class TeiRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    # Not in TEI (one model per server): which served model; absent, the default.
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)

    def to_proto(self, request_id: str) -> rerank_pb2.RerankRequest:
        request = rerank_pb2.RerankRequest(query=self.query, request_id=request_id)
        for text in self.texts:
            request.documents.add(text=text)
        if self.raw_scores:
            request.activation = rerank_pb2.ACTIVATION_NONE
        if self.truncate:
            request.truncation.side = _SIDES[self.truncation_direction.lower()]
        if self.model is not None:
            request.model = self.model
        if self.top_n is not None:
            request.top_n = self.top_n
        return request


def to_reply(response: rerank_pb2.RerankResponse, request: TeiRerankRequest) -> list[dict[str, Any]]:
    reply = []
    for result in response.results:
        item: dict[str, Any] = {"index": result.index, "score": result.score}
        if request.return_text:
            item["text"] = request.texts[result.index]
        reply.append(item)
    return reply

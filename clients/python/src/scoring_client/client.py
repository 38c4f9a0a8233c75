"""A small blocking client over the generated stubs: one channel, typed results, readable errors.

It hides protobuf plumbing for the common calls, ``rerank(query, docs, top_n=...)`` and
``analyze(review, aspects)``, ``rank_images(query, images)``, and turns ``google.rpc.BadRequest`` details into a list of field
violations.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from scoring.v1 import (
    absa_pb2,
    absa_pb2_grpc,
    common_pb2,
    image_rank_pb2,
    image_rank_pb2_grpc,
    info_pb2,
    info_pb2_grpc,
    rerank_pb2,
    rerank_pb2_grpc,
)

Document = str | Sequence[int]
_ACTIVATIONS = {
    None: rerank_pb2.ACTIVATION_UNSPECIFIED,
    "none": rerank_pb2.ACTIVATION_NONE,
    "sigmoid": rerank_pb2.ACTIVATION_SIGMOID,
    "softmax": rerank_pb2.ACTIVATION_SOFTMAX,
}
_SIDES = {"right": common_pb2.TRUNCATION_SIDE_RIGHT, "left": common_pb2.TRUNCATION_SIDE_LEFT}
_AGGREGATIONS = {
    "max": rerank_pb2.WINDOW_AGGREGATION_MAX,
    "mean": rerank_pb2.WINDOW_AGGREGATION_MEAN,
    "first": rerank_pb2.WINDOW_AGGREGATION_FIRST,
}


@dataclass(frozen=True)
class LongDocuments:
    """Consent to score documents over the model's limit in windows of their tokens. Unset
    sizes take the server's defaults: windows as wide as fit beside the query, an eighth of a
    window of overlap; the best window's score unless `aggregation` says otherwise."""

    window_tokens: int | None = None
    overlap_tokens: int | None = None
    aggregation: Literal["max", "mean", "first"] = "max"

    def to_proto(self) -> rerank_pb2.LongDocuments:
        message = rerank_pb2.LongDocuments(aggregation=_AGGREGATIONS[self.aggregation])
        if self.window_tokens is not None:
            message.window_tokens = self.window_tokens
        if self.overlap_tokens is not None:
            message.overlap_tokens = self.overlap_tokens
        return message


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class ScoringError(Exception):
    """A failed call: the gRPC code, the message, and any field violations."""

    def __init__(self, error: grpc.RpcError) -> None:
        self.code: grpc.StatusCode = error.code()
        self.details: str = error.details() or ""
        self.field_violations: list[FieldViolation] = []
        # Set on RESOURCE_EXHAUSTED: how long the server suggests waiting before a retry.
        self.retry_after_s: float | None = None
        status = rpc_status.from_call(error)
        for detail in status.details if status is not None else []:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                self.retry_after_s = retry.retry_delay.ToTimedelta().total_seconds()
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                self.field_violations += [
                    FieldViolation(v.field, v.description) for v in bad_request.field_violations
                ]
        super().__init__(f"{self.code.name}: {self.details}")

    @property
    def fields(self) -> list[str]:
        return [v.field for v in self.field_violations]


@dataclass(frozen=True)
class RerankHit:
    index: int
    score: float
    id: str | None = None
    raw_score: float | None = None
    text: str | None = None
    # Tokens of the document's engine prompts (summed over its windows).
    tokens: int = 0
    # Long documents: the windows the document was scored in, and the reported window's
    # code-point span (text documents in 2 or more windows): document[start:end].
    windows: int = 1
    window: tuple[int, int] | None = None


@dataclass(frozen=True, kw_only=True)
class Response:
    """What every scoring response reports besides its results."""

    model: str
    dtype: str
    request_id: str
    prompt_tokens: int
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RerankResult(Response):
    hits: list[RerankHit]


@dataclass(frozen=True)
class Evidence:
    """``review[start:end] == text`` (Unicode code points, end exclusive)."""

    text: str
    start: int
    end: int
    score: float


@dataclass(frozen=True)
class AspectJudgement:
    index: int
    aspect: str
    label: str
    probabilities: dict[str, float]
    span: Evidence | None
    id: str | None = None


@dataclass(frozen=True)
class AnalyzeResult(Response):
    results: list[AspectJudgement]


@dataclass(frozen=True)
class ImageError:
    """Why one image was not scored: a gRPC status code name and a message naming the field."""

    code: str
    message: str


@dataclass(frozen=True)
class RankedImage:
    index: int
    score: float | None
    id: str | None = None
    error: ImageError | None = None


@dataclass(frozen=True)
class RankImagesResult(Response):
    """Scored images best first, then images that failed to load (request order)."""

    results: list[RankedImage]


# An image is its encoded bytes, or an http(s) URL the server fetches.
ImageRef = bytes | str


def _response_fields(response: Any) -> dict[str, Any]:
    """What every scoring response reports besides its results."""
    timings = response.timings
    return {
        "model": response.model,
        "dtype": common_pb2.Dtype.Name(response.dtype),
        "request_id": response.request_id,
        "prompt_tokens": response.usage.prompt_tokens,
        "timings_ms": {
            "queue": timings.queue_ms,
            "inference": timings.inference_ms,
            "postprocess": timings.postprocess_ms,
            "total": timings.total_ms,
        },
    }


def _set_model_and_truncation(
    request: Any, model: str | None, truncate: str | None, max_tokens: int | None
) -> None:
    """The request fields every scoring RPC shares."""
    if model is not None:
        request.model = model
    if truncate is not None:
        request.truncation.side = _SIDES[truncate]
        if max_tokens is not None:
            request.truncation.max_tokens = max_tokens


class _Stubs:
    """The service stubs of one connection."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.rerank = rerank_pb2_grpc.RerankServiceStub(channel)
        self.info = info_pb2_grpc.InfoServiceStub(channel)
        self.absa = absa_pb2_grpc.AbsaServiceStub(channel)
        self.image_rank = image_rank_pb2_grpc.ImageRankServiceStub(channel)


class ScoringClient:
    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 10.0,
        channel: grpc.Channel | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
        token: str | None = None,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        connections: int = 1,
    ) -> None:
        """TLS when `root_certificates` is given (mutual TLS with `private_key` and
        `certificate_chain`); `token` is sent as `authorization: Bearer <token>` on every call.

        `connections` > 1 opens that many connections and sends the scoring calls over them in
        turn: a server with several front-end processes (`frontends`) gets connections, not
        calls, spread over its processes, so one connection reaches only one of them."""
        if connections < 1 or (channel is not None and connections != 1):
            raise ValueError("connections must be >= 1, and 1 with a given channel")
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if connections > 1:  # else grpc shares one connection between channels to a target
            options.append(("grpc.use_local_subchannel_pool", 1))
        if channel is None:
            credentials = (
                grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
                if root_certificates is not None
                else None
            )
            self._channels = [
                grpc.secure_channel(target, credentials, options=options)
                if credentials is not None
                else grpc.insecure_channel(target, options=options)
                for _ in range(connections)
            ]
        else:
            self._channels = [channel]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._stubs = [_Stubs(c) for c in self._channels]
        self._turn = itertools.cycle(self._stubs)
        first = self._stubs[0]
        self.rerank_stub, self.info_stub = first.rerank, first.info
        self.absa_stub, self.image_rank_stub = first.absa, first.image_rank
        self._health = health_pb2_grpc.HealthStub(self._channels[0])

    def __enter__(self) -> ScoringClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def rerank(
        self,
        query: str,
        documents: Sequence[Document],
        *,
        top_n: int | None = None,
        model: str | None = None,
        ids: Sequence[str] | None = None,
        return_documents: bool = False,
        return_raw_scores: bool = False,
        activation: Literal["none", "sigmoid", "softmax"] | None = None,
        truncate: Literal["right", "left"] | None = None,
        max_tokens: int | None = None,
        max_document_tokens: int | None = None,
        instruction: str | None = None,
        long_documents: LongDocuments | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> RerankResult:
        """Documents are texts or token-id lists; ``truncate`` opts in to truncation (with
        ``max_document_tokens``, documents are cut to that many tokens of their own first);
        ``instruction`` replaces the model's task instruction (models whose GetInfo says
        ``takes_instruction``); ``long_documents`` scores over-long documents in windows."""
        request = rerank_pb2.RerankRequest(
            query=query,
            return_documents=return_documents,
            return_raw_scores=return_raw_scores,
            activation=_ACTIVATIONS[activation],
            request_id=request_id,
        )
        for i, doc in enumerate(documents):
            item = request.documents.add()
            if isinstance(doc, str):
                item.text = doc
            else:
                item.token_ids.ids.extend(doc)
            if ids is not None:
                item.id = ids[i]
        if top_n is not None:
            request.top_n = top_n
        _set_model_and_truncation(request, model, truncate, max_tokens)
        if max_document_tokens is not None:
            if truncate is None:
                raise ValueError("max_document_tokens cuts documents: it needs truncate='right' or 'left'")
            request.truncation.max_document_tokens = max_document_tokens
        if instruction is not None:
            request.instruction = instruction
        if long_documents is not None:
            request.long_documents.CopyFrom(long_documents.to_proto())
        response = self._call(next(self._turn).rerank.Rerank, request, timeout)
        return RerankResult(
            hits=[
                RerankHit(
                    index=r.index,
                    score=r.score,
                    id=r.id if r.HasField("id") else None,
                    raw_score=r.raw_score if r.HasField("raw_score") else None,
                    text=r.document.text if r.HasField("document") else None,
                    tokens=r.tokens,
                    windows=r.windows,
                    window=(r.window.start, r.window.end) if r.HasField("window") else None,
                )
                for r in response.results
            ],
            **_response_fields(response),
        )

    def analyze(
        self,
        items: Mapping[str, Sequence[str]] | None = None,
        pairs: Sequence[tuple[str, str]] = (),
        *,
        model: str | None = None,
        truncate: Literal["right", "left"] | None = None,
        max_tokens: int | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> AnalyzeResult:
        """Aspect sentiment: ``items`` maps a review to its aspects, ``pairs`` are
        (aspect, review); results follow that order (items first), one per pair."""
        request = absa_pb2.AnalyzeRequest(request_id=request_id)
        for review, aspects in (items or {}).items():
            request.items.add(review=review, aspects=list(aspects))
        for aspect, review in pairs:
            request.pairs.add(aspect=aspect, review=review)
        _set_model_and_truncation(request, model, truncate, max_tokens)
        response = self._call(next(self._turn).absa.Analyze, request, timeout)
        return AnalyzeResult(
            results=[
                AspectJudgement(
                    index=r.index,
                    aspect=r.aspect,
                    label=r.label,
                    probabilities={p.label: p.probability for p in r.probabilities},
                    span=(
                        Evidence(r.span.text, r.span.start, r.span.end, r.span.score)
                        if r.HasField("span")
                        else None
                    ),
                    id=r.id if r.HasField("id") else None,
                )
                for r in response.results
            ],
            **_response_fields(response),
        )

    def rank_images(
        self,
        query: str,
        images: Sequence[ImageRef],
        *,
        ids: Sequence[str] | None = None,
        top_n: int | None = None,
        model: str | None = None,
        truncate: Literal["right", "left"] | None = None,
        max_tokens: int | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> RankImagesResult:
        """Ranks images (bytes are sent as they are, strings are URLs) for a text query."""
        request = image_rank_pb2.RankImagesRequest(query=query, request_id=request_id)
        for i, image in enumerate(images):
            item = request.images.add(**({"data": image} if isinstance(image, bytes) else {"url": image}))
            if ids is not None:
                item.id = ids[i]
        if top_n is not None:
            request.top_n = top_n
        _set_model_and_truncation(request, model, truncate, max_tokens)
        response = self._call(next(self._turn).image_rank.RankImages, request, timeout)
        return RankImagesResult(
            results=[
                RankedImage(
                    index=r.index,
                    score=None if r.HasField("error") else r.score,
                    id=r.id if r.HasField("id") else None,
                    error=(
                        ImageError(grpc.StatusCode(_code(r.error.code)).name, r.error.message)
                        if r.HasField("error")
                        else None
                    ),
                )
                for r in response.results
            ],
            **_response_fields(response),
        )

    def info(self, timeout: float | None = None) -> info_pb2.GetInfoResponse:
        return self._call(self.info_stub.GetInfo, info_pb2.GetInfoRequest(), timeout)

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """``SERVING``, ``NOT_SERVING`` or ``SERVICE_UNKNOWN``, as the health protocol says."""
        response = self._call(
            self._health.Check, health_pb2.HealthCheckRequest(service=service), timeout
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def _call(self, method, request, timeout: float | None):  # type: ignore[no-untyped-def]
        try:
            return method(
                request,
                timeout=timeout if timeout is not None else self._timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise ScoringError(error) from None


def _code(value: int) -> tuple[int, str]:
    """grpc.StatusCode's value for a google.rpc code number."""
    return next(c.value for c in grpc.StatusCode if c.value[0] == value)

"""The HTTP routes: each turns its JSON into the protobuf request the gRPC service takes, scores
it through that same servicer (`score`: model lookup, validation, limits, admission, stage
metrics, engine), and turns the response back into its API's JSON. Every call is counted, timed,
traced and logged as a gRPC call is (service label `http`), and checked for the same bearer
token (health exempt, as on gRPC)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2
from pydantic import BaseModel, ValidationError

from scoring.v1 import absa_pb2, image_rank_pb2, rerank_pb2
from scoring_plugin.errors import InvalidInputError
from scoring_server import __version__
from scoring_server.engines import ModelRegistry
from scoring_server.errors import ServiceError, status_for, status_with_fields
from scoring_server.http import cohere, tei
from scoring_server.http.errors import PAYLOAD_TOO_LARGE, error_reply, in_caller_fields
from scoring_server.security import TokenCheck
from scoring_server.services.absa import AbsaServicer
from scoring_server.services.execution import timing_metadata
from scoring_server.services.image_rank import ImageRankServicer
from scoring_server.services.info import InfoServicer
from scoring_server.services.rerank import RerankServicer
from scoring_server.telemetry import recording

SERVICE_LABEL = "http"
HEALTH_METHOD = "health"
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
# "Failed to parse documents field: Failed to parse text field: ..." -> documents.text
_PARSE_FIELD = re.compile(r"Failed to parse (\w+) field: ")
_UNKNOWN_FIELD = re.compile(r'no field named "([^"]+)"')

Handler = Callable[[Any, str], Awaitable[Any]]


@dataclass(frozen=True)
class Servicers:
    """The gRPC servicers whose request path the HTTP routes share."""

    rerank: RerankServicer
    absa: AbsaServicer
    image_rank: ImageRankServicer
    info: InfoServicer


class _BodyTooLarge(Exception):
    pass


class _Routes:
    def __init__(self, servicers: Servicers, registry: ModelRegistry, tokens: TokenCheck, max_body_bytes: int) -> None:
        self._servicers = servicers
        self._registry = registry
        self._tokens = tokens
        self._max_body_bytes = max_body_bytes

    # ------------------------------------------------------------ the APIs

    async def cohere_v1(self, request: Request) -> Response:
        return await self._answer(request, "cohere_rerank_v1", self._cohere("1"), cohere.caller_field)

    async def cohere_v2(self, request: Request) -> Response:
        return await self._answer(request, "cohere_rerank_v2", self._cohere("2"), cohere.caller_field)

    def _cohere(self, version: Literal["1", "2"]) -> Handler:
        async def handle(body: Any, request_id: str) -> tuple[Any, rerank_pb2.RerankResponse]:
            parsed = _validated(cohere.CohereRerankRequest, body)
            response = await self._servicers.rerank.score(parsed.to_proto(request_id))
            return cohere.to_reply(response, parsed, version), response

        return handle

    async def tei_rerank(self, request: Request) -> Response:
        async def handle(body: Any, request_id: str) -> tuple[Any, rerank_pb2.RerankResponse]:
            parsed = _validated(tei.TeiRerankRequest, body)
            response = await self._servicers.rerank.score(parsed.to_proto(request_id))
            return tei.to_reply(response, parsed), response

        return await self._answer(request, "tei_rerank", handle, tei.caller_field)

    async def rerank(self, request: Request) -> Response:
        return await self._answer(request, "rerank", self._proto(rerank_pb2.RerankRequest, self._servicers.rerank.score))

    async def absa(self, request: Request) -> Response:
        return await self._answer(request, "absa", self._proto(absa_pb2.AnalyzeRequest, self._servicers.absa.score))

    async def image_rank(self, request: Request) -> Response:
        return await self._answer(
            request, "image_rank", self._proto(image_rank_pb2.RankImagesRequest, self._servicers.image_rank.score)
        )

    def _proto(self, message: type[Message], score: Callable[[Any], Awaitable[Message]]) -> Handler:
        """Our own messages in proto3's JSON mapping, as grpcurl and grpc-gateway write them."""

        async def handle(body: Any, request_id: str) -> tuple[Any, Message]:
            parsed = _parsed_message(message, body)
            if not parsed.request_id:  # type: ignore[attr-defined]
                parsed.request_id = request_id  # type: ignore[attr-defined]
            response = await score(parsed)
            return json_format.MessageToDict(response), response

        return handle

    async def info(self, request: Request) -> Response:
        async def handle(body: Any, request_id: str) -> tuple[Any, None]:
            return json_format.MessageToDict(self._servicers.info.describe()), None

        return await self._answer(request, "info", handle, read_body=False)

    async def health(self, request: Request) -> Response:
        """200 while every model serves; 503, naming the ones that do not, otherwise (TEI's
        `/health` and a Kubernetes HTTP probe read the status alone)."""
        with recording(SERVICE_LABEL, HEALTH_METHOD, _peer(request), lambda: None, _code_of) as record:
            models = {name: model.ready for name, model in self._registry.models.items()}
            if all(models.values()):
                return JSONResponse({"status": "SERVING", "models": models})
            record.code = grpc.StatusCode.UNAVAILABLE
            return error_reply(
                status_with_fields(code_pb2.UNAVAILABLE, "not serving: " + ", ".join(n for n, ok in models.items() if not ok))
            )

    # -------------------------------------------------------- one call's path

    async def _answer(
        self,
        request: Request,
        method: str,
        handle: Handler,
        caller_field: Callable[[str], str] = str,
        read_body: bool = True,
    ) -> Response:
        with recording(SERVICE_LABEL, method, _peer(request), lambda: request.headers.items(), _code_of) as record:
            try:
                if not self._tokens.allows(request.headers.get("authorization")):
                    raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, TokenCheck.REFUSAL)
                body = await self._body(request) if read_body else None
                request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
                reply, response = await handle(body, request_id)
            except _BodyTooLarge as exc:
                record.code = grpc.StatusCode.RESOURCE_EXHAUSTED
                return error_reply(status_with_fields(code_pb2.RESOURCE_EXHAUSTED, str(exc)), PAYLOAD_TOO_LARGE)
            except Exception as exc:  # mapped in one place, as for gRPC; internals are logged there
                status = in_caller_fields(status_for(exc), caller_field)
                record.code = _STATUS_CODES.get(status.code, grpc.StatusCode.UNKNOWN)
                record.fields["error"] = type(exc).__name__
                return error_reply(status)
            headers = dict(timing_metadata(response.timings)) if response is not None else {}
            return JSONResponse(reply, headers=headers)

    async def _body(self, request: Request) -> Any:
        """The JSON body, refused past the gRPC port's message limit before it is all read."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            raise _BodyTooLarge(f"the body's {declared} bytes exceed the limit of {self._max_body_bytes}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self._max_body_bytes:
                raise _BodyTooLarge(f"the body exceeds the limit of {self._max_body_bytes} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInputError.single("body", f"not valid JSON: {exc}") from None


def _validated(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidInputError.from_validation(exc) from None


def _parsed_message(message: type[Message], body: Any) -> Message:
    if not isinstance(body, dict):
        raise InvalidInputError.single("body", "must be a JSON object")
    try:
        return json_format.ParseDict(body, message())
    except json_format.ParseError as exc:
        text = str(exc).splitlines()[0]
        path = _PARSE_FIELD.findall(text)
        unknown = _UNKNOWN_FIELD.search(text)
        field = ".".join(path) if path else unknown.group(1) if unknown else "body"
        raise InvalidInputError.single(field, text) from None


def _peer(request: Request) -> str:
    client = request.client
    return f"ipv4:{client.host}:{client.port}" if client is not None else "unknown"


def _code_of(exc: BaseException) -> grpc.StatusCode:
    """Only what `_answer` lets through reaches telemetry: the task cancelled under the call."""
    return grpc.StatusCode.CANCELLED


def build_app(servicers: Servicers, registry: ModelRegistry, tokens: TokenCheck, max_body_bytes: int) -> FastAPI:
    app = FastAPI(title="scoring", version=__version__, openapi_url="/openapi.json", docs_url="/docs", redoc_url=None)
    routes = _Routes(servicers, registry, tokens, max_body_bytes)
    for path, endpoint in (
        ("/v1/rerank", routes.cohere_v1),
        ("/v2/rerank", routes.cohere_v2),
        ("/rerank", routes.tei_rerank),
        ("/scoring/v1/rerank", routes.rerank),
        ("/scoring/v1/absa", routes.absa),
        ("/scoring/v1/image-rank", routes.image_rank),
    ):
        app.add_api_route(path, endpoint, methods=["POST"])
    app.add_api_route("/scoring/v1/info", routes.info, methods=["GET"])
    app.add_api_route("/health", routes.health, methods=["GET"])
    return app

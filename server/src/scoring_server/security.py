"""Who may call: optional TLS / mutual TLS on the port and an optional bearer-token check.

Health stays callable without a token by default (kubelet and load-balancer probes carry
none); everything else, reflection included, needs one when tokens are configured. Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from scoring_server.interception import BehaviorInterceptor, Streaming, Unary


class TlsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cert_file: Path
    key_file: Path
    # Set: clients must present a certificate signed by this CA (mutual TLS).
    client_ca_file: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca_file.read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(self.key_file.read_bytes(), self.cert_file.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )


class AuthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[SecretStr] = Field(default_factory=list)
    # One token per line; read at start (rotate by restarting, or list old and new together).
    tokens_file: Path | None = None
    exempt_services: list[str] = Field(default_factory=lambda: ["grpc.health.v1.Health"])

    @model_validator(mode="after")
    def _load_file(self) -> AuthSettings:
        if self.tokens_file is not None:
            lines = self.tokens_file.read_text().splitlines()
            self.tokens += [SecretStr(line.strip()) for line in lines if line.strip()]
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)


class TokenCheck:
    """The bearer-token rule of both front doors (gRPC metadata, HTTP headers)."""

    REFUSAL = "a valid `authorization: Bearer <token>` is required"

    def __init__(self, settings: AuthSettings) -> None:
        self._tokens = [t.get_secret_value().encode() for t in settings.tokens]

    def allows(self, authorization: str | None) -> bool:
        if not self._tokens:
            return True
        if authorization is None or not authorization.startswith("Bearer "):
            return False
        offered = authorization[len("Bearer "):].encode()
        # Every token compared, match or not: timing says nothing about which failed.
        return any([hmac.compare_digest(offered, token) for token in self._tokens])


class BearerTokenInterceptor(BehaviorInterceptor):
    def __init__(self, settings: AuthSettings) -> None:
        self._check = TokenCheck(settings)
        self._exempt = tuple(f"/{service}/" for service in settings.exempt_services)

    def _allowed(self, method: str, context: grpc.aio.ServicerContext) -> bool:
        if method.startswith(self._exempt):
            return True
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                return self._check.allows(value)
        return False

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, TokenCheck.REFUSAL)

    def wrap_unary(self, behavior: Unary, method: str) -> Unary:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not self._allowed(method, context):
                await self._refuse(context)
            return await behavior(request, context)

        return wrapped

    def wrap_stream(self, behavior: Streaming, method: str) -> Streaming:
        async def wrapped(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            if not self._allowed(method, context):
                await self._refuse(context)
            async for response in behavior(requests, context):
                yield response

        return wrapped

"""Runs the HTTP app on the gRPC server's event loop with uvicorn, on a socket of our own (so
several front-end processes share the port with SO_REUSEPORT, as they share the gRPC port), and
without uvicorn's signal handling: the gRPC server's SIGTERM drain stops both doors."""

from __future__ import annotations

import logging
import socket
import ssl

import uvicorn
from fastapi import FastAPI

from scoring_server.security import TlsSettings

logger = logging.getLogger(__name__)


class HttpServer:
    def __init__(self, app: FastAPI, host: str, port: int, shared: bool, tls: TlsSettings | None, drain_grace_s: float) -> None:
        tls_options: dict[str, object] = {}
        if tls is not None:
            tls_options = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
            if tls.client_ca_file is not None:  # mutual TLS, as on the gRPC port
                tls_options |= {"ssl_ca_certs": str(tls.client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        self._config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,  # telemetry writes one line per call, as for gRPC
            log_config=None,
            date_header=False,  # uvicorn refreshes it from a polling loop we do not run
            timeout_graceful_shutdown=drain_grace_s,
            **tls_options,  # type: ignore[arg-type]
        )
        self._server = uvicorn.Server(self._config)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._socket.bind((host, port))
        self.port: int = self._socket.getsockname()[1]
        self._host = host

    async def start(self) -> None:
        self._config.load()
        self._server.lifespan = self._config.lifespan_class(self._config)
        await self._server.startup(sockets=[self._socket])
        await self._server.on_tick(0)  # the default response headers, set once
        logger.info("HTTP on %s://%s:%d", "https" if self._config.ssl else "http", self._host, self.port)

    async def stop(self) -> None:
        """Stops accepting, lets calls in flight finish within the drain grace."""
        if self._server.started:
            await self._server.shutdown(sockets=[self._socket])
        else:
            self._socket.close()

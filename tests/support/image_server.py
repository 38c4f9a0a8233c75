"""A local HTTP server for image-URL tests: good images, and every way a download goes wrong."""

from __future__ import annotations

import io
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from PIL import Image

MIB = 1024 * 1024


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height (a decompression bomb's first bytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def gif_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, format="GIF")
    return buffer.getvalue()


class _Listener(ThreadingHTTPServer):
    # The default backlog of 5 drops bursts of connections, and a dropped SYN is retried only
    # after a second: the delay would be the test server's, not the fetcher's.
    request_queue_size = 256
    daemon_threads = True


class LocalHttpServer:
    """A threaded HTTP/1.1 server on loopback whose GETs go to `route(handler, path)` (the path
    without its query); a client hanging up mid-answer ends only that answer."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                try:
                    owner.route(self, self.path.split("?")[0])
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = _Listener(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def route(self, h: BaseHTTPRequestHandler, path: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @contextmanager
    def running(self) -> Iterator[Self]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.close()


class ImageServer(LocalHttpServer):
    """Serves `images` at /img/<i> and the failure routes below; counts hits per path."""

    def __init__(self, images: list[bytes]) -> None:
        super().__init__()
        self.images = images
        self.hits: Counter[str] = Counter()

    def route(self, h: BaseHTTPRequestHandler, route: str) -> None:
        self.hits[h.path] += 1
        if route.startswith("/img/"):
            self._send(h, 200, self.images[int(route.rsplit("/", 1)[1])], "image/jpeg")
        elif route == "/missing":
            self._send(h, 404, b"no", "text/plain")
        elif route == "/error":
            self._send(h, 503, b"busy", "text/plain")
        elif route == "/html":
            self._send(h, 200, b"<html>not an image</html>", "text/html; charset=utf-8")
        elif route == "/octet":
            self._send(h, 200, self.images[0], "application/octet-stream")
        elif route == "/slow":
            time.sleep(6)
            self._send(h, 200, self.images[0], "image/png")
        elif route == "/trickle":
            h.send_response(200)
            h.send_header("Content-Type", "image/png")
            h.send_header("Content-Length", "1000")
            h.end_headers()
            for _ in range(30):
                h.wfile.write(b"\x00")
                h.wfile.flush()
                time.sleep(0.3)
        elif route == "/huge-declared":
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", str(40 * MIB))
            h.end_headers()
            h.wfile.write(b"\xff" * MIB)
        elif route == "/huge-undeclared":
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Connection", "close")
            h.end_headers()
            for _ in range(20):
                h.wfile.write(b"\xff" * MIB)
            h.close_connection = True
        elif route == "/broken":
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", "100000")
            h.end_headers()
            h.wfile.write(self.images[0][:100])
            h.wfile.flush()
            h.close_connection = True
        elif route == "/truncated":
            self._send(h, 200, self.images[0][: len(self.images[0]) // 2], "image/jpeg")
        elif route == "/bomb":
            self._send(h, 200, png_header_only(100_000, 100_000), "image/png")
        elif route == "/once-per-connection":
            # Keep-alive, then the connection's next request is read and never answered: a
            # server closing an idle keep-alive connection as the client reuses it.
            if getattr(h, "answered", False):
                h.close_connection = True
                return
            h.answered = True  # type: ignore[attr-defined]  # the handler lives as long as its connection
            self._send(h, 200, self.images[2], "image/jpeg")
        elif route == "/gif":
            self._send(h, 200, gif_bytes(), "image/gif")
        elif route == "/redirect-ok":
            self._redirect(h, "/img/1")
        elif route == "/redirect-private":
            self._redirect(h, "http://169.254.169.254/latest/meta-data")
        elif route == "/redirect-loop":
            self._redirect(h, "/redirect-loop")
        else:
            self._send(h, 404, b"", "text/plain")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    @staticmethod
    def _redirect(h: BaseHTTPRequestHandler, location: str) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

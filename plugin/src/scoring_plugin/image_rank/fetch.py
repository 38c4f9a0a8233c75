"""Image downloads: http(s) only, public addresses only (unless allow-listed), every redirect
re-checked, size and time capped, over pooled keep-alive connections.

The address policy is enforced twice: on the names' resolved addresses before connecting (a
clear error), and on the socket's actual peer when a connection opens, so a name that resolves
differently the second time (DNS rebinding) still cannot reach a private address.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, NewConnectionError, TimeoutError as Urllib3Timeout

from scoring_plugin.image_rank.settings import ImageRankSettings, IPNetwork
from scoring_plugin.image_rank.types import ImageErrorKind, ImageLoadError

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
# Types a server may label an image with; anything else (text/html error pages) is refused.
_ACCEPTED_TYPES = ("image/", "application/octet-stream", "binary/octet-stream")


class AddressPolicy:
    """Public unicast addresses are allowed; private, loopback, link-local, multicast, reserved
    and unspecified ones only inside an allow-listed network."""

    def __init__(self, allowed: tuple[IPNetwork, ...]) -> None:
        self._allowed = allowed

    def allows(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in network for network in self._allowed):
            return True
        return ip.is_global and not ip.is_multicast


class _ForbiddenPeer(NewConnectionError):
    pass


def _checked(connection: type[HTTPConnection], policy: AddressPolicy) -> type[HTTPConnection]:
    class Checked(connection):  # type: ignore[misc, valid-type]
        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            peer = sock.getpeername()[0]
            if not policy.allows(peer):
                sock.close()
                raise _ForbiddenPeer(self, f"address {peer} is not allowed")
            return sock

    return Checked


class UrlFetcher:
    """Blocking fetches (run them in a bounded thread pool); thread-safe."""

    def __init__(self, settings: ImageRankSettings) -> None:
        self._settings = settings
        self._policy = AddressPolicy(settings.networks())
        self._pools = urllib3.PoolManager(
            num_pools=64,
            maxsize=settings.fetch_connections_per_host,
            block=False,
            retries=False,
            headers={"User-Agent": "scoring-image-ranker", "Accept": "image/*"},
        )
        self._pools.pool_classes_by_scheme = {
            "http": type("CheckedHTTPPool", (HTTPConnectionPool,),
                         {"ConnectionCls": _checked(HTTPConnection, self._policy)}),
            "https": type("CheckedHTTPSPool", (HTTPSConnectionPool,),
                          {"ConnectionCls": _checked(HTTPSConnection, self._policy)}),
        }

    def close(self) -> None:
        self._pools.clear()

    def fetch(self, url: str) -> bytes:
        deadline = time.monotonic() + self._settings.fetch_timeout_s
        for _ in range(self._settings.max_redirects + 1):
            self.check_url(url)
            response = self._open(url, deadline)
            try:
                if response.status in _REDIRECTS:
                    location = response.headers.get("Location")
                    if not location:
                        raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"HTTP {response.status} without Location")
                    url = urljoin(url, location)
                    response.close()  # a redirect's body is never read: it could be endless
                    continue
                body = self._body(response, deadline)
            except BaseException:
                response.close()  # a half-read connection must never go back to the pool
                raise
            response.release_conn()
            return body
        raise ImageLoadError(
            ImageErrorKind.FETCH_FAILED, f"more than {self._settings.max_redirects} redirects"
        )

    def check_url(self, url: str) -> None:
        """Scheme and resolved addresses, before any connection is made."""
        problem = url_problem(url)
        if problem is not None:  # a redirect can point anywhere
            raise ImageLoadError(ImageErrorKind.URL_FORBIDDEN, problem)
        parts = urlsplit(url)
        if parts.username or parts.password:
            raise ImageLoadError(ImageErrorKind.URL_FORBIDDEN, "URLs with credentials are refused")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, ValueError) as exc:
            raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"cannot resolve host: {exc}") from None
        for *_, address in infos:
            if not self._policy.allows(address[0]):
                raise ImageLoadError(
                    ImageErrorKind.URL_FORBIDDEN,
                    f"host resolves to {address[0]}, a non-public address that is not allow-listed",
                )

    def _open(self, url: str, deadline: float) -> urllib3.BaseHTTPResponse:
        remaining = _remaining(deadline)
        try:
            return self._pools.request(
                "GET",
                url,
                preload_content=False,
                redirect=False,
                timeout=urllib3.Timeout(connect=remaining, read=remaining),
            )
        except _ForbiddenPeer as exc:
            raise ImageLoadError(ImageErrorKind.URL_FORBIDDEN, str(exc).split(": ", 1)[-1]) from None
        except Urllib3Timeout:
            raise ImageLoadError(ImageErrorKind.FETCH_TIMEOUT, "the image server did not answer in time") from None
        except HTTPError as exc:
            raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"cannot fetch: {type(exc).__name__}") from None

    def _body(self, response: urllib3.BaseHTTPResponse, deadline: float) -> bytes:
        if response.status in (404, 410):
            raise ImageLoadError(ImageErrorKind.NOT_FOUND, f"HTTP {response.status}")
        if response.status != 200:
            raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"HTTP {response.status}")
        content_type = (response.headers.get("Content-Type") or "").lower()
        if content_type and not content_type.startswith(_ACCEPTED_TYPES):
            raise ImageLoadError(ImageErrorKind.INVALID_IMAGE, f"served as {content_type.split(';')[0]}, not an image")
        limit = self._settings.max_image_bytes
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ImageLoadError(ImageErrorKind.TOO_LARGE, f"{declared} bytes declared, over the limit of {limit}")
        body = bytearray()
        try:
            while True:
                _remaining(deadline)
                chunk = response.read1(_CHUNK)
                if not chunk:
                    break
                body += chunk
                if len(body) > limit:
                    raise ImageLoadError(ImageErrorKind.TOO_LARGE, f"more than {limit} bytes sent")
        except Urllib3Timeout:
            raise ImageLoadError(ImageErrorKind.FETCH_TIMEOUT, "the download did not finish in time") from None
        except HTTPError as exc:
            raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"download broke off: {type(exc).__name__}") from None
        return bytes(body)


def url_problem(url: str) -> str | None:
    """What makes `url` unfetchable whatever it resolves to, or None."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "only http and https URLs are accepted"
    if not parts.hostname:
        return "URL has no host"
    return None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ImageLoadError(ImageErrorKind.FETCH_TIMEOUT, "the download did not finish in time")
    return left

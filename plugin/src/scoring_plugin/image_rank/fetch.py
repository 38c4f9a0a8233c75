"""Image downloads: http(s) only, public addresses only (unless allow-listed), every redirect
re-checked, size and time capped, over pooled keep-alive connections, each stoppable at once.

The address policy is enforced twice: on the names' resolved addresses before connecting (a
clear error), and on the socket's actual peer when a connection opens, so a name that resolves
differently the second time (DNS rebinding) still cannot reach a private address.

A download is stopped by shutting its sockets down from another thread, which wakes a read
blocked on them at once (over TLS too); a socket timeout alone cannot do it, since it bounds each
read rather than their sum and a server that trickles a byte per read never trips it. Two things
stop a download: its whole-download deadline (`fetch_timeout_s`, one watchdog thread for every
download) and the end of the call it belongs to (:class:`CallDownloads`), so a caller that gives
up or runs out of time releases its workers at once. A connect in progress cannot be woken so;
its socket timeout is the download's remaining time.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import socket
import threading
import time
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError, TimeoutError as Urllib3Timeout

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


class Download:
    """One fetch's sockets, so that another thread can stop it."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._finished = False
        self.stopped: ImageLoadError | None = None

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
            stopped = self.stopped is not None
        if stopped:  # stopped while connecting: nothing was watched yet
            _shut(sock)

    def stop(self, why: ImageLoadError) -> None:
        with self._lock:
            if self._finished or self.stopped is not None:
                return
            self.stopped = why
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def finish(self) -> ImageLoadError | None:
        """Forgets the sockets, which keep-alive may hand to another download next; says why
        the download was stopped, if it was."""
        with self._lock:
            self._finished = True
            self._sockets.clear()
            return self.stopped


class CallDownloads:
    """The downloads of one call, stopped together when the call ends before they do."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Download] = set()
        self._ended = False

    def add(self, download: Download) -> None:
        with self._lock:
            self._running.add(download)
            ended = self._ended
        if ended:
            download.stop(_call_ended())

    def discard(self, download: Download) -> None:
        with self._lock:
            self._running.discard(download)

    def stop(self) -> None:
        with self._lock:
            self._ended = True
            running = list(self._running)
        for download in running:
            download.stop(_call_ended())


def _call_ended() -> ImageLoadError:
    return ImageLoadError(ImageErrorKind.FETCH_FAILED, "the call ended before the download did")


def _timed_out() -> ImageLoadError:
    return ImageLoadError(ImageErrorKind.FETCH_TIMEOUT, "the download did not finish in time")


def _shut(sock: socket.socket) -> None:
    try:
        # socket.socket's own shutdown, also for a TLS socket: SSLSocket.shutdown would drop its
        # TLS state under the thread still reading from it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected: nothing left to wake


class _Watchdog:
    """Stops each download at its deadline: one thread and a heap of deadlines for every
    download, rather than a timer thread each. A finished download ignores its stop."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._heap: list[tuple[float, int, Download]] = []
        self._order = itertools.count()  # ties never compare downloads
        self._closed = False
        threading.Thread(target=self._run, name="image-fetch-deadlines", daemon=True).start()

    def add(self, download: Download) -> None:
        with self._wake:
            heapq.heappush(self._heap, (download.deadline, next(self._order), download))
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while not self._closed:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    heapq.heappop(self._heap)[2].stop(_timed_out())
                self._wake.wait(self._heap[0][0] - now if self._heap else None)


# The download the current worker thread runs, for the connection classes' hooks: urllib3 makes
# and reuses connections deep inside a request, with no argument to carry it there.
_current = threading.local()


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
            _watch(sock)  # before any TLS handshake, which a server can trickle too
            return sock

        def getresponse(self, *args: object, **kwargs: object) -> urllib3.BaseHTTPResponse:
            _watch(self.sock)  # a kept-alive connection's socket, made by an earlier download
            return super().getresponse(*args, **kwargs)

    return Checked


def _stopped() -> bool:
    download: Download | None = getattr(_current, "download", None)
    return download is not None and download.stopped is not None


def _watch(sock: socket.socket | None) -> None:
    download: Download | None = getattr(_current, "download", None)
    if download is not None and sock is not None:
        download.watch(sock)


class UrlFetcher:
    """Blocking fetches (run them in the loader's download pool); thread-safe."""

    def __init__(self, settings: ImageRankSettings) -> None:
        self._settings = settings
        self._policy = AddressPolicy(settings.networks())
        self._watchdog = _Watchdog()
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
        self._watchdog.close()
        self._pools.clear()

    def fetch(self, url: str, call: CallDownloads | None = None) -> bytes:
        """The body at `url`; `call`, when given, can stop this download from another thread."""
        download = Download(time.monotonic() + self._settings.fetch_timeout_s)
        self._watchdog.add(download)
        if call is not None:
            call.add(download)
        _current.download = download
        try:
            response, body = self._follow(url, download.deadline)
        except Exception:
            stopped = download.finish()
            if stopped is not None:  # whatever the cut-off read raised, the stop says why
                raise stopped from None
            raise
        finally:
            _current.download = None
            if call is not None:
                call.discard(download)
        stopped = download.finish()
        if stopped is not None:  # a body without Content-Length ends at the cut: incomplete
            response.close()
            raise stopped
        response.release_conn()  # only now: the stop can no longer reach the pooled socket
        return body

    def _follow(self, url: str, deadline: float) -> tuple[urllib3.BaseHTTPResponse, bytes]:
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
                return response, self._body(response, deadline)
            except BaseException:
                response.close()  # a half-read connection must never go back to the pool
                raise
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
        try:
            try:
                return self._get(url, deadline)
            except ProtocolError:
                # The connection dropped before any answer: most often a pooled keep-alive
                # connection that its server closed as it was reused (an idle timeout racing the
                # reuse). A GET can go again, once, unless the download was stopped.
                if _stopped():
                    raise
                return self._get(url, deadline)
        except _ForbiddenPeer as exc:
            raise ImageLoadError(ImageErrorKind.URL_FORBIDDEN, str(exc).split(": ", 1)[-1]) from None
        except NewConnectionError as exc:
            # Before the timeout clause: urllib3 makes a failed connection a kind of connect
            # timeout, but a refused or unreachable host is not one.
            raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"cannot connect: {_reason(exc)}") from None
        except Urllib3Timeout:
            raise ImageLoadError(ImageErrorKind.FETCH_TIMEOUT, "the image server did not answer in time") from None
        except HTTPError as exc:
            raise ImageLoadError(ImageErrorKind.FETCH_FAILED, f"cannot fetch: {type(exc).__name__}") from None

    def _get(self, url: str, deadline: float) -> urllib3.BaseHTTPResponse:
        remaining = _remaining(deadline)
        timeout = urllib3.Timeout(connect=remaining, read=remaining)
        return self._pools.request("GET", url, preload_content=False, redirect=False, timeout=timeout)

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
            raise _timed_out() from None
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


def _reason(exc: NewConnectionError) -> str:
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return type(cause or exc).__name__


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _timed_out()
    return left

"""Serves a directory of pictures over HTTP/1.1 keep-alive for the image benchmark's URL runs.

Not `python -m http.server`: its HTTP/1.0 closes every connection and its listen backlog of 5
drops connection bursts, which adds 1 s SYN retries to the very latencies being measured.

    python bench/picture_server.py DIR PORT
"""

from __future__ import annotations

import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class KeepAliveHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


def main() -> None:
    directory, port = sys.argv[1], int(sys.argv[2])
    Server(("127.0.0.1", port), partial(KeepAliveHandler, directory=directory)).serve_forever()


if __name__ == "__main__":
    main()

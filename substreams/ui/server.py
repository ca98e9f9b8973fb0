"""The dashboard's HTTP server: the page, its live feed, and stream tails for tools.

Why the standard library's ``http.server`` (see docs/design.md): the dashboard needs four
GET routes on 127.0.0.1 and one-way pushes, which server-sent events give over plain
HTTP/1.1 (the browser's ``EventSource`` reconnects by itself); a thread per connection is
plenty for a handful of operators, and no web framework joins the dependencies.

Routes:

- ``/`` the page; ``/state`` the current snapshot as JSON;
- ``/events`` server-sent events, one ``data:`` line of JSON per change (a comment every
  15 s keeps proxies from closing an idle stream);
- ``/tail/STREAM?from_index=N|from_order_key=K&follow=1`` the stream's entries as JSON
  lines in a chunked response, the same lines as ``substreams tail --json``.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from substreams.config import Config
from substreams.errors import SubstreamsError
from substreams.streams.tail import json_line, open_listener, tail
from substreams.ui.model import DashboardModel
from substreams.ui.page import PAGE

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: DashboardServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # -- helpers -------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, "application/json")

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- routes --------------------------------------------------------------------------

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, PAGE.encode(), "text/html; charset=utf-8")
            elif url.path == "/state":
                body = json.dumps(self.server.model.snapshot()).encode()
                self._send(HTTPStatus.OK, body, "application/json")
            elif url.path == "/events":
                self._events()
            elif url.path.startswith("/tail/"):
                self._tail(unquote(url.path[len("/tail/"):]), parse_qs(url.query))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away

    def _events(self) -> None:
        model = self.server.model
        self._start_chunked("text/event-stream")
        self._chunk(b"retry: 1000\n\n")
        version = 0
        while not self.server.stopping.is_set():
            got = model.wait(version, KEEPALIVE_S)
            if got is None:
                self._chunk(b": keep-alive\n\n")
                continue
            version, snap = got
            self._chunk(b"data: " + json.dumps(snap).encode() + b"\n\n")
        self._end_chunked()

    def _tail(self, stream: str, query: dict[str, list[str]]) -> None:
        def one(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None

        try:
            from_index = _int(one("from_index"), "from_index")
            from_key = _int(one("from_order_key"), "from_order_key")
            if from_index is not None and from_key is not None:
                raise SubstreamsError("give from_index or from_order_key, not both")
            listener = open_listener(
                self.server.config,
                stream,
                from_index=from_index,
                from_order_key=from_key,
                bootstrap=self.server.model.bootstrap,
                reader="ui.tail",
            )
        except SubstreamsError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        follow = one("follow") in ("1", "true", "yes")
        try:
            self._start_chunked("application/x-ndjson")
            try:
                for entry in tail(listener, follow=follow, stop=self.server.stopping):
                    self._chunk(json_line(entry).encode() + b"\n")
            except SubstreamsError as exc:  # on_bad_record: fail -- said, not dropped
                self._chunk(json.dumps({"error": str(exc)}).encode() + b"\n")
            self._end_chunked()
        finally:
            listener.close()


def _int(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise SubstreamsError(f"{name}: not an integer: {value!r}") from None


class DashboardServer(ThreadingHTTPServer):
    """Serves one :class:`DashboardModel` on ``host:port`` (0: any free port)."""

    daemon_threads = True

    def __init__(self, config: Config, model: DashboardModel, host: str, port: int) -> None:
        self.config = config
        self.model = model
        self.stopping = threading.Event()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def stop(self) -> None:
        """Stop serving: open event streams and tails end, the model stops following."""
        self.stopping.set()
        self.model.close()
        self.shutdown()
        self.server_close()


def serve(
    config: Config, *, host: str = "127.0.0.1", port: int = 8642, bootstrap: str | None = None
) -> DashboardServer:
    """Start the model and a server in a daemon thread; ``stop()`` ends both."""
    model = DashboardModel(config, bootstrap)
    model.start()
    server = DashboardServer(config, model, host, port)
    threading.Thread(target=server.serve_forever, name="dashboard-http", daemon=True).start()
    return server

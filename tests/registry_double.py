"""A Schema Registry *double*: the two REST calls of the Confluent API that confluent-kafka's
``SchemaRegistryClient`` makes to register a schema and to fetch one by id, in memory.

Why a double and not a real registry: none runs here.  Confluent's Schema Registry is not
on Maven Central or PyPI; Apicurio Registry's app (``io.apicurio:apicurio-registry-app``,
Confluent-compatible under ``/apis/ccompat/v7``) is published only as a Quarkus module that
needs build-time augmentation (no ``runner`` jar: 2.6.13.Final:runner is not served) and
whose own dependencies Maven Central does not all serve: 3.3.3 needs
``apicurio-registry-schema-util-provider`` and ``apicurio-registry-contracts-rules`` 3.3.3,
2.6.13.Final ``apicurio-registry-schema-util-provider`` 2.6.13.Final, 2.4.2.Final
``org.everit.json.schema`` 1.14.2 (jitpack only), and 3.0.9's parent POM is not served;
Karapace is not on the package index here.  The client, the serializer and the wire format
under test are confluent-kafka's own; only the server is this.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[int, str] = {}
        self.ids: dict[str, int] = {}
        self.versions: dict[str, list[int]] = {}


def _handler(registry: _Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].strip("/").split("/")
            if len(path) == 3 and path[:2] == ["schemas", "ids"] and path[2].isdigit():
                with registry.lock:
                    text = registry.by_id.get(int(path[2]))
                if text is not None:
                    self._send(200, {"schema": text})
                    return
                self._send(404, {"error_code": 40403, "message": "Schema not found"})
                return
            self._send(404, {"error_code": 404, "message": "not in the double"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].strip("/").split("/")
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if len(path) == 3 and path[0] == "subjects" and path[2] == "versions":
                text = body["schema"]
                with registry.lock:
                    sid = registry.ids.get(text)
                    if sid is None:
                        sid = registry.ids[text] = len(registry.by_id) + 1
                        registry.by_id[sid] = text
                    versions = registry.versions.setdefault(path[1], [])
                    if sid not in versions:
                        versions.append(sid)
                    version = versions.index(sid) + 1
                self._send(200, {"id": sid, "subject": path[1], "version": version})
                return
            self._send(404, {"error_code": 404, "message": "not in the double"})

    return Handler


@contextmanager
def registry_double() -> Iterator[str]:
    """A running double on a free port; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(_Registry()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

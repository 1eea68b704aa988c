"""Servers on 127.0.0.1 for the stream tests: an S3-compatible one (moto in server mode) and a
plain HTTP one with range requests and injected faults. Nothing leaves the machine."""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
from collections.abc import Iterator
from typing import Any, ClassVar


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, Any]]:
    """moto's S3 on a free loopback port; yields the storage options s3fs needs."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "us-west-2"},
        "skip_instance_cache": True,
    }
    try:
        yield options
    finally:
        server.stop()


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves a folder with HEAD and single-range GETs. ``faults[name]`` GETs of a file reset
    the connection after half the range (a connection reset mid-shard)."""

    folder = "."
    faults: ClassVar[dict[str, int]] = {}
    requests: ClassVar[list[str]] = []
    heads: ClassVar[list[str]] = []
    protocol_version = "HTTP/1.1"

    def _file(self) -> bytes | None:
        path = os.path.join(self.folder, self.path.lstrip("/"))
        if not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        with open(path, "rb") as f:
            return f.read()

    def do_HEAD(self) -> None:
        self.heads.append(self.path)
        data = self._file()
        if data is not None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

    def do_GET(self) -> None:
        self.requests.append(self.path)
        data = self._file()
        if data is None:
            return
        first, last = 0, len(data) - 1
        spec = self.headers.get("Range")
        if spec:
            a, _, b = spec.removeprefix("bytes=").partition("-")
            first, last = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
        body = data[first : last + 1]
        self.send_response(206 if spec else 200)
        self.send_header("Content-Length", str(len(body)))
        if spec:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.end_headers()
        self._body(body, first)

    def _body(self, body: bytes, first: int) -> None:
        """Send the range's bytes (from byte *first* of the file), or fail as told."""
        name = self.path.lstrip("/")
        if self.faults.get(name, 0) > 0:
            self.faults[name] -= 1
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)  # reset mid-body
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def http_server(folder: str) -> Iterator[tuple[str, type[_Files]]]:
    """Serve *folder* on a free loopback port: ``(base URL, handler class)`` (set
    ``handler.faults`` to inject resets; ``handler.requests`` lists the GETs, ``handler.heads`` the HEADs)."""
    handler = type(
        "Files", (_Files,), {"folder": folder, "faults": {}, "requests": [], "heads": []}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

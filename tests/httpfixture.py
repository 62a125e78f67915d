"""A local HTTP server for download tests: 127.0.0.1 only, Range requests, injectable faults.

Tests import the `server` fixture (`from httpfixture import server`); pytest puts tests/
on sys.path, as there is no tests/__init__.py.
"""
import http.server
import re
import socket
import struct
import threading

import pytest


class Server(http.server.ThreadingHTTPServer):
    """Serves `files` with optional Range support; can drop one response after `cut_after` bytes."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.files, self.requests = {}, []
        self.range_support = True
        self.cut_after, self.cut_mode = None, "eof"

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def handle_error(self, request, client_address):
        pass  # the deliberate resets would print tracebacks


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        body = srv.files.get(self.path.lstrip("/"))
        rng = self.headers.get("Range")
        record = {"path": self.path, "range": rng}
        srv.requests.append(record)
        if body is None:
            record["status"] = 404
            self.send_error(404)
            return
        start, status = 0, 200
        if rng and srv.range_support:
            start, status = int(re.fullmatch(r"bytes=(\d+)-", rng)[1]), 206
            if start >= len(body):
                record["status"] = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        payload = body[start:]
        record["status"] = status
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        if srv.cut_after is not None:
            k, srv.cut_after = srv.cut_after, None
            self.wfile.write(payload[:k])
            self.wfile.flush()
            if srv.cut_mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        self.wfile.write(payload)


@pytest.fixture
def server():
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()

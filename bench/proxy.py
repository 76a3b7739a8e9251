"""A small HTTP proxy in front of a local object store: it adds a fixed latency to every request (one cloud
round trip) and counts the requests, so that writes and reads cost what they would against S3 or GCS.

    with LatencyProxy("127.0.0.1:9000", latency_s=0.02) as proxy:
        fs = pyarrow.fs.S3FileSystem(endpoint_override=proxy.endpoint, scheme="http", ...)
        ...
        proxy.count()  # requests so far; proxy.reset() starts again

Clients reach the store only through ``proxy.endpoint``; the Host header is passed on as sent (S3 signs it).
The proxy runs in a process of its own: some pyarrow calls (GCS's ``open_input_file``) hold the GIL while
they wait for the answer, which a proxy thread in the same process could then never send.
Used by ``python -m bench --only objectstore`` and tests/test_objectstore.py (latency 0: counting only).
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import os
import subprocess
import sys
import threading
import time

__all__ = ["LatencyProxy"]

# Hop-by-hop headers, which a proxy must not pass on (RFC 9110, 7.6.1); the body is re-sent with a length.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


# The proxy's own paths: its counts as JSON, and a reset.
_COUNTS, _RESET = "/__proxy__/counts", "/__proxy__/reset"


class LatencyProxy:
    """The proxy, run in a child process; its counts are read over HTTP."""

    def __init__(self, upstream: str, latency_s: float = 0.0):
        self.upstream = upstream
        self.latency_s = latency_s
        self._process: subprocess.Popen | None = None
        self.endpoint = ""

    def __enter__(self) -> LatencyProxy:
        self._process = subprocess.Popen([sys.executable, "-m", "bench.proxy", self.upstream, str(self.latency_s)],
                                         stdout=subprocess.PIPE, text=True,
                                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert self._process.stdout is not None
        self.endpoint = self._process.stdout.readline().strip()
        if not self.endpoint:
            raise RuntimeError("the latency proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=30)

    def _call(self, path: str) -> dict[str, int]:
        conn = http.client.HTTPConnection(self.endpoint, timeout=30)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def counts(self) -> dict[str, int]:
        """Requests since the last reset, by HTTP method."""
        return self._call(_COUNTS)

    def count(self) -> int:
        return sum(self.counts().values())

    def reset(self) -> None:
        self._call(_RESET)


class _Proxy:
    def __init__(self, upstream: str, latency_s: float = 0.0):
        self.upstream = upstream
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"127.0.0.1:{self._server.server_address[1]}"

    def serve(self) -> None:
        self._server.serve_forever()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _own(self) -> bool:
                if self.path not in (_COUNTS, _RESET):
                    return False
                with proxy._lock:
                    data = json.dumps(dict(proxy._counts)).encode()
                    if self.path == _RESET:
                        proxy._counts.clear()
                self.send_response_only(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return True

            def _forward(self) -> None:
                body = self._body()
                if self._own():
                    return
                with proxy._lock:
                    proxy._counts[self.command] += 1
                if proxy.latency_s:
                    time.sleep(proxy.latency_s)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or self.command in ("POST", "PUT"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.upstream, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                else:
                    length = resp.getheader("Content-Length")
                    if length is not None:
                        self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _forward

        return Handler


if __name__ == "__main__":
    server = _Proxy(sys.argv[1], float(sys.argv[2]))
    print(server.endpoint, flush=True)
    server.serve()

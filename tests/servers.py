"""Real servers on loopback for the remote-storage tests.

* :func:`range_http_server`: an HTTP server on 127.0.0.1 serving a directory, with ``Range``
  requests honoured (206 + Content-Range; python's http.server ignores them), the query string
  ignored, and every request logged (method, path, query, Range header, status). Paths under
  ``signed_prefix`` answer 403 unless the query carries ``X-Amz-Signature=<signature>`` (a
  stand-in for a signed URL). ``ranges=False`` makes it answer every GET with the whole file
  (200), as servers without range support do.
* :func:`moto_s3_server`: moto's S3 API server on 127.0.0.1 (random port), and the fsspec
  configuration that makes ``s3://`` URLs use it through s3fs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["HttpServer", "range_http_server", "moto_s3_server", "have_curl"]

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class Request:
    method: str
    path: str
    query: str
    range: str | None
    status: int


@dataclass
class HttpServer:
    root: str
    url: str  # http://127.0.0.1:PORT
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests(self, path_suffix: str = "", method: str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.log if r.path.endswith(path_suffix) and (method is None or r.method == method)]

    def clear(self) -> None:
        with self.lock:
            self.log.clear()


def _handler(server: HttpServer, ranges: bool, signed_prefix: str | None, signature: str) -> type:
    class Handler(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=server.root, **kwargs)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _record(self, status: int) -> None:
            parts = urlsplit(self.path)
            with server.lock:
                server.log.append(
                    Request(self.command, unquote(parts.path), parts.query, self.headers.get("Range"), status)
                )

        def _fail(self, status: int) -> None:
            self._record(status)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            parts = urlsplit(self.path)
            rel = unquote(parts.path)
            if signed_prefix is not None and rel.startswith(signed_prefix):
                given = parse_qs(parts.query).get("X-Amz-Signature", [""])
                if len(given) != 1 or not given[0].startswith(signature):
                    self._fail(403)
                    return
                rel = "/" + rel[len(signed_prefix) :].lstrip("/")
            path = os.path.join(server.root, rel.lstrip("/"))
            if not os.path.isfile(path):
                self._fail(404)
                return
            size = os.path.getsize(path)
            start, end = 0, size  # [start, end)
            status = 200
            spec = self.headers.get("Range") if ranges else None
            if spec is not None:
                m = _RANGE.match(spec.strip())
                if m is None or (not m.group(1) and not m.group(2)):
                    self._fail(416)
                    return
                if m.group(1):
                    start = int(m.group(1))
                    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
                else:  # suffix range: the last N bytes
                    start = max(0, size - int(m.group(2)))
                if start >= size or start >= end:
                    self._fail(416)
                    return
                status = 206
            self._record(status)
            self.send_response(status)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Last-Modified", formatdate(os.path.getmtime(path), usegmt=True))
            if ranges:
                self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.end_headers()
            if body:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    remaining = end - start
                    while remaining:
                        chunk = fh.read(min(remaining, 1 << 16))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        remaining -= len(chunk)

    return Handler


@contextlib.contextmanager
def range_http_server(
    root: str | os.PathLike[str], *, ranges: bool = True, signed_prefix: str | None = None, signature: str = "ok"
) -> Iterator[HttpServer]:
    """Serve ``root`` on 127.0.0.1 (random port) until the block ends."""
    server = HttpServer(root=os.fspath(root), url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server, ranges, signed_prefix, signature))
    httpd.daemon_threads = True
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@contextlib.contextmanager
def moto_s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (random port); ``s3://`` URLs go to it (fsspec config) while
    the block runs. Yields the endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with s3_endpoint(f"http://{host}:{port}") as endpoint:
            yield endpoint
    finally:
        server.stop()


@contextlib.contextmanager
def s3_endpoint(endpoint: str) -> Iterator[str]:
    """``s3://`` URLs go to the S3 API at ``endpoint`` (fsspec config, inherited by forked
    DataLoader workers, and moto's test credentials) while the block runs; then the previous
    config and environment come back and s3fs forgets its cached filesystems."""
    import fsspec.config

    saved = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "use_ssl": False}
    env = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        yield endpoint
    finally:
        if saved is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = saved
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _clear_s3fs_cache()


def _clear_s3fs_cache() -> None:
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


def have_curl() -> str | None:
    """Path of curl, or None."""
    return shutil.which("curl")

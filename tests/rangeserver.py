"""A real HTTP server on loopback that serves a directory with byte ranges, as object stores and most web servers
do (RFC 9110: ``Range: bytes=a-b`` -> 206 with ``Content-Range``; an ``ETag`` per file version), and counts what it
sends. Python's own ``http.server`` serves whole files only."""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class RangeHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        if os.path.isdir(path) or not os.path.isfile(path):
            return super().send_head()
        st = os.stat(path)
        size = st.st_size
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        lo, hi = (int(m.group(1)), min(int(m.group(2)) if m.group(2) else size - 1, size - 1)) if m else (0, size - 1)
        if m and lo >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return None
        f = open(path, "rb")
        f.seek(lo)
        self.send_response(206 if m else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{st.st_size:x}-{st.st_mtime_ns:x}"')
        if m:
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
        self.send_header("Content-Length", str(hi - lo + 1))
        self.end_headers()
        self.server.log.append((self.command, self.path, lo, hi - lo + 1 if self.command == "GET" else 0, bool(m)))
        self._left = hi - lo + 1
        return f

    def copyfile(self, source, outputfile):
        left = getattr(self, "_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        while left > 0:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                break
            if self.server.throttle:
                time.sleep(self.server.throttle * len(chunk) / (1 << 20))
            outputfile.write(chunk)
            left -= len(chunk)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512        # (clients read many ranges at once; the default backlog of 5 drops connections)

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):   # (a client that hung up)
            super().handle_error(request, client_address)


@contextmanager
def serving(directory: Path, throttle: float = 0.0):
    """(base URL, log of (method, path, first byte, bytes sent, ranged)) of a server of ``directory``; with
    ``throttle``, it sends each MiB that many seconds late (a store far away: slow for large reads, not for many
    small ones at once)."""
    server = Server(("127.0.0.1", 0), partial(RangeHandler, directory=str(directory)))
    server.log, server.throttle = [], throttle
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.log
    finally:
        server.shutdown()
        server.server_close()

#!/usr/bin/python3
"""A small HTTP file server for the `asgd data fetch` tests, on 127.0.0.1.

Serves the files under ROOT with byte ranges (206 Partial Content), which
Python's own http.server does not. Prints its port on stdout once it
listens; logs each request ("GET PATH RANGE") to --log. With --cut-first N,
the first response it sends carries N bytes of its body and then drops the
connection, as a network failure would. With --endless, every file it
has is answered with 200, no length, and bytes without end, as a broken or
hostile mirror might.

Usage: file_server.py ROOT [--log FILE] [--cut-first N] [--endless]
"""

import argparse
import http.server
import os
import re
import sys
import threading


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--log", default=os.devnull)
    p.add_argument("--cut-first", type=int, default=0)
    p.add_argument("--endless", action="store_true")
    a = p.parse_args()
    cuts_left = [1 if a.cut_first > 0 else 0]
    lock = threading.Lock()
    log = open(a.log, "a", buffering=1)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            rng = self.headers.get("Range", "")
            log.write(f"GET {self.path} {rng}\n")
            path = os.path.join(a.root, self.path.lstrip("/"))
            if not os.path.isfile(path):
                self.send_error(404)
                return
            if a.endless:
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                block = b"\x1f" * (1 << 16)
                try:
                    while True:
                        self.wfile.write(block)
                except OSError:  # the client hung up
                    return
            size = os.path.getsize(path)
            start = 0
            m = re.fullmatch(r"bytes=(\d+)-", rng)
            if m:
                start = int(m.group(1))
                if start >= size:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            with lock:
                cut = cuts_left[0] > 0
                cuts_left[0] = 0
            with open(path, "rb") as f:
                f.seek(start)
                left = a.cut_first if cut else size - start
                while left > 0:
                    chunk = f.read(min(left, 1 << 16))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
            if cut:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sys.stdout.write("%d\n" % server.server_address[1])  # one write, whatever the buffering
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

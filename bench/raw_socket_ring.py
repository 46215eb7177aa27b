#!/usr/bin/python3
"""How fast a two-process ring all-reduce over plain tcp sockets goes here.

  bench/raw_socket_ring.py [--sizes 1M,4M] [--iterations 25] [--port P]

An experiment for issue 28's comparison with Open MPI over tcp, not part of
asgd: two processes on 127.0.0.1 (pinned to cores 0 and 1, as `asgd bench
allreduce` pins its ranks), each with one thread that writes and reads its
one socket itself (non-blocking, full duplex), as Open MPI's tcp transport
does, with no ZeroMQ I/O thread between it and the socket. Per all-reduce
of N float32 values: each sends the other the half it does not own and adds
the half it gets into its own (numpy), then sends its summed half back and
takes the other's. No checksums, no weights, the all-gather not overlapped
with the reduce-scatter: a rough bound on what writing the sockets from
the collective's own thread would give, beside `asgd bench allreduce`'s
figures for our ring through ZeroMQ and for Open MPI. Prints the median
time of the iterations after five warm-up ones and the bus bandwidth
(2 (N - 1) / N x bytes / time, with N = 2 ranks: bytes / time).
"""

import argparse
import os
import selectors
import socket
import subprocess
import sys
import time

import numpy as np


def parse_size(text):
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def connect(rank, port):
    if rank == 0:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
        except OSError as e:
            sys.exit(f"rank 0: cannot listen at 127.0.0.1:{port}: {e}")
        listener.listen(1)
        listener.settimeout(10)
        s, _ = listener.accept()
        listener.close()
    else:
        s = socket.socket()
        deadline = time.monotonic() + 10
        while True:
            try:
                s.connect(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"rank 1: nothing listens at 127.0.0.1:{port} after 10 s")
                time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)
    return s


def exchange(s, out, into, on_piece, piece_floats):
    """Sends `out` while receiving as many bytes into `into`; calls
    on_piece(lo, hi) for each piece of `into` (in floats) once it is whole."""
    send_view, recv_view = memoryview(out).cast("B"), memoryview(into).cast("B")
    total, sent, got, pieces = len(send_view), 0, 0, 0
    piece_bytes = piece_floats * 4
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    deadline = time.monotonic() + 10
    while sent < total or got < total:
        if time.monotonic() > deadline:
            sys.exit(f"an exchange stalled: sent {sent} and got {got} of {total} bytes in 10 s")
        sel.modify(s, selectors.EVENT_READ | (selectors.EVENT_WRITE if sent < total else 0))
        for _, mask in sel.select(timeout=1):
            if mask & selectors.EVENT_WRITE and sent < total:
                try:
                    sent += s.send(send_view[sent:sent + (1 << 20)])
                except BlockingIOError:
                    pass
            if mask & selectors.EVENT_READ and got < total:
                try:
                    got += s.recv_into(recv_view[got:], total - got)
                except BlockingIOError:
                    pass
                while (pieces + 1) * piece_bytes <= got or (got == total and pieces * piece_bytes < total):
                    lo = pieces * piece_floats
                    on_piece(lo, min(lo + piece_floats, len(into)))
                    pieces += 1
    sel.close()


def rank_main(rank, sizes, iterations, port):
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    s = connect(rank, port)
    for n in sizes:
        half = n // 2
        x = np.full(n, rank + 1.0, dtype=np.float32)
        incoming = np.empty(half, dtype=np.float32)
        times = []
        for _ in range(iterations + 5):
            x[:] = rank + 1.0
            begun = time.perf_counter()
            mine, theirs = x[rank * half:(rank + 1) * half], x[(1 - rank) * half:(2 - rank) * half]

            def add(lo, hi, mine=mine):
                mine[lo:hi] += incoming[lo:hi]

            exchange(s, np.ascontiguousarray(theirs), incoming, add, 1 << 18)
            exchange(s, mine.copy(), theirs, lambda lo, hi: None, 1 << 18)
            times.append(time.perf_counter() - begun)
        if not np.all(x == 3.0):
            sys.exit(f"rank {rank}: the sums are wrong")
        times = sorted(times[5:])
        median = times[len(times) // 2]
        if rank == 0:
            print(f"{n:>10}  {median * 1e3:8.3f} ms  {n * 4 / median / 1e9:6.3f} GB/s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,4M")
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--port", type=int, default=0, help="the port rank 0 listens on (default: a free one)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [parse_size(t) for t in a.sizes.split(",")]
    if any(n < 2 or n % 2 for n in sizes) or a.iterations < 1:
        ap.error("sizes must be even and at least 2, iterations at least 1")
    if a.rank is not None:
        rank_main(a.rank, sizes, a.iterations, a.port)
        return
    if a.port == 0:  # a free port now (another process could take it before rank 0 does: then say so)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            a.port = probe.getsockname()[1]
    print("    floats    median   bus bandwidth (2 processes, plain tcp sockets)")
    args = [sys.executable, os.path.abspath(__file__), "--sizes", a.sizes, "--iterations", str(a.iterations),
            "--port", str(a.port), "--rank"]
    ranks = [subprocess.Popen(args + [str(r)]) for r in (0, 1)]
    codes = [p.wait(timeout=600) for p in ranks]
    sys.exit(max(codes))


if __name__ == "__main__":
    main()

"""A TCP proxy that answers every request ``latency`` seconds late: an object store far away.

Why: a local S3 server (moto) answers in a millisecond, so it hides exactly the cost a
reader of a real object store pays on every request — tens of milliseconds before the
first byte. The proxy sits between the client and the server and delays each piece of
the server's answer by ``latency`` from the moment it arrived, in order, like ``netem``'s
fixed delay: a response's first byte comes ``latency`` late, and the rest streams right
behind it. ``bandwidth`` (bytes/s, None: none) caps each connection's answers like one S3
connection's: a piece leaves no sooner than the previous one's bytes at that rate::

    client ──request──▶ proxy ──▶ server          (forwarded at once)
    client ◀──────────── proxy ◀── server  t      (held until t + latency)

Run it in its own process (:func:`start_proxy`: the proxy's copying never competes with
the measured reader for the GIL) or in a thread of this one (:class:`LatencyProxy`, as the
tests do). ``python -m shardwise.bench.proxy --upstream HOST:PORT --latency 0.05`` prints
``port N`` once it listens.

It counts what crosses it (:class:`Counters`): requests, connections open at once (the
most since the last reset), bytes answered and when the first request came and the last
answer byte left — what ``bench remote`` reports for every reader alike, whatever client
it uses. A proxy process answers ``stats`` and ``reset`` on its stdin (a JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, TextIO

from shardwise.concurrency import ReadAhead
from shardwise.errors import ConfigError

_READ = 1 << 18
_METHODS = (b"GET ", b"PUT ", b"HEAD ", b"POST ", b"DELETE ")


@dataclass
class Counters:
    """What crossed a proxy since the last :meth:`reset`: ``requests`` (HTTP request
    lines from clients), ``connections`` (open now), ``max_connections`` (the most open at
    once), ``bytes_out`` answered, ``first_s`` / ``last_s`` (monotonic: the first request, the
    last answer byte; 0 before any)."""

    requests: int = 0
    connections: int = 0
    max_connections: int = 0
    bytes_out: int = 0
    first_s: float = 0.0
    last_s: float = 0.0

    def reset(self) -> None:
        open_now = self.connections
        self.__init__()  # type: ignore[misc]
        self.connections = self.max_connections = open_now

    def opened(self, change: int) -> None:
        self.connections += change
        self.max_connections = max(self.max_connections, self.connections)

    def asked(self, data: bytes) -> None:
        if data.startswith(_METHODS):
            self.requests += 1
            self.first_s = self.first_s or time.monotonic()

    def answered(self, n: int) -> None:
        self.bytes_out += n
        self.last_s = time.monotonic()

    def rate(self) -> float:
        """Bytes/s answered between the first request and the last byte."""
        span = self.last_s - self.first_s
        return self.bytes_out / span if span > 0 else 0.0


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                latency: float, bandwidth: float | None = None,
                count: Callable[[bytes], None] | None = None) -> None:
    """Copy ``reader`` to ``writer``, each piece held until ``latency`` after it arrived
    (a queue, so holding one piece never delays reading the next) and, with
    ``bandwidth``, until the previous pieces have left at that many bytes/s; ``count``
    sees each piece as it leaves."""
    free_at = 0.0  # when the connection's bytes so far have left at ``bandwidth``
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        try:
            while data := await reader.read(_READ):
                queue.put_nowait((time.monotonic() + latency, data))
        except (ConnectionError, OSError):
            pass
        finally:  # the end, however it came: the sender closes its side, never hangs
            queue.put_nowait((0.0, b""))

    task = asyncio.ensure_future(receive())
    try:
        while True:
            due, data = await queue.get()
            if not data:
                break
            due = max(due, free_at)
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if bandwidth:
                free_at = max(due, time.monotonic()) + len(data) / bandwidth
            writer.write(data)
            await writer.drain()
            if count is not None:
                count(data)
    except (ConnectionError, OSError):
        pass
    finally:
        task.cancel()
        with contextlib.suppress(Exception):
            writer.close()


async def _serve_one(upstream: tuple[str, int], latency: float, bandwidth: float | None,
                     creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                     counters: Counters | None = None) -> None:
    try:
        ureader, uwriter = await asyncio.open_connection(*upstream)
    except OSError:
        cwriter.close()
        return
    c = counters or Counters()
    c.opened(1)
    try:
        await asyncio.gather(_pump(creader, uwriter, 0.0, count=c.asked),
                             _pump(ureader, cwriter, latency, bandwidth,
                                   count=lambda data: c.answered(len(data))),
                             return_exceptions=True)
    finally:  # also when cancelled at shutdown: no socket is left open
        c.opened(-1)
        for w in (uwriter, cwriter):
            w.close()
            with contextlib.suppress(Exception):
                await w.wait_closed()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(serve_one: Handler, port: int, ready: asyncio.Future[int] | None,
                 stop: asyncio.Event) -> None:
    """Serve each connection with ``serve_one`` until ``stop`` is set, then close every
    connection."""
    handlers: set[asyncio.Task[None]] = set()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await serve_one(r, w)
        except asyncio.CancelledError:
            pass  # the proxy stops (asyncio would log a cancelled connection's task)
        finally:
            handlers.discard(task)
            w.close()  # also when cancelled before serve_one had the connection

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(bound)
    else:
        print(f"port {bound}", flush=True)
    async with server:
        await stop.wait()
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await asyncio.sleep(0.05)  # the closed transports' callbacks run before the loop ends


def check_latency(latency: float) -> float:
    if not isinstance(latency, (int, float)) or not 0 <= latency < 60:
        raise ConfigError(f"the proxy's latency must be in [0, 60) seconds, got {latency!r}")
    return float(latency)


def check_bandwidth(bandwidth: float | None) -> float | None:
    if bandwidth is not None and (not isinstance(bandwidth, (int, float))
                                  or not bandwidth > 0):
        raise ConfigError(f"the proxy's bandwidth must be a positive number of bytes/s or "
                          f"None, got {bandwidth!r}")
    return None if bandwidth is None else float(bandwidth)


class LatencyProxy:
    """The proxy on a background thread of this process; ``with`` it, then connect to
    ``127.0.0.1:port``.

    >>> with LatencyProxy(("127.0.0.1", 5000), latency=0.05) as proxy:  # doctest: +SKIP
    ...     url = f"http://127.0.0.1:{proxy.port}"
    """

    def __init__(self, upstream: tuple[str, int], *, latency: float,
                 bandwidth: float | None = None) -> None:
        self.upstream, self.latency = upstream, check_latency(latency)
        self.bandwidth = check_bandwidth(bandwidth)
        self.port = 0
        self.counters = Counters()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: ReadAhead[int] | None = None
        self._bound = threading.Event()

    def __enter__(self) -> LatencyProxy:
        self._thread = ReadAhead.call(LatencyProxy._run, self,
                                      name="shardwise-latency-proxy")
        if not self._bound.wait(10):
            self._thread.get()  # raises the thread's error, if any
            raise ConfigError("the latency proxy did not start within 10 s")
        return self

    def _run(self) -> int:
        loop = asyncio.new_event_loop()
        self._loop, self._stop = loop, asyncio.Event()
        ready: asyncio.Future[int] = loop.create_future()
        task = loop.create_task(_serve(self._serve_one, 0, ready, self._stop))
        self.port = loop.run_until_complete(ready)
        self._bound.set()
        loop.run_until_complete(task)
        loop.close()
        return self.port

    async def _serve_one(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """One client connection (a subclass may answer otherwise: tests/faults.py)."""
        await _serve_one(self.upstream, self.latency, self.bandwidth, r, w, self.counters)

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.get()
            self._thread.close(None)


@dataclass(frozen=True)
class ProxyProcess:
    """A proxy running in a process of its own (:func:`proxy_process`): its ``port``, and
    its :class:`Counters` read or reset over its stdin."""

    port: int
    proc: subprocess.Popen[str]

    def _ask(self, what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def counters(self) -> Counters:
        return Counters(**self._ask("stats"))

    def reset(self) -> None:
        self._ask("reset")


@contextlib.contextmanager
def proxy_process(upstream: tuple[str, int], *, latency: float,
                  bandwidth: float | None = None) -> Iterator[ProxyProcess]:
    """The proxy in a process of its own; stops it on exit."""
    check_latency(latency)
    cap = [] if check_bandwidth(bandwidth) is None else ["--bandwidth", str(bandwidth)]
    proc = subprocess.Popen([sys.executable, "-m", "shardwise.bench.proxy", "--upstream",
                             f"{upstream[0]}:{upstream[1]}", "--latency", str(latency),
                             *cap], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("port "):
            raise ConfigError(f"the latency proxy did not start (exit {proc.poll()})")
        yield ProxyProcess(int(line.split()[1]), proc)
    finally:
        proc.terminate()
        proc.wait(10)
        for f in (proc.stdout, proc.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


@contextlib.contextmanager
def start_proxy(upstream: tuple[str, int], *, latency: float,
                bandwidth: float | None = None) -> Iterator[int]:
    """The proxy in a process of its own; yields its port, stops it on exit."""
    with proxy_process(upstream, latency=latency, bandwidth=bandwidth) as p:
        yield p.port


def _answer(counters: Counters, commands: TextIO) -> None:
    """A proxy process's control: ``stats`` (its counters as a JSON line) or ``reset``."""
    for line in commands:
        if line.strip() == "reset":
            counters.reset()
        print(json.dumps(asdict(counters)), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardwise.bench.proxy",
                                description="a TCP proxy that delays every answer")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT")
    p.add_argument("--latency", type=float, required=True, metavar="SECONDS")
    p.add_argument("--bandwidth", type=float, default=None, metavar="BYTES_PER_S",
                   help="cap each connection's answers (default: no cap)")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    latency, bandwidth = check_latency(args.latency), check_bandwidth(args.bandwidth)
    counters = Counters()
    control = ReadAhead.call(lambda _: _answer(counters, sys.stdin), None,
                             name="shardwise-proxy-control")  # ends with its stdin
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(partial(_serve_one, (host, int(port)), latency, bandwidth,
                                   counters=counters), args.port, None, asyncio.Event()))
    control.close(1.0)  # a parent that keeps its end open is not waited for
    return 0


if __name__ == "__main__":
    sys.exit(main())

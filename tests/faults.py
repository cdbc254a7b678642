"""The proxy of :mod:`shardwise.bench.proxy`, reading HTTP, with the faults of a real object
store injected on request: the tests' store that misbehaves (test infrastructure: it lives
here, not in the package).

Each client connection gets its own upstream connection; the proxy reads the client's
requests one by one (a request line, headers, a body by ``Content-Length`` or chunked),
and the rules set with :meth:`FaultProxy.inject` decide, per request, whether a fault
hits it. The faults (``MODES``):

=========  ================================================================================
stall      the request is read and never answered; the connection stays open (until the
           proxy stops): a store that stops answering
slowdown   ``503 SlowDown`` (S3's throttling answer) instead of forwarding; the connection
           then closes
reset      the response head and half its body, then a TCP reset (RST)
short      the response head (its ``Content-Length`` unchanged) and half its body, then a
           clean close: a short body
flip       the whole response, one bit of the body's middle byte flipped: wrong bytes
hold       the request is kept from the server until a later request matches ``until`` (or
           ``HOLD_SECONDS`` pass), then forwarded as any other: what a client does while
           one of its requests is under way (``hits["released"]``: holds ended by
           ``until``, not by the time)
=========  ================================================================================

The body faults (reset, short, flip) hit only responses with a body (``200``/``206`` with
a ``Content-Length`` above 0); others pass unchanged and do not count as hit. Rules change
at run time from any thread; ``hits`` counts what was applied, per mode (a test asserts its
faults happened)::

    with FaultProxy(("127.0.0.1", 8333)) as proxy:
        proxy.inject(Fault("slowdown", rate=0.08), Fault("reset", match=r"^GET .*\\.bin"))
        ...  # read through http://127.0.0.1:{proxy.port}
        assert proxy.hits["slowdown"] > 0
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

from shardwise.bench.proxy import LatencyProxy
from shardwise.errors import ConfigError

MODES = ("stall", "slowdown", "reset", "short", "flip", "hold")
HOLD_SECONDS = 20.0
_BODY_MODES = ("reset", "short", "flip")
_PIECE = 1 << 18
_SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message>"
             b"<RequestId>shardwise-fault-proxy</RequestId></Error>")


@dataclass(frozen=True)
class Fault:
    """Hit requests matching ``match`` (a regex searched in ``"METHOD /bucket/key?query"``)
    with ``mode``, each with chance ``rate``; at most ``times`` requests chosen (None: no
    limit; a body fault chooses a request whose answer has no body in vain). ``until``: a
    held request's release (a regex, as ``match``)."""

    mode: str
    match: str = ""
    rate: float = 1.0
    times: int | None = None
    until: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"fault mode must be one of {MODES}, got {self.mode!r}")
        if not 0 <= self.rate <= 1:
            raise ConfigError(f"a fault's rate must be in [0, 1], got {self.rate!r}")
        re.compile(self.match)
        re.compile(self.until)


@dataclass
class _Request:
    method: str
    fault: Fault | None


class FaultProxy(LatencyProxy):
    """The proxy on a background thread, injecting :class:`Fault` s; ``with`` it, then
    connect to ``127.0.0.1:port``. ``seed`` makes the rate draws repeatable."""

    def __init__(self, upstream: tuple[str, int], *, seed: int = 0) -> None:
        super().__init__(upstream, latency=0.0)
        self._rules: list[list] = []  # [Fault, chosen]
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.first_hit: dict[str, float] = {}  # mode -> time.monotonic() it first applied
        self.requests = 0  # every request read from a client
        self.seen: list[tuple[str, str]] = []  # each as (method, path)
        self._held: list[tuple[str, asyncio.Event]] = []  # (until, set when it comes)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inject(self, *faults: Fault) -> None:
        """Replace the rules (checked in order: the first whose draw hits applies)."""
        with self._lock:
            self._rules = [[f, 0] for f in faults]  # each with the requests it chose
            self.hits.clear()
            self.first_hit.clear()

    def clear(self) -> None:
        """No more faults (connections already stalled stay stalled)."""
        self.inject()

    def _decide(self, method: str, target: str) -> Fault | None:
        with self._lock:
            self.requests += 1
            self.seen.append((method, target.split("?")[0]))
            line = f"{method} {target}"
            for until, come in self._held:  # on the proxy's loop, as the holds' waits
                if re.search(until, line):
                    come.set()
            for rule in self._rules:
                f = rule[0]
                if (f.times is None or rule[1] < f.times) and re.search(f.match, line) \
                        and self._rng.random() < f.rate:
                    rule[1] += 1
                    return f
        return None

    def _hit(self, fault: Fault) -> None:
        with self._lock:
            self.hits[fault.mode] += 1
            self.first_hit.setdefault(fault.mode, time.monotonic())

    async def _hold(self, fault: Fault) -> None:
        """Until a request matching ``fault.until`` comes, or ``HOLD_SECONDS``."""
        come = asyncio.Event()
        with self._lock:
            self._held.append((fault.until, come))
        self._hit(fault)
        try:
            await asyncio.wait_for(come.wait(), HOLD_SECONDS)
            with self._lock:
                self.hits["released"] += 1
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                self._held.remove((fault.until, come))

    async def _serve_one(self, creader: asyncio.StreamReader,
                         cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.close()
            return
        pending: asyncio.Queue[_Request | None] = asyncio.Queue()
        reading = asyncio.ensure_future(self._requests(creader, uwriter, pending))
        try:
            await self._responses(ureader, cwriter, pending)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:  # also when cancelled at shutdown: no socket is left open
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading
            for w in (uwriter, cwriter):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    async def _requests(self, creader: asyncio.StreamReader, uwriter: asyncio.StreamWriter,
                        pending: asyncio.Queue[_Request | None]) -> None:
        """Read the client's requests; forward those no fault keeps from the server."""
        try:
            while head := await _read_head(creader):
                method, target = head.split(b" ", 2)[:2]
                fault = self._decide(method.decode(), target.decode("latin-1"))
                if fault is not None and fault.mode in ("stall", "slowdown"):
                    pending.put_nowait(_Request(method.decode(), fault))
                    return  # the connection ends with this request's answer (or never)
                if fault is not None and fault.mode == "hold":
                    await self._hold(fault)
                uwriter.write(head)  # answered before its body if it asks 100-continue:
                pending.put_nowait(_Request(method.decode(), fault))  # so queued first
                await _copy_body(creader, uwriter, _headers(head))
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        pending.put_nowait(None)

    async def _responses(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                         pending: asyncio.Queue[_Request | None]) -> None:
        """Answer each request in order: the server's response, or the fault's."""
        while (req := await pending.get()) is not None:
            fault = req.fault
            if fault is not None and fault.mode == "stall":
                self._hit(fault)
                await asyncio.Event().wait()  # for ever: until the proxy stops
            if fault is not None and fault.mode == "slowdown":
                self._hit(fault)
                cwriter.write(_slowdown_response())
                await cwriter.drain()
                return
            head = await _read_head(ureader)
            while head.startswith(b"HTTP/1.1 1"):  # 100 Continue: forward, then the answer
                cwriter.write(head)
                head = await _read_head(ureader)
            if not await self._answer(req, head, ureader, cwriter):
                return

    async def _answer(self, req: _Request, head: bytes, ureader: asyncio.StreamReader,
                      cwriter: asyncio.StreamWriter) -> bool:
        """Forward one response, with a body fault if one applies; False: the connection
        is over."""
        headers, status = _headers(head), int(head.split(b" ", 2)[1])
        length = int(headers.get("content-length", -1))
        if req.method == "HEAD" or status in (204, 304):
            length = 0
        fault = req.fault
        if fault is not None and fault.mode in _BODY_MODES and status in (200, 206) \
                and length > 0:
            self._hit(fault)
            return await _faulty_body(fault.mode, head, length, ureader, cwriter)
        cwriter.write(head)
        if length >= 0:
            await _copy_exact(ureader, cwriter, length)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            await _copy_chunked(ureader, cwriter)
        else:  # the body runs to the end of the connection
            while data := await ureader.read(_PIECE):
                cwriter.write(data)
                await cwriter.drain()
            return False
        await cwriter.drain()
        return True


async def _faulty_body(mode: str, head: bytes, length: int, ureader: asyncio.StreamReader,
                       cwriter: asyncio.StreamWriter) -> bool:
    cwriter.write(head)
    if mode == "flip":
        await _copy_exact(ureader, cwriter, length, flip_at=length // 2)
        await cwriter.drain()
        return True
    await _copy_exact(ureader, cwriter, length // 2)
    await cwriter.drain()
    await asyncio.sleep(0.05)  # let the half arrive before the end
    if mode == "reset":
        sock = cwriter.get_extra_info("socket")
        if sock is not None:  # close with SO_LINGER 0: the peer gets a RST, not a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        cwriter.transport.abort()
    return False


def _slowdown_response() -> bytes:
    return (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_SLOWDOWN)) + _SLOWDOWN


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """A request's or response's head (through its blank line); b"" at a clean end."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise
        return b""


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}


async def _copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     headers: dict[str, str]) -> None:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        await _copy_chunked(reader, writer)
    else:
        await _copy_exact(reader, writer, int(headers.get("content-length", 0)))


async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int,
                      flip_at: int = -1) -> None:
    """Copy ``n`` bytes; the bit 0 of byte ``flip_at`` (if in range) flipped."""
    done = 0
    while done < n:
        data = await reader.read(min(_PIECE, n - done))
        if not data:
            raise asyncio.IncompleteReadError(b"", n - done)
        if done <= flip_at < done + len(data):
            k = flip_at - done
            data = data[:k] + bytes([data[k] ^ 1]) + data[k + 1:]
        writer.write(data)
        done += len(data)
        await writer.drain()


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line = await reader.readuntil(b"\r\n")
        writer.write(line)
        size = int(line.split(b";")[0], 16)
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(b"\r\n")
            return
        await _copy_exact(reader, writer, size + 2)

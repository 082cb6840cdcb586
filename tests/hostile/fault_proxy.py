"""A userspace TCP proxy on a collector host's path to the head that adds faults on command.

`FaultProxy(router_ns)` runs an asyncio loop in a thread of its own that first enters the router namespace of one
collector host (tests/hostile/netns.py), so every socket it opens lives there. For each port it is told about
(`listen`) it listens on 0.0.0.0 with IP_TRANSPARENT; the router delivers every connection its host opens to
itself, so the proxy accepts connections to any address on those ports and forwards each one to the address and
port the host dialed (the head's), byte for byte. From the test's thread, at any time:

- `set_latency(ms, jitter_ms)`: every read is delivered ms +- jitter_ms later (uniform), never out of order
  (a TCP stream cannot reorder: a byte never overtakes the one before it);
- `set_bandwidth(bytes_per_s)`: each direction of the proxy is a link of that rate, shared by its
  connections (None: unlimited);
- `stall()` / `resume()`: forward nothing, read nothing, keep every connection open; then go on;
- `reset_all()`: close every connection with a TCP RST to both ends (what was read and not delivered is lost).

`PortFollower(pid, host, proxies)` watches which TCP ports process `pid` (and its children) listens on at `host`
(from /proc) and has every proxy listen on each new one: the head's control and weights ports, and the data port
it binds for each registration, which the collector learns from the WELCOME. A connection that arrives before the
proxy listens on its port is not answered (no RST), and the collector's TCP sends its SYN again a second later.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
import threading
from collections import defaultdict

from tests.hostile.netns import inside

IP_TRANSPARENT = 19  # <linux/in.h>
READ_BYTES = 65536
SLICE_BYTES = 4096  # with a bandwidth cap, writes go in slices this big, so connections share the link fairly


class _Link:
    """One direction of the proxy: a serial link of `rate` bytes/s shared by all its connections (None: no cap)."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self._free_at = 0.0

    async def send(self, loop: asyncio.AbstractEventLoop, nbytes: int) -> None:
        if not self.rate:
            return
        start = max(loop.time(), self._free_at)
        self._free_at = start + nbytes / self.rate
        await asyncio.sleep(self._free_at - loop.time())


class FaultProxy:
    """Transparent TCP proxy with latency, jitter, bandwidth cap, stall and reset (see the module docstring)."""

    def __init__(self, router_ns: str, seed: int = 0) -> None:
        self.router_ns = router_ns
        self._rng = random.Random(seed)
        self._latency_s = 0.0
        self._jitter_s = 0.0
        self._links = {"up": _Link(), "down": _Link()}  # up: host -> head
        self._flowing: asyncio.Event | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._servers: dict[int, asyncio.AbstractServer] = {}
        self.bytes: dict[int, dict[str, int]] = defaultdict(lambda: {"up": 0, "down": 0})  # port -> direction -> n
        self.accepted = 0
        self.resets = 0
        self.errors: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{router_ns}", daemon=True)

    # ------------------------------------------------------------------ lifetime (test thread)
    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"fault proxy in {self.router_ns} did not start: {self.errors}")
        return self

    def _run(self) -> None:
        try:
            with inside(self.router_ns):  # this thread stays there: every socket of the loop is the router's
                asyncio.set_event_loop(self._loop)
                self._flowing = asyncio.Event()
                self._flowing.set()
                self._ready.set()
                self._loop.run_forever()
                self._loop.run_until_complete(self._shutdown())
        except Exception as exc:  # noqa: BLE001 - reported by start() or the test
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self._loop.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro_or_fn, *args):
        """Run a coroutine function (or a plain function) on the proxy's loop and return its result."""
        async def run():
            result = coro_or_fn(*args)
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # ------------------------------------------------------------------ faults (test thread)
    def set_latency(self, ms: float, jitter_ms: float = 0.0) -> None:
        if ms < 0 or not 0 <= jitter_ms <= ms:
            raise ValueError(f"latency {ms} ms, jitter {jitter_ms} ms: need 0 <= jitter <= latency")
        self._latency_s, self._jitter_s = ms / 1000, jitter_ms / 1000

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        for link in self._links.values():
            link.rate = float(bytes_per_s) if bytes_per_s else None

    def stall(self) -> None:
        self._call(self._flowing.clear)

    def resume(self) -> None:
        self._call(self._flowing.set)

    def reset_all(self) -> int:
        """RST every open connection at both ends; how many were open."""
        return self._call(self._reset_all)

    def listen(self, port: int) -> None:
        """Accept connections to `port` (any address) and forward them; a no-op for a port already served."""
        self._call(self._listen, port)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def ports(self) -> list[int]:
        return sorted(self._servers)

    # ------------------------------------------------------------------ the loop
    async def _listen(self, port: int) -> None:
        if port in self._servers:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(256)
        sock.setblocking(False)
        self._servers[port] = await asyncio.start_server(self._accept, sock=sock)

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        host, port = down_w.get_extra_info("sockname")[:2]  # where the collector host meant to go
        self.accepted += 1
        try:
            up_r, up_w = await asyncio.open_connection(host, port)
        except OSError:
            _abort(down_w)
            return
        pair = (down_w, up_w)
        self._conns.add(pair)
        pumps = [self._spawn(self._pump(down_r, up_w, "up", port)), self._spawn(self._pump(up_r, down_w, "down", port))]
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() for t in done if not t.cancelled()):  # one end failed: the other is reset
                for t in pumps:
                    t.cancel()
                _abort(down_w)
                _abort(up_w)
            else:
                await asyncio.gather(*pumps, return_exceptions=True)
                down_w.close()
                up_w.close()
        finally:
            self._conns.discard(pair)

    def _delay(self) -> float:
        return max(0.0, self._latency_s + self._rng.uniform(-self._jitter_s, self._jitter_s))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    port: int) -> None:
        """Copy one direction: a reader that stamps each read with its delivery time, a writer that keeps it."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=64)  # bounded: a slow link pushes back on the sender
        link = self._links[direction]

        async def read() -> None:
            due = 0.0
            while True:
                await self._flowing.wait()
                try:
                    data = await reader.read(READ_BYTES)
                except OSError as exc:  # the sending end was reset: the writer resets the other end
                    await queue.put(exc)
                    return
                if not data:
                    await queue.put(None)
                    return
                due = max(due, self._loop.time() + self._delay())  # jitter never reorders the stream
                await queue.put((due, data))

        async def write() -> None:
            while (item := await queue.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                due, data = item
                await asyncio.sleep(max(0.0, due - self._loop.time()))
                step = SLICE_BYTES if link.rate else len(data)
                for i in range(0, len(data), step):
                    piece = data[i:i + step]
                    await link.send(self._loop, len(piece))
                    await self._flowing.wait()
                    writer.write(piece)
                    await writer.drain()
                    self.bytes[port][direction] += len(piece)
            if writer.can_write_eof():
                writer.write_eof()

        reading = self._spawn(read())
        try:
            await write()
            await reading
        finally:
            reading.cancel()

    async def _reset_all(self) -> int:
        pairs = list(self._conns)
        for down_w, up_w in pairs:
            _abort(down_w)
            _abort(up_w)
        self.resets += len(pairs)
        return len(pairs)

    async def _shutdown(self) -> None:
        await self._reset_all()
        for server in self._servers.values():
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# ---------------------------------------------------------------------------- the head's ports
def _process_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat") as f:
                children[int(f.read().rsplit(")", 1)[1].split()[1])].append(int(entry))
    tree, todo = [pid], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        tree += kids
        todo += kids
    return tree


def listening_ports(pid: int, host: str) -> set[int]:
    """TCP ports on which process `pid` or one of its descendants listens at `host` (or on 0.0.0.0)."""
    inodes: set[str] = set()
    for p in _process_tree(pid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{p}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    wanted = {socket.inet_aton(host), socket.inet_aton("0.0.0.0")}
    ports = set()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            addr, port = fields[1].split(":")
            if fields[3] == "0A" and fields[9] in inodes and struct.pack("<I", int(addr, 16)) in wanted:
                ports.add(int(port, 16))
    return ports


class PortFollower:
    """A thread that has every proxy listen on each TCP port process `pid` listens on at `host`, as it appears."""

    def __init__(self, pid: int, host: str, proxies: list[FaultProxy], interval_s: float = 0.1) -> None:
        self.pid, self.host, self.proxies, self.interval_s = pid, host, proxies, interval_s
        self.seen: set[int] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="port-follower", daemon=True)

    def start(self) -> PortFollower:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for port in sorted(listening_ports(self.pid, self.host) - self.seen):
                    for proxy in self.proxies:
                        proxy.listen(port)
                    self.seen.add(port)
            except Exception as exc:  # noqa: BLE001 - the test reports it
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

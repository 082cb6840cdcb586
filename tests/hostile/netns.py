"""Other "machines" on one Linux host: network namespaces joined by veth links, for tests that need a network.

`HostNet(n)` builds n collector hosts. Host i is a namespace whose only link leads to a router namespace of its
own, and the router's uplink leads to the root namespace, where the head runs and binds `head_ip`:

    root (head on head_ip) ==uplink i== router i ==lan i== host i (collectors)

The router delivers every TCP connection that arrives from its host to itself (policy routing: `iif lan i
lookup 100`, table 100 `local default`), so a transparent proxy listening there (IP_TRANSPARENT) is on the path
of every connection the host opens to the head, whatever the port (tests/hostile/fault_proxy.py); nothing else
is forwarded. `partition(i)` sets lan i down at the router (the host sees its carrier go) and `heal(i)` sets it
up again: established connections survive a short partition, as on a real network. `lose_host(i)` is a
machine lost without a goodbye (its link deleted, its processes killed, its namespace deleted) and
`restore_host(i)` a fresh, empty one in its place, behind the same router.

`HostNet(n, forward=True)` builds the same network with plain routers instead: each forwards its host's packets to
the head and back (the root namespace routes host i's lan through uplink i), no proxy is needed on the path and
the head sees the host's own address; for measuring what the network costs rather than injecting faults into it.

Names start with `hx<pid>` and addresses come from a 10.x.y.0/24 chosen from the pid, so parallel runs do not
clash. Everything made is removed on exit (`close`): processes started in the namespaces (`popen`) and adopted
ones (`adopt`), the namespaces, the links. A guardian process does the same when the harness process dies
without closing (SIGKILL included): it holds the read end of a pipe only the harness writes to and cleans up
when that pipe closes. Children started by `popen` also get PR_SET_PDEATHSIG = SIGKILL. At start, leftovers of
harness processes that are gone (names `hx<pid>...` of a dead pid) are removed.

Needs root and iproute2 (`ip netns`); `unavailable()` says why not where they are missing. Linux only.
This file only imports the standard library: it also runs as the guardian (`python netns.py --guard ...`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "hx"
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
_OWNER = re.compile(rf"^{PREFIX}(\d+)[a-z]")
_libc = ctypes.CDLL(None, use_errno=True)

# Run in the child between fork and the command: die with the parent (SIGKILL), enter the namespace, exec.
# A separate interpreter rather than preexec_fn, which is unsafe in a process with threads (the proxies').
_EXEC_IN = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
fd = os.open(sys.argv[2], os.O_RDONLY)
if libc.setns(fd, 0x40000000) != 0:
    sys.exit("setns failed: errno %d" % ctypes.get_errno())
os.close(fd)
os.execvp(sys.argv[3], sys.argv[3:])
"""


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can, as far as can be told without trying)."""
    if not sys.platform.startswith("linux"):
        return "not Linux: no network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "not root: cannot create network namespaces"
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(("-n", ns) if ns else ()), *args]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def namespaces() -> list[str]:
    """Every namespace of this harness's prefix, of any owner."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def root_links() -> list[str]:
    """Every link of this harness's prefix in the root namespace, of any owner."""
    out = _ip("-o", "link", "show", check=False).stdout
    names = (line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2)
    return [n for n in names if n.startswith(PREFIX)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): a pid and this name one process, never a reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove(tag: str, adopted: dict[int, str] | None = None) -> None:
    """Remove everything named `tag` (`hx<pid>`): adopted processes (pid -> start time) and their descendants,
    every process inside its namespaces, the namespaces (and the veth ends in them), its root links."""
    me = {os.getpid()}
    for pid, started in (adopted or {}).items():
        if _start_time(pid) == started:
            _kill([pid, *_descendants(pid)])
    owner = tag[len(PREFIX):]
    for ns in namespaces():
        if (match := _OWNER.match(ns)) and match.group(1) == owner:
            pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
            _kill([p for p in pids if p not in me])
            _ip("netns", "del", ns, check=False)
    for link in root_links():
        if (match := _OWNER.match(link)) and match.group(1) == owner:
            _ip("link", "del", link, check=False)


def remove_leftovers() -> list[str]:
    """Remove what harness processes that are gone left behind; the tags removed."""
    owners = {int(m.group(1)) for name in namespaces() + root_links() if (m := _OWNER.match(name))}
    dead = [f"{PREFIX}{pid}" for pid in sorted(owners) if not _alive(pid)]
    for tag in dead:
        remove(tag)
    return dead


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path})")
    finally:
        os.close(fd)


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """Run the block with the calling *thread* in namespace `ns`: the sockets it opens (and the threads it
    starts, such as a ZeroMQ context's I/O threads) stay there after it leaves. Other threads are not moved."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(f"/run/netns/{ns}")
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(home)


@dataclass(frozen=True)
class Host:
    """Collector host i: its namespace, its router's, the lan link between them (named at the router)."""
    index: int
    ns: str
    router: str
    lan: str
    address: str  # the host's address as the head sees it through the router's proxy: the router's uplink address
    uplink: str  # the root end of the router's uplink


class HostNet:
    """n collector hosts behind a router each, reaching the head at `head_ip` in the root namespace."""

    def __init__(self, hosts: int, forward: bool = False) -> None:
        if not 1 <= hosts <= 31:
            raise ValueError(f"hosts={hosts}: allowed 1..31 (one /24, a /29 each)")
        self.count = hosts
        self.forward = forward  # plain routers (see the module docstring); False: every connection ends at the router
        self.tag = f"{PREFIX}{os.getpid()}"
        self.hosts: list[Host] = []
        self.head_ip = ""
        self._net = ""  # the 10.x.y of the hosts' addresses
        self._procs: list[subprocess.Popen] = []
        self._guardian: subprocess.Popen | None = None

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> HostNet:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Remove dead harnesses' leftovers, start the guardian, then build the network (OSError if `ip` fails)."""
        reason = unavailable()
        if reason:
            raise OSError(reason)
        remove_leftovers()
        remove(self.tag)  # a pid of ours that an earlier, dead process had
        self._guardian = subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), "--guard", self.tag],
                                          stdin=subprocess.PIPE, start_new_session=True)
        self._net = self._subnet()
        for i in range(self.count):
            self._add_router(i)
            self._add_host(i)
        self.head_ip = f"{self._net}.1"  # uplink 0's root end: the routers of the other hosts route to it as well

    def _addresses(self, i: int) -> tuple[str, str, str, str]:
        """Host i's /29: (uplink root end, uplink router end, lan router end, lan host end)."""
        base = 8 * i
        return tuple(f"{self._net}.{base + k}" for k in (1, 2, 5, 6))  # type: ignore[return-value]

    def _add_router(self, i: int) -> None:
        """Router i and its uplink to the root namespace; everything arriving on lan i is delivered to itself."""
        router, up = f"{self.tag}r{i}", f"{self.tag}u{i}"
        up_root, up_router, _, _ = self._addresses(i)
        _ip("netns", "add", router)
        self.hosts.append(Host(i, f"{self.tag}h{i}", router, f"{self.tag}l{i}", up_router, up))
        _ip("link", "add", up, "type", "veth", "peer", "name", f"{up}r", "netns", router)
        _ip("addr", "add", f"{up_root}/30", "dev", up)
        _ip("link", "set", up, "up")
        _ip("addr", "add", f"{up_router}/30", "dev", f"{up}r", ns=router)
        _ip("link", "set", f"{up}r", "up", ns=router)
        _ip("link", "set", "lo", "up", ns=router)
        _ip("route", "add", "default", "via", up_root, ns=router)
        _ip("route", "add", "local", "default", "dev", "lo", "table", "100", ns=router)
        if self.forward:  # net.ipv4.ip_forward is per namespace, and 0 in a new one
            _ip("netns", "exec", router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
            # the way back to host i's lan (its /30 starts 4 above the uplink's); removed with the link
            _ip("route", "add", f"{self._net}.{8 * i + 4}/30", "via", up_router, "dev", up)

    def _add_host(self, i: int) -> None:
        """Host i's namespace and its lan link to router i."""
        h = self.hosts[i]
        _, _, lan_router, lan_host = self._addresses(i)
        _ip("netns", "add", h.ns)
        _ip("link", "add", h.lan, "type", "veth", "peer", "name", f"{h.lan}h", "netns", h.ns, ns=h.router)
        _ip("addr", "add", f"{lan_router}/30", "dev", h.lan, ns=h.router)
        _ip("link", "set", h.lan, "up", ns=h.router)
        _ip("addr", "add", f"{lan_host}/30", "dev", f"{h.lan}h", ns=h.ns)
        _ip("link", "set", f"{h.lan}h", "up", ns=h.ns)
        _ip("link", "set", "lo", "up", ns=h.ns)
        _ip("route", "add", "default", "via", lan_router, ns=h.ns)
        if not self.forward:  # everything the host sends is delivered to the router itself: to the proxy listening there
            _ip("rule", "add", "iif", h.lan, "lookup", "100", "pref", "100", ns=h.router)

    def _subnet(self) -> str:
        """10.<160..223>.<0..255> from the pid, skipping any /24 the root namespace already has addresses in."""
        taken = _ip("-4", "-o", "addr", check=False).stdout + _ip("-4", "route", check=False).stdout
        n = os.getpid() % (64 * 256)
        for step in range(64 * 256):
            k = (n + step) % (64 * 256)
            net = f"10.{160 + k // 256}.{k % 256}"
            if f"{net}." not in taken:
                return net
        raise OSError("no free 10.x.y.0/24 for the harness")

    def close(self) -> None:
        """Kill what runs in the namespaces and what was adopted, delete namespaces and links, stop the guardian."""
        for proc in self._procs:
            if proc.poll() is None:
                _kill([proc.pid, *_descendants(proc.pid)])
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self._guardian is not None:
            self._guardian.stdin.close()  # the guardian removes the rest (adopted processes included) and exits
            try:
                self._guardian.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._guardian.kill()
                self._guardian.wait()
            self._guardian = None
        remove(self.tag)

    # ------------------------------------------------------------------ use
    def host(self, i: int) -> Host:
        return self.hosts[i]

    def partition(self, i: int) -> None:
        """Host i loses its link: nothing passes either way until `heal(i)`; connections are kept."""
        _ip("link", "set", self.hosts[i].lan, "down", ns=self.hosts[i].router)

    def heal(self, i: int) -> None:
        _ip("link", "set", self.hosts[i].lan, "up", ns=self.hosts[i].router)

    def lose_host(self, i: int) -> None:
        """Host i is gone without a goodbye, as a machine that loses power: its lan link is deleted (no FIN, no
        RST reaches anyone), every process in its namespace is killed (SIGKILL), the namespace is deleted.
        Router i stays; `restore_host(i)` brings a fresh host i back at the same address."""
        h = self.hosts[i]
        _ip("link", "del", h.lan, ns=h.router, check=False)  # the veth pair goes with its router end
        _ip("rule", "del", "iif", h.lan, "lookup", "100", "pref", "100", ns=h.router, check=False)
        _kill([p for p in self.ns_pids(h.ns) if p != os.getpid()])
        _ip("netns", "del", h.ns, check=False)

    def restore_host(self, i: int) -> None:
        """A new, empty host i (after `lose_host(i)`): same names and addresses, nothing running."""
        self._add_host(i)

    def popen(self, ns: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside namespace `ns` as a child that dies with the calling thread (PR_SET_PDEATHSIG)
        and is killed on `close`. kwargs go to Popen (stdout, env, cwd, ...)."""
        wrapper = [sys.executable, "-S", "-c", _EXEC_IN, str(os.getpid()), f"/run/netns/{ns}", *argv]
        proc = subprocess.Popen(wrapper, start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def adopt(self, proc: subprocess.Popen) -> None:
        """Have the guardian kill `proc` and its descendants should this process die before it does."""
        started = _start_time(proc.pid)
        if started and self._guardian is not None:
            self._guardian.stdin.write(f"adopt {proc.pid} {started}\n".encode())
            self._guardian.stdin.flush()

    def ns_pids(self, ns: str) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]

    def leftovers(self) -> list[str]:
        """Whatever of this harness still exists (names of namespaces and root links): [] after `close`."""
        return [n for n in namespaces() + root_links() if (m := _OWNER.match(n)) and m.group(1) == self.tag[2:]]


def _guard(tag: str) -> None:
    """The guardian: wait for the harness to close its pipe (or die), then remove everything of `tag`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the harness, not this cleanup
    adopted: dict[int, str] = {}
    for line in sys.stdin.buffer:
        parts = line.split()
        if len(parts) == 3 and parts[0] == b"adopt":
            adopted[int(parts[1])] = parts[2].decode()
    remove(tag, adopted)
    time.sleep(0.2)
    remove(tag)  # a process that a namespace's pid list missed while it was being created


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--guard":
    _guard(sys.argv[2])

"""Remote collectors against a real head across the multi-host harness, for the fault tests and the soak.

`Cluster`: a CartPole head in the root namespace (CURVE keys, bound to the harness's head address, no local
collectors), a transparent fault proxy in each host's router (tests/hostile/fault_proxy.py), and per host a real
collector (`python -m actors --connect ... --curve-keys ...`) and the soak's tagged collector (`RemoteTagged`,
tests/hostile/soak.py: chunks that name themselves, acknowledged by CREDIT), with what the tests read of them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.hostile import attack as A
from tests.hostile.fault_proxy import FaultProxy, PortFollower
from tests.hostile.netns import HostNet, inside
from tests.hostile.soak import TaggedCollector
from tests.support.cluster import ROOT, children_of, head_env, kill_tree, read_metrics, start_head
from tests.support.waits import wait_until

HEAD_TIMEOUT_S = 8.0  # transport.head_timeout_s: both sides take this much silence for the other's death
CHUNK_BYTES = 8192  # more than a real collector's heartbeats send in a minute: proof that chunks got through
REGISTERED = re.compile(r"collector (\d+) registered \(host=.*? pid=(\d+) slot=-?\d+ eps=\S+\) -> tcp://[\d.]+:(\d+)")
RECLAIMED = re.compile(r"collector (\d+) \(slot -?\d+, pid (\d+)\) left: registration reclaimed")


# ---------------------------------------------------------------------------- the tagged collector, remote
class RemoteTagged(TaggedCollector):
    """The soak's tagged collector with CURVE keys, sending a HEARTBEAT every second, as a collector must, so a
    message lost on a reset connection becomes a counted gap (and the sequence goes on) instead of a wait."""

    def __init__(self, ctx, connect: str, segment: int, curve) -> None:
        super().__init__(ctx, connect, segment)
        self.curve = curve
        self._beat_at = 0.0

    def _register(self) -> None:  # TaggedCollector._register, with the keys
        self._fake = A.FakeCollector(self.ctx, self.connect, curve=self.curve, host="tagged", timeout_s=60)
        self._by_seq = {}
        self.registrations += 1
        cfg = self._fake.welcome.get("config", {})
        self._credit = max(1, int(cfg.get("transport", {}).get("max_chunks_in_flight", 2) or 2))
        self._streams = max(1, len(self._fake.welcome.get("epsilons") or [0]))
        self._reward = float(cfg.get("env", {}).get("reward_scale", 1.0))

    def _collect_credits(self, timeout_ms: int) -> None:
        super()._collect_credits(timeout_ms)
        if time.monotonic() >= self._beat_at:
            self._fake.heartbeat()
            self._beat_at = time.monotonic() + 1.0

    def note_in_flight(self) -> None:
        """Call with `lock` held: what is sent and not acknowledged now may be lost by what comes next."""
        self._collect_credits(0)
        self.in_flight |= {n for s, n in self._by_seq.items() if s > self._fake.credited}

    @property
    def collector_id(self) -> int:
        return self._fake.collector_id if self._fake is not None else -1


def zmq_context_in(ns: str):
    """A ZeroMQ context whose I/O threads (which open its TCP connections) live in namespace `ns`."""
    import zmq

    made = {}

    def make() -> None:
        with inside(ns):
            made["ctx"] = zmq.Context()
            made["ctx"].socket(zmq.DEALER).close()  # the first socket starts the I/O threads, here

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    return made["ctx"]


# ---------------------------------------------------------------------------- the cluster
class Cluster:
    """The head, a proxy per host, a real and a tagged collector per host; what the test reads of them."""

    def __init__(self, net: HostNet, tmp_path: Path) -> None:
        self.net, self.tmp = net, tmp_path
        self.run_dir = tmp_path / "run"
        self.head: subprocess.Popen | None = None
        self.proxies: list[FaultProxy] = []
        self.follower: PortFollower | None = None
        self.collectors: list[subprocess.Popen] = []
        self.tagged: list[RemoteTagged] = []
        self.contexts = []

    def start(self) -> None:
        from shared.keys import generate, load_client

        keys = generate(self.tmp / "keys")
        self.head = start_head([
            "--env", "CartPole-v1", "--profile", "cpu", "--collectors", "0", "--bind", self.net.head_ip,
            "--port", "0", "--curve-keys", str(keys), "--log-interval", "1", "--run-dir", str(self.run_dir),
            "--set", "collectors.envs_per_collector=2", "--set", "collectors.chunk_steps=32",
            "--set", f"transport.head_timeout_s={HEAD_TIMEOUT_S}", "--set", "logging.tensorboard=false",
            # the data path is under test, not learning: no update ever runs, the final checkpoint keeps the replay
            "--set", "replay.capacity=1000000", "--set", "learner.warmup_transitions=1000000",
            "--set", "learner.save_replay=true", "--set", "learner.max_insert_lead=0",
        ], self.tmp / "head.out")
        self.net.adopt(self.head)
        self.proxies = [FaultProxy(h.router, seed=h.index).start() for h in self.net.hosts]
        self.follower = PortFollower(self.head.pid, self.net.head_ip, self.proxies).start()
        connect = self.endpoints()["control"]
        assert connect.startswith(f"tcp://{self.net.head_ip}:"), connect
        for h in self.net.hosts:
            argv = [sys.executable, "-m", "actors", "--connect", connect, "--collectors", "1",
                    "--curve-keys", str(keys), "--register-timeout", "60"]
            with open(self.tmp / f"collector{h.index}.out", "wb") as log:
                self.collectors.append(self.net.popen(h.ns, argv, cwd=ROOT, env=head_env(), stdout=log,
                                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        curve = load_client(str(keys))
        for h in self.net.hosts:
            ctx = zmq_context_in(h.ns)
            self.contexts.append(ctx)
            self.tagged.append(RemoteTagged(ctx, connect, h.index + 1, curve))
        for tagged in self.tagged:
            tagged.start()

    def endpoints(self) -> dict[str, str]:
        path = self.run_dir / "endpoints.json"
        wait_until(lambda: path.exists() or self.head.poll() is not None, 180, f"{path}")
        assert path.exists(), f"the head exited with {self.head.poll()}: {self.head_out()}"
        return json.loads(path.read_text())

    def close(self) -> None:
        for tagged in self.tagged:
            tagged._stop.set()
        if self.follower is not None:
            self.follower.close()
        for proc in self.collectors:
            kill_tree(proc)
        if self.head is not None:
            kill_tree(self.head)
        for proxy in self.proxies:
            proxy.close()
        for ctx in self.contexts:
            ctx.destroy(linger=0)

    # ------------------------------------------------------------------ what the test reads
    def head_out(self) -> str:
        out = (self.tmp / "head.out").read_text(errors="replace")[-3000:]
        return out + "".join((self.tmp / f"collector{i}.out").read_text(errors="replace")[-1500:]
                             for i in range(len(self.collectors)) if (self.tmp / f"collector{i}.out").exists())

    def head_log(self) -> str:
        path = self.run_dir / "head.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def registrations(self) -> dict[int, tuple[int, int]]:
        """collector id -> (pid, data port), from the head's log."""
        return {int(c): (int(pid), int(port)) for c, pid, port in REGISTERED.findall(self.head_log())}

    def collector_pid(self, i: int) -> int | None:
        kids = children_of(self.collectors[i].pid)  # `python -m actors --collectors 1`: one child collects
        return kids[0] if kids else None

    def real_ids(self, i: int) -> list[int]:
        pid = self.collector_pid(i)
        return [c for c, (p, _) in self.registrations().items() if p == pid]

    def data_bytes(self, i: int) -> int:
        """Bytes host i's real collector got through to the head on its data socket(s), via host i's proxy."""
        regs = self.registrations()
        return sum(self.proxies[i].bytes[regs[c][1]]["up"] for c in self.real_ids(i) if c in regs)

    def row(self) -> dict:
        rows = read_metrics(self.run_dir)
        return rows[-1] if rows else {}

    def snapshot(self) -> dict:
        row = self.row()
        return {"bytes": [self.data_bytes(i) for i in range(len(self.collectors))],
                "credited": [len(t.credited) for t in self.tagged], "env_steps": row.get("env_steps", 0),
                "gaps": row.get("gaps", 0), "registrations": sorted(self.registrations()), "time": time.monotonic()}

    def flowing(self, since: dict, hosts: list[int]) -> bool:
        """Data arrived from every collector of `hosts` since the snapshot `since`, and the head counted it."""
        now = self.snapshot()
        return (all(now["bytes"][i] >= since["bytes"][i] + CHUNK_BYTES for i in hosts)
                and all(now["credited"][i] > since["credited"][i] for i in hosts if not self.tagged[i]._stop.is_set())
                and now["env_steps"] > since["env_steps"])

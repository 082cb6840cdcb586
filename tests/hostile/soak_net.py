"""Multi-host fault soak: the multi-host fault test's head and remote collectors for N minutes of seeded, random faults.

    python -m tests.hostile.soak_net --minutes 30 --json runs/soak-net.json [--hosts 2] [--seed 1]
    make soak-net SOAK_NET_MINUTES=30

The cluster is tests/test_multihost_faults.py's: a CartPole head in the root namespace with CURVE keys, bound to
a fixed port chosen free at the start (the restarted head binds the same one), no local collectors, training (a
low replay ratio, so weights are published all along); each collector host (tests/hostile/netns.py) runs a real
collector (`python -m actors --connect ...`, which rejoins by itself) and tests/hostile/soak.py's tagged collector, whose
chunks name themselves; every connection passes the host's transparent proxy (tests/hostile/fault_proxy.py).

Faults, one at a time, each followed by a quiet window; the first ones are a long partition, a reset and a head
kill (in an order the seed picks), then one of every other kind, then random draws until --minutes are up (a
slow machine runs past --minutes rather than skip one of the first ones):

- partition: some hosts' links down for 5 s up to 2 x transport.head_timeout_s (a long one exceeds it, so the
  collectors leave their registrations, the head reclaims them and the collectors register again after the heal;
  the tagged collector, which does not rejoin by itself, registers again once the head's log says it was
  reclaimed);
- latency 50-300 ms with jitter, or a bandwidth cap of 24-128 KB/s each way, for 6-15 s;
- stall: nothing forwarded for 2 s to head_timeout_s - 3 s, connections held;
- reset: every connection of some hosts reset (RST to both ends);
- head_kill: SIGKILL of the head, then `python -m launcher --resume RUN_DIR` with the same arguments, port
  included, while the remote collectors keep running; the tagged collectors register again with the new head;
- host_loss: a host's machine gone without a goodbye (link deleted, its processes SIGKILLed, its namespace
  deleted) for longer than head_timeout_s, so the head reclaims its registrations; then a fresh machine in its
  place (same address, a new namespace) with a fresh real collector and a new tagged collector (its own tag).

Invariants (the JSON's `invariants`, each pass/fail with a detail; exit 1 on any failure):

- acknowledged_stored_once: every chunk the head acknowledged (CREDIT) to a tagged collector is in the final
  checkpoint's replay exactly once (17 frames); a chunk in flight at a reset, a drop or a kill at most once; a
  chunk a killed head acknowledged after the checkpoint its successor resumed from is lost with it (counted);
  never_twice: no chunk stored twice; after every fault the newest periodic checkpoint holds every chunk
  acknowledged before it was written, once (checkpoint_after_faults), and a kill loses only chunks acknowledged
  after the checkpoint the next head resumes from (kill_loses_only_after_checkpoint);
- replay_counts_what_the_head_accepted; the replay is a ring, so in a soak longer than it holds the oldest chunks
  are overwritten: every acknowledged chunk must then have been found stored once in a checkpoint before that
  (the one after its fault), and only the chunks that may have been overwritten are excused from the final one;
- recovered_within_bound: data from every host's collectors (real and tagged) reaches the head again within the
  fault's bound after it ended: RECOVER_S after a short fault, REJOIN_S after a long partition or a head back up,
  FRESH_S for a fresh machine; collectors_came_back_by_themselves: the real collectors are the same processes
  after every fault (but on a lost machine);
- weights_newest_after_faults: after each fault a metrics row shows every live collector stamping the head's
  newest weight version (weight_lag 0) within WEIGHTS_S, and no chunk is rejected as future_weights;
- rejections_only_from_faults: episode_mismatch only after a reset (a lost chunk takes episode ends with it),
  nothing else; gaps_only_after_resets: sequence gaps only there, at most one per reset data connection;
- memory_bounded (RSS from /proc/PID/statm, every second): the head stays under its RSS in the first quiet window
  + REPLAY_LAZY_BYTES per replay slot (the replay's metadata and sum tree are allocated lazily and fill as the
  replay does) + HEAD_SLACK_MB; each collector process under its first RSS after it delivered + COLLECTOR_SLACK_MB.
  What a fault may add is bounded by the protocol (recv_hwm messages per registration, credits, send_hwm), a few
  MB here, so these slacks only trip on buffering that grows with a fault's length (or a leak of tens of MB);
- head_exit_clean (SIGINT at the end: exit 0, final checkpoint), nothing_left_behind (namespaces, links,
  processes, the heads' temp folders and half-written checkpoints), also after Ctrl-C or SIGTERM; the work folder is removed unless the soak
  failed (then the report names it) or --workdir was given.

Exit 0 when every invariant held, 1 otherwise, 2 on bad arguments or where namespaces cannot be made (one line),
130 on Ctrl-C. Needs root and iproute2; Linux only.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from actors.client import client_socket, reachable_endpoint
from learner.checkpoint import TMP_PREFIX, CheckpointError, find_checkpoint
from shared import tempdirs
from shared.protocol import WEIGHTS, decode_header, encode_chunk
from tests.hostile import attack as A
from tests.hostile.fault_proxy import PortFollower
from tests.hostile.netns import HostNet, unavailable
from tests.hostile.procs import children_of, rss_mb
from tests.hostile.remote_cluster import RECLAIMED, Cluster, RemoteTagged, zmq_context_in
from tests.hostile.soak import TAG_STEPS, TAG_X
from tests.hostile.waits import wait_for
from tests.support.cluster import ROOT, head_env, kill_tree

HEAD_TIMEOUT_S = 8.0  # transport.head_timeout_s
CHECKPOINT_EVERY_S = 15.0  # what a killed head loses: at most this much of acknowledged data
RECOVER_S = 45.0  # data from every collector again after a short fault ended (a loaded 2-core machine)
REJOIN_S = 60.0  # ... after a long partition healed or the killed head is back (head_timeout_s, a HELLO, envs)
FRESH_S = 240.0  # a fresh machine's collector: a new interpreter, torch, envs, registration
WEIGHTS_S = 30.0  # every collector stamping the head's newest weights, after the data flows again
HEAD_START_S = 240.0
QUIET_S = (4.0, 10.0)  # the quiet window after each fault
REPLAY_LAZY_BYTES = 48  # per replay slot: ret, disc, boot, floor (4 B each), sum tree (16 B), live starts, slack
HEAD_SLACK_MB = 256.0
COLLECTOR_SLACK_MB = 128.0
FRAMES_PER_CHUNK = TAG_STEPS + 1
# The replay is a ring: a soak longer than capacity / (env steps per s) overwrites its oldest chunks. A chunk is owed
# to a checkpoint unless the head's count of transitions LOOKBACK_S before its CREDIT (a lower bound on its place in
# the ring: a CREDIT comes within seconds of the write, a partition's at most 2 x head_timeout_s later) is within
# RING_MARGIN of the overwritten part. Such chunks were already found in the periodic checkpoint after their fault.
LOOKBACK_S = 60.0
RING_MARGIN = 100_000
FIRST = ("long_partition", "reset", "head_kill")
OTHERS = ("partition", "latency", "bandwidth", "stall", "host_loss")
WEIGHTS_OF_KIND = {"partition": 3, "long_partition": 1, "latency": 2, "bandwidth": 2, "stall": 2, "reset": 2,
                   "head_kill": 1, "host_loss": 1}


# ---------------------------------------------------------------------------- the schedule
@dataclass
class Fault:
    """One planned fault: its kind, the hosts it hits, how long it lasts and its other parameters."""
    index: int
    kind: str
    hosts: list[int]
    seconds: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "hosts": self.hosts, "seconds": round(self.seconds, 1),
                **self.params}


def draw_fault(rng: random.Random, index: int, kind: str, hosts: int) -> Fault:
    """The fault `kind` with random parameters: which hosts, how long, how bad."""
    some = sorted(rng.sample(range(hosts), rng.randint(1, hosts)))
    if kind in ("partition", "long_partition"):
        lo = HEAD_TIMEOUT_S + 2 if kind == "long_partition" else 5.0
        seconds = rng.uniform(lo, 2 * HEAD_TIMEOUT_S)
        return Fault(index, "partition", some, seconds, {"past_head_timeout": seconds > HEAD_TIMEOUT_S})
    if kind == "latency":
        low = rng.uniform(50, 150)
        high = rng.uniform(max(low + 50, 150), 300)
        return Fault(index, kind, some, rng.uniform(6, 15), {"ms": round((low + high) / 2),
                                                             "jitter_ms": round((high - low) / 2)})
    if kind == "bandwidth":
        return Fault(index, kind, some, rng.uniform(6, 15), {"bytes_per_s": rng.randrange(24_000, 128_000, 1000)})
    if kind == "stall":
        return Fault(index, kind, some, rng.uniform(2, HEAD_TIMEOUT_S - 3))
    if kind == "reset":
        return Fault(index, kind, some)
    if kind == "head_kill":
        return Fault(index, kind, [], rng.uniform(0, 5))  # seconds: from the kill to the restart
    if kind == "host_loss":
        return Fault(index, kind, [rng.randrange(hosts)], rng.uniform(HEAD_TIMEOUT_S + 2, 2 * HEAD_TIMEOUT_S))
    raise ValueError(kind)


def schedule(seed: int, hosts: int):
    """The faults in order, forever: FIRST in a seeded order, then OTHERS in a seeded order, then random draws."""
    rng = random.Random(seed)
    kinds = rng.sample(FIRST, len(FIRST)) + rng.sample(OTHERS, len(OTHERS))
    index = 0
    while True:
        kind = kinds[index] if index < len(kinds) else rng.choices(list(WEIGHTS_OF_KIND),
                                                                   list(WEIGHTS_OF_KIND.values()))[0]
        yield draw_fault(rng, index, kind, hosts)
        index += 1


# ---------------------------------------------------------------------------- the tagged collector
class StampedFake(A.FakeCollector):
    """tests/hostile/attack.py's registered collector whose chunks carry the newest weight version it has loaded."""

    weight_version = 0

    def chunk(self, chunk) -> int:
        return self._send(encode_chunk(chunk, self.collector_id, self.next_seq(), self.weight_version))


class SoakTagged(RemoteTagged):
    """The multi-host test's tagged collector that also follows the weights as a collector must (newest only: any
    version for a new registration, then only newer ones) and stamps its chunks with them, and notes when
    the head acknowledged each chunk (wall clock, to compare with a checkpoint's time)."""

    def __init__(self, ctx, connect: str, segment: int, curve, host: int) -> None:
        super().__init__(ctx, connect, segment, curve)
        self.host = host
        self.credit_time: dict[int, float] = {}
        self._weights: zmq.Socket | None = None
        self._loaded = False

    def _register(self) -> None:
        super()._register()
        self._fake.__class__ = StampedFake  # the same registration; its chunks stamped with the loaded version
        self._weights = client_socket(self.ctx, zmq.SUB, self.curve)
        self._weights.setsockopt(zmq.SUBSCRIBE, b"")
        self._weights.connect(reachable_endpoint(str(self._fake.welcome["weights_endpoint"]), self.connect))
        self._loaded = False

    def _drop(self) -> None:
        super()._drop()
        if self._weights is not None:
            self._weights.close(linger=0)
            self._weights = None

    def _collect_credits(self, timeout_ms: int) -> None:
        awaited = set(self._by_seq.values())
        super()._collect_credits(timeout_ms)
        now = time.time()
        for number in awaited - set(self._by_seq.values()):
            self.credit_time.setdefault(number, now)
        self._take_weights()

    def _take_weights(self) -> None:
        while self._weights is not None and self._weights.poll(0):
            header = decode_header(self._weights.recv_multipart()[0])
            if header.msg_type == WEIGHTS and (not self._loaded or header.weight_version > self._fake.weight_version):
                self._fake.weight_version, self._loaded = header.weight_version, True

    def stop_without_goodbye(self) -> None:
        """Its machine is gone: stop sending; what was sent and not acknowledged counts as in flight."""
        self._stop.set()
        self._thread.join(30)
        with self.lock:
            if self._fake is not None:
                self.in_flight |= set(self._by_seq.values())
                self._fake.close()
                self._fake = None
            if self._weights is not None:
                self._weights.close(linger=0)
                self._weights = None


# ---------------------------------------------------------------------------- the cluster
class NetCluster(Cluster):
    """The multi-host test's cluster with a head that can be killed and resumed on the same port (each head a
    generation: the logs are read from where its generation began) and hosts that can be lost and replaced."""

    def __init__(self, net: HostNet, work: Path, port: int, capacity: int, seed: int) -> None:
        super().__init__(net, work)
        self.port, self.capacity, self.seed = port, capacity, seed
        self.tmpdir = work / "t"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.keys: Path | None = None
        self.curve = None
        self.heads: list[subprocess.Popen] = []
        self.launchers: list[subprocess.Popen] = []  # every real collector launcher ever started
        self.all_tagged: list[SoakTagged] = []
        self.contexts_of: dict[int, Any] = {}  # host -> its zmq context (for the tagged collector)
        self.real_pid: dict[int, int] = {}  # host -> its real collector process
        self._log_at = 0
        self._rows_at = 0

    # ------------------------------------------------------------------ the head
    def head_args(self, resume: bool) -> list[str]:
        args = ["--env", "CartPole-v1", "--profile", "cpu", "--collectors", "0", "--bind", self.net.head_ip,
                "--port", str(self.port), "--curve-keys", str(self.keys), "--log-interval", "1",
                "--run-dir", str(self.run_dir), "--seed", str(self.seed),
                "--set", "collectors.envs_per_collector=2", "--set", "collectors.chunk_steps=32",
                "--set", f"transport.head_timeout_s={HEAD_TIMEOUT_S}", "--set", "logging.tensorboard=false",
                "--set", f"replay.capacity={self.capacity}", "--set", "learner.save_replay=true",
                "--set", f"learner.checkpoint_every_s={CHECKPOINT_EVERY_S}", "--set", "learner.torch_threads=1",
                # training, lightly: weights are published all along, the learner takes little of the CPU
                "--set", "learner.warmup_transitions=2000", "--set", "learner.samples_per_insert=0.5",
                "--set", "learner.max_insert_lead=0", "--set", "learner.weight_broadcast_every=50"]
        return [*args, "--resume", str(self.run_dir)] if resume else args

    def start_head(self, resume: bool) -> None:
        """A new head generation (resumed from the run dir when `resume`); its port follower; its endpoints."""
        log, metrics = self.run_dir / "head.log", self.run_dir / "metrics.jsonl"
        self._log_at = log.stat().st_size if log.exists() else 0
        self._rows_at = metrics.stat().st_size if metrics.exists() else 0
        (self.run_dir / "endpoints.json").unlink(missing_ok=True)
        env = dict(head_env(), TMPDIR=str(self.tmpdir))
        with open(self.head_out_path(len(self.heads)), "wb") as out:
            self.head = subprocess.Popen([sys.executable, "-m", "launcher", *self.head_args(resume)], cwd=ROOT,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.heads.append(self.head)
        self.net.adopt(self.head)
        if self.follower is not None:
            self.follower.close()
        self.follower = PortFollower(self.head.pid, self.net.head_ip, self.proxies).start()

    def head_up(self, timeout_s: float = HEAD_START_S) -> bool:
        """Whether this generation wrote its endpoints (bound its sockets) before it exited or the deadline."""
        path = self.run_dir / "endpoints.json"
        wait_for(lambda: path.exists() or self.head.poll() is not None, timeout_s, 0.2)
        return path.exists() and self.head.poll() is None

    def kill_head(self) -> None:
        """SIGKILL of the head process alone, as a crash: nothing it runs is told."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.head.pid, signal.SIGKILL)
        self.head.wait()

    def head_out_path(self, generation: int) -> Path:
        return self.tmp / f"head-{generation}.out"

    def head_out(self) -> str:
        path = self.head_out_path(len(self.heads) - 1)
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def head_log(self) -> str:
        """This generation's part of head.log (collector ids start again at 1 in every head)."""
        path = self.run_dir / "head.log"
        if not path.exists():
            return ""
        with open(path, "rb") as f:
            f.seek(self._log_at)
            return f.read().decode(errors="replace")

    def row(self) -> dict:
        """This generation's newest metrics row ({} before its first)."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return {}
        with open(path, "rb") as f:
            f.seek(max(self._rows_at, f.seek(0, os.SEEK_END) - 65536))
            lines = f.read().decode(errors="replace").splitlines()
        for line in reversed(lines):
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    return row
        return {}

    def reclaimed_ids(self) -> set[int]:
        return {int(cid) for cid, _ in RECLAIMED.findall(self.head_log())}

    # ------------------------------------------------------------------ the collectors
    def start(self) -> None:
        from shared.keys import generate, load_client

        self.keys = generate(self.tmp / "keys")
        self.curve = load_client(str(self.keys))
        self.start_head(resume=False)  # the proxies exist already (NetSoak.start): the port follower feeds them
        if not self.head_up():
            raise RuntimeError(f"the head did not start: {self.head_out()}")
        for h in self.net.hosts:
            self.start_host(h.index)

    def connect(self) -> str:
        return f"tcp://{self.net.head_ip}:{self.port}"

    def start_host(self, i: int) -> None:
        """Host i's real collector (a launcher of one collector, which rejoins by itself) and a new tagged one."""
        argv = [sys.executable, "-m", "actors", "--connect", self.connect(), "--collectors", "1",
                "--curve-keys", str(self.keys), "--register-timeout", "60"]
        with open(self.tmp / f"collector{i}-{len(self.launchers)}.out", "wb") as log:
            proc = self.net.popen(self.net.host(i).ns, argv, cwd=ROOT, env=head_env(), stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.launchers.append(proc)
        if i < len(self.collectors):
            self.collectors[i] = proc
        else:
            self.collectors.append(proc)
        self.real_pid.pop(i, None)
        ctx = zmq_context_in(self.net.host(i).ns)
        self.contexts.append(ctx)
        self.contexts_of[i] = ctx
        tagged = SoakTagged(ctx, self.connect(), len(self.all_tagged) + 1, self.curve, i)
        self.all_tagged.append(tagged)
        if i < len(self.tagged):
            self.tagged[i] = tagged
        else:
            self.tagged.append(tagged)
        tagged.start()

    def note_real_pid(self, i: int) -> int | None:
        """Host i's real collector process, once its launcher started it (remembered: the same one must stay)."""
        if i not in self.real_pid and (pid := self.collector_pid(i)):
            self.real_pid[i] = pid
        return self.real_pid.get(i)

    def lose_host(self, i: int) -> None:
        """Host i's machine gone without a goodbye (netns.lose_host), its tagged collector stopped with it."""
        self.net.lose_host(i)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.collectors[i].wait(10)
        self.tagged[i].stop_without_goodbye()
        ctx = self.contexts_of.pop(i)
        ctx.destroy(linger=0)
        self.contexts.remove(ctx)

    def close(self) -> None:
        for tagged in self.all_tagged:
            tagged._stop.set()
        if self.follower is not None:
            self.follower.close()
        for proc in self.launchers:
            kill_tree(proc)
        for head in self.heads:
            kill_tree(head)
        for proxy in self.proxies:
            proxy.close()
        for tagged in self.all_tagged:
            tagged._thread.join(5)
        for ctx in self.contexts:
            ctx.destroy(linger=0)
        self.contexts.clear()


# ---------------------------------------------------------------------------- memory
class Monitor:
    """Samples once a second the RSS of the head and of every collector process (/proc/PID/statm: the maxima, per
    process and since `window()`, and the bounds they are judged against) and the head's count of transitions."""

    def __init__(self, cluster: NetCluster) -> None:
        self.cluster = cluster
        self.head_max = 0.0
        self.head_baseline = 0.0
        self.window_head = 0.0
        self.window_collectors = 0.0
        self.collector_max: dict[int, float] = {}  # pid -> max
        self.collector_first: dict[int, float] = {}  # pid -> its RSS once it delivered (mark_baselines)
        self.soak_max = 0.0
        self.steps: list[tuple[float, int]] = []  # (wall time, the head's env_steps then)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def window(self) -> None:
        self.window_head = self.window_collectors = 0.0

    def _collector_pids(self) -> list[int]:
        pids = []
        for proc in list(self.cluster.collectors):
            if proc.poll() is None:
                pids += [proc.pid, *children_of(proc.pid)]
        return pids

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            head = self.cluster.head
            if head is not None and head.poll() is None:
                mb = rss_mb(head.pid)
                self.head_max, self.window_head = max(self.head_max, mb), max(self.window_head, mb)
            for pid in self._collector_pids():
                mb = rss_mb(pid)
                if mb <= 0:
                    continue
                self.collector_max[pid] = max(self.collector_max.get(pid, 0.0), mb)
                self.window_collectors = max(self.window_collectors, mb)
            self.soak_max = max(self.soak_max, rss_mb(os.getpid()))
            row = self.cluster.row()
            if "env_steps" in row:
                self.steps.append((time.time(), int(row["env_steps"])))

    def steps_before(self, when: float) -> int:
        """The head's env_steps in the newest sample taken at or before wall time `when` (0 before the first)."""
        i = bisect.bisect_right(self.steps, (when, float("inf")))
        return self.steps[i - 1][1] if i else 0

    def mark_baselines(self) -> None:
        """Every collector process sampled so far without a baseline gets its largest RSS yet as one (called once
        its collector delivered: a process that is still importing torch is no measure)."""
        for pid, top in list(self.collector_max.items()):
            self.collector_first.setdefault(pid, top)

    def head_bound(self) -> float:
        return self.head_baseline + self.cluster.capacity * REPLAY_LAZY_BYTES / 2**20 + HEAD_SLACK_MB

    def over_bound(self) -> dict[str, Any]:
        """The processes above their bound: {"head": MB} and {pid: (first, max)} for collectors."""
        over: dict[str, Any] = {}
        if self.head_max > self.head_bound():
            over["head"] = round(self.head_max)
        for pid, top in self.collector_max.items():
            if pid in self.collector_first and top > self.collector_first[pid] + COLLECTOR_SLACK_MB:
                over[str(pid)] = (round(self.collector_first[pid]), round(top))
        return over


# ---------------------------------------------------------------------------- the checkpoints
def tagged_census(ckpt: Path) -> dict[int, Counter]:
    """Tagged segment -> chunk number -> frames stored, in the replay of checkpoint dir `ckpt`."""
    frames = np.load(ckpt / "replay" / "frames.npy", mmap_mode="r")
    tagged = np.asarray(frames[frames[:, 0] == TAG_X])
    census: dict[int, Counter] = {}
    for segment in np.unique(np.rint(tagged[:, 1] * 128).astype(np.int64)).tolist():
        mine = tagged[tagged[:, 1] == np.float32(segment / 128)]
        census[segment] = Counter(np.rint(mine[:, 2] * 65536).astype(np.int64).tolist())
    return census


def read_checkpoint(run_dir: Path, attempts: int = 20) -> tuple[float, dict[int, Counter], dict] | None:
    """(when its meta.json was written, its tagged census, its meta) for the run's newest checkpoint, the one a
    resume would load; None when there is none. Retried while a periodic checkpoint swaps folders."""
    for _ in range(attempts):
        try:
            ckpt = find_checkpoint(run_dir)
            written = (ckpt / "meta.json").stat().st_mtime  # before the census: a newer replay holds more, not less
            meta = json.loads((ckpt / "meta.json").read_text())
            return written, tagged_census(ckpt), meta
        except CheckpointError:
            return None
        except (OSError, ValueError):
            time.sleep(0.25)
    return None


def judge_tagged(tagged: SoakTagged, copies: Counter, written_at: float, excused: set[int]) -> dict[str, list[int]]:
    """What a replay got wrong for one tagged collector: chunks stored twice, and chunks acknowledged before
    `written_at` (the checkpoint's time) that are not stored once, or stored in part. `excused`: chunks lost with
    a killed head, or that the ring may have overwritten (neither may be stored twice either)."""
    return {
        "twice": sorted(n for n, k in copies.items() if k > FRAMES_PER_CHUNK),
        "torn": sorted(n for n, k in copies.items() if 0 < k < FRAMES_PER_CHUNK and n not in excused),
        "missing": sorted(n for n, t in tagged.credit_time.items()
                          if t < written_at and n not in excused and copies.get(n, 0) != FRAMES_PER_CHUNK),
    }


# ---------------------------------------------------------------------------- one fault's outcome
@dataclass
class Outcome:
    fault: Fault
    started_s: float
    ended_s: float | None = None
    recovered_after_s: float | None = None
    bound_s: float = RECOVER_S
    weights_caught_up_after_s: float | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    gaps: int = 0
    reclaimed: int = 0
    head_rss_max_mb: float = 0.0
    collector_rss_max_mb: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)  # what the fault found (connections reset, chunks lost)
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, note: str = "") -> bool:
        self.checks[name] = self.checks.get(name, True) and bool(ok)
        if not ok:
            self.notes.append(f"{name} failed{': ' + note if note else ''}")
        return bool(ok)

    def to_json(self) -> dict[str, Any]:
        def r(x):
            return None if x is None else round(x, 1)
        return {**self.fault.to_json(), "started_s": r(self.started_s), "ended_s": r(self.ended_s),
                "recovered_after_s": r(self.recovered_after_s), "bound_s": self.bound_s,
                "weights_caught_up_after_s": r(self.weights_caught_up_after_s), "rejected": self.rejected,
                "gaps": self.gaps, "reclaimed": self.reclaimed, "head_rss_max_mb": round(self.head_rss_max_mb),
                "collector_rss_max_mb": round(self.collector_rss_max_mb), **self.details, "checks": self.checks,
                "notes": self.notes}


# ---------------------------------------------------------------------------- the soak
def free_port_pair(host: str) -> int:
    """A port p with p and p + 1 free on `host`, below the ephemeral range (which the heads' data sockets and every
    outgoing connection draw from), so the restarted head finds it free again."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(max(1025, low - 12000), low - 2)
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind((host, p))
            return port
        except OSError:
            continue
    raise OSError(f"no two free ports on {host} below {low}")


class NetSoak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.own_work = not args.workdir
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="soak-net-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.net = HostNet(args.hosts)
        self.cluster: NetCluster | None = None
        self.monitor: Monitor | None = None
        self.outcomes: list[Outcome] = []
        self.failures: list[str] = []  # what stopped the soak early
        self.lost_with_head: set[tuple[int, int]] = set()  # (segment, chunk) acknowledged by a killed head, not kept
        self.verified: set[tuple[int, int]] = set()  # (segment, chunk) found stored once in some checkpoint
        self.carried = Counter()  # rejections, gaps and reclaims counted by heads that were killed
        self.started = time.monotonic()
        self.startup_s: float | None = None
        self.final: dict[str, Any] = {}

    # ------------------------------------------------------------------ counts across head generations
    def counts(self) -> Counter:
        """Rejections by reason ("rejected:<reason>"), gaps and reclaims, every head generation together."""
        row = self.cluster.row()
        now = Counter({f"rejected:{k}": v for k, v in row.get("rejected_by_reason", {}).items() if v})
        now["gaps"] += row.get("gaps", 0)
        now["reclaimed"] += row.get("registrations_reclaimed", 0)
        return self.carried + now

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        from tests.hostile.fault_proxy import FaultProxy

        self.net.start()
        port = free_port_pair(self.net.head_ip)
        self.cluster = c = NetCluster(self.net, self.work, port, self.args.capacity, self.args.seed)
        c.proxies = [FaultProxy(h.router, seed=self.args.seed * 100 + h.index).start() for h in self.net.hosts]
        self.monitor = Monitor(c).start()
        c.start()
        zero = self._zero()
        hosts = list(range(self.args.hosts))
        if not wait_for(lambda: len(c.registrations()) == 2 * self.args.hosts and c.flowing(zero, hosts), FRESH_S, 0.5):
            raise RuntimeError(f"the collectors did not all deliver within {FRESH_S:.0f} s: {c.head_out()}")
        for i in hosts:
            c.note_real_pid(i)
        self.startup_s = self.elapsed()
        time.sleep(QUIET_S[0])
        self.monitor.head_baseline = self.monitor.head_max
        self.monitor.mark_baselines()

    def _zero(self) -> dict:
        n = self.args.hosts
        return {"bytes": [0] * n, "credited": [0] * n, "env_steps": 0, "time": time.monotonic()}

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        self.start()
        deadline = self.started + 60 * self.args.minutes
        for fault in schedule(self.args.seed, self.args.hosts):
            if fault.index >= len(FIRST) and time.monotonic() >= deadline:
                break
            if fault.kind == "host_loss" and len(self.cluster.all_tagged) >= 120:
                continue  # a tag's segment is stored as segment / 128
            outcome = self.run_fault(fault)
            print(f"[SOAK-NET] fault {fault.to_json()}: {outcome.details}, recovered after "
                  f"{outcome.recovered_after_s or 0:.1f} s, failed {[k for k, v in outcome.checks.items() if not v]}",
                  flush=True)
            if self.failures:
                break
        self.finish()

    def run_fault(self, fault: Fault) -> Outcome:
        """Inject `fault`, wait for the recovery and the newest weights, keep quiet a while, judge what happened."""
        out = Outcome(fault, self.elapsed())
        self.outcomes.append(out)
        before = self.counts()
        self.monitor.window()
        getattr(self, f"_fault_{fault.kind}")(fault, out)
        if self.failures:
            return out
        self._weights_caught_up(out)
        time.sleep(random.Random(self.args.seed + fault.index).uniform(*QUIET_S))
        delta = self.counts() - before
        out.rejected = {k.split(":", 1)[1]: v for k, v in delta.items() if k.startswith("rejected:")}
        out.gaps, out.reclaimed = delta["gaps"], delta["reclaimed"]
        self._judge_counts(out)
        self._judge_collectors(out)
        self._judge_checkpoint(out)
        out.head_rss_max_mb, out.collector_rss_max_mb = self.monitor.window_head, self.monitor.window_collectors
        return out

    # ------------------------------------------------------------------ recovery
    def _recover(self, out: Outcome, since: dict, bound_s: float, what: str) -> None:
        """Wait for data from every host's collectors, real and tagged, since the snapshot `since`."""
        c = self.cluster
        out.bound_s = bound_s
        hosts = list(range(self.args.hosts))
        ok = wait_for(lambda: c.flowing(since, hosts), bound_s, 0.5)
        out.recovered_after_s = time.monotonic() - since["time"]
        out.check("recovered_within_bound", ok, f"no data from every host {bound_s:.0f} s after {what}: "
                  f"{c.snapshot()} since {since}")

    def _revive_tagged(self, hosts: list[int], since: dict) -> None:
        """The tagged collectors of `hosts` whose registration the head reclaimed register again (a real collector
        does that by itself); the others go on. Waits until each one either got a credit or was reclaimed."""
        c = self.cluster
        for i in hosts:
            tagged = c.tagged[i]
            wait_for(lambda t=tagged, i=i: len(t.credited) > since["credited"][i]
                     or t.collector_id in c.reclaimed_ids(), HEAD_TIMEOUT_S + 10, 0.5)
            if tagged.collector_id in c.reclaimed_ids():
                tagged.reconnect()

    def _weights_caught_up(self, out: Outcome) -> None:
        """A metrics row where every live collector (all of them registered) stamps the head's newest weights."""
        c, t0 = self.cluster, time.monotonic()
        expected = 2 * self.args.hosts

        def caught_up() -> bool:
            row = c.row()
            return (row.get("time", 0) > time.time() - 1.5 and row.get("collectors_alive") == expected
                    and row.get("weight_lag") == 0)

        ok = wait_for(caught_up, WEIGHTS_S, 0.5)
        out.weights_caught_up_after_s = time.monotonic() - t0 if ok else None
        row = c.row()
        out.check("weights_newest_after_fault", ok, f"weight_version {row.get('weight_version')}, lag "
                  f"{row.get('weight_lag')}, alive {row.get('collectors_alive')} (expected {expected})")

    # ------------------------------------------------------------------ judging
    def _judge_counts(self, out: Outcome) -> None:
        allowed = {"episode_mismatch"} if out.fault.kind == "reset" else set()
        out.check("rejections_only_from_faults", set(out.rejected) <= allowed,
                  f"rejected {out.rejected} during a {out.fault.kind}")
        if out.fault.kind == "reset":
            out.check("gaps_only_after_resets", out.gaps <= 2 * len(out.fault.hosts), f"{out.gaps} gaps")
            out.check("rejections_only_from_faults", sum(out.rejected.values()) <= 8 * max(1, out.gaps),
                      f"rejected {out.rejected} with {out.gaps} gaps")
        else:
            out.check("gaps_only_after_resets", out.gaps == 0, f"{out.gaps} gaps during a {out.fault.kind}")

    def _judge_collectors(self, out: Outcome) -> None:
        """The real collectors are the processes they were (but on a machine lost during this fault)."""
        c = self.cluster
        for i in range(self.args.hosts):
            pid = c.real_pid.get(i)
            out.check("collectors_came_back_by_themselves",
                      c.collectors[i].poll() is None and pid is not None and c.collector_pid(i) == pid,
                      f"host {i}: launcher exit {c.collectors[i].poll()}, collector {c.collector_pid(i)} was {pid}")

    def _judge_checkpoint(self, out: Outcome) -> None:
        """The newest periodic checkpoint holds every chunk acknowledged before it was written, once."""
        read = read_checkpoint(self.cluster.run_dir)
        if read is None:
            return
        for segment, wrong in self._audit(*read).items():
            out.check("checkpoint_after_faults", not any(wrong.values()),
                      f"tagged {segment}: {({k: v[:10] for k, v in wrong.items() if v})}")

    def _lost(self, tagged: SoakTagged) -> set[int]:
        return {n for s, n in self.lost_with_head if s == tagged.segment}

    def _maybe_overwritten(self, tagged: SoakTagged, added: int) -> set[int]:
        """Chunks whose place the ring of a replay that took `added` transitions may have overwritten."""
        floor = added - self.args.capacity + RING_MARGIN
        if floor <= 0:
            return set()
        return {n for n, t in tagged.credit_time.items() if self.monitor.steps_before(t - LOOKBACK_S) < floor}

    def _audit(self, written: float, census: dict[int, Counter], meta: dict) -> dict[int, dict[str, list[int]]]:
        """judge_tagged for every tagged collector against a checkpoint; the chunks found stored once are noted as
        verified (every acknowledged chunk must be, in some checkpoint, before the ring overwrites it)."""
        added = int(meta.get("counters", {}).get("transitions_added", 0))
        wrongs = {}
        for tagged in self.cluster.all_tagged:
            copies = census.get(tagged.segment, Counter())
            excused = self._lost(tagged) | self._maybe_overwritten(tagged, added)
            wrongs[tagged.segment] = judge_tagged(tagged, copies, written, excused)
            self.verified |= {(tagged.segment, n) for n, k in copies.items() if k == FRAMES_PER_CHUNK}
        return wrongs

    # ------------------------------------------------------------------ the faults
    def _fault_partition(self, fault: Fault, out: Outcome) -> None:
        for i in fault.hosts:
            self.net.partition(i)
        time.sleep(fault.seconds)
        for i in fault.hosts:
            self.net.heal(i)
        out.ended_s = self.elapsed()
        since = self.cluster.snapshot()
        self._revive_tagged(fault.hosts, since)
        self._recover(out, since, REJOIN_S if fault.seconds > HEAD_TIMEOUT_S - 2 else RECOVER_S, "the heal")

    def _fault_latency(self, fault: Fault, out: Outcome) -> None:
        self._while_degraded(fault, out, lambda p: p.set_latency(fault.params["ms"], fault.params["jitter_ms"]),
                             lambda p: p.set_latency(0))

    def _fault_bandwidth(self, fault: Fault, out: Outcome) -> None:
        self._while_degraded(fault, out, lambda p: p.set_bandwidth(fault.params["bytes_per_s"]),
                             lambda p: p.set_bandwidth(None))

    def _while_degraded(self, fault: Fault, out: Outcome, degrade, restore) -> None:
        """Degrade the hosts' proxies for the fault's time; data must keep flowing through them meanwhile."""
        c = self.cluster
        t0 = time.monotonic()
        for i in fault.hosts:
            degrade(c.proxies[i])
        during = c.snapshot()
        flowed = wait_for(lambda: c.flowing(during, list(range(self.args.hosts))), RECOVER_S, 0.5)
        out.check("data_flows_while_degraded", flowed, str(c.snapshot()))
        time.sleep(max(0.0, t0 + fault.seconds - time.monotonic()))
        for i in fault.hosts:
            restore(c.proxies[i])
        out.ended_s = self.elapsed()
        self._recover(out, c.snapshot(), RECOVER_S, f"the {fault.kind} ended")

    def _fault_stall(self, fault: Fault, out: Outcome) -> None:
        c = self.cluster
        for i in fault.hosts:
            c.proxies[i].stall()
        stalled = c.snapshot()
        time.sleep(fault.seconds)
        held = c.snapshot()
        out.check("nothing_through_a_stall", all(held["bytes"][i] == stalled["bytes"][i] for i in fault.hosts),
                  f"{stalled['bytes']} -> {held['bytes']}")
        for i in fault.hosts:
            c.proxies[i].resume()
        out.ended_s = self.elapsed()
        self._recover(out, c.snapshot(), RECOVER_S, "the stall ended")

    def _fault_reset(self, fault: Fault, out: Outcome) -> None:
        c = self.cluster
        with contextlib.ExitStack() as held:
            for i in fault.hosts:
                held.enter_context(c.tagged[i].lock)  # nothing is sent between noting what is in flight and the reset
                c.tagged[i].note_in_flight()
            out.details["connections_reset"] = sum(c.proxies[i].reset_all() for i in fault.hosts)
        out.ended_s = self.elapsed()
        self._recover(out, c.snapshot(), RECOVER_S, "the reset")

    def _fault_head_kill(self, fault: Fault, out: Outcome) -> None:
        c = self.cluster
        have_checkpoint = wait_for(lambda: read_checkpoint(c.run_dir, 1) is not None, 3 * CHECKPOINT_EVERY_S, 0.5)
        if not out.check("checkpoint_before_kill", have_checkpoint, "no checkpoint to resume from"):
            self.failures.append("no checkpoint before the head kill")
            return
        last = c.row()
        c.kill_head()
        self.carried += Counter({f"rejected:{k}": v for k, v in last.get("rejected_by_reason", {}).items() if v})
        self.carried["gaps"] += last.get("gaps", 0)
        self.carried["reclaimed"] += last.get("registrations_reclaimed", 0)
        self._account_kill(out)
        time.sleep(fault.seconds)
        t0 = time.monotonic()
        c.start_head(resume=True)
        if not out.check("head_restarted_on_its_port", c.head_up(), c.head_out()[-1500:]):
            self.failures.append(f"the resumed head did not start: {c.head_out()[-300:]}")
            return
        out.details["head_start_s"] = round(time.monotonic() - t0, 1)
        out.ended_s = self.elapsed()
        up = c.snapshot() | {"bytes": [0] * self.args.hosts, "env_steps": 0}  # the new generation's counts
        for tagged in c.tagged:
            tagged.reconnect()  # a new registration; what the dead head did not acknowledge is never sent again
        self._recover(out, up, REJOIN_S, "the head came back")

    def _account_kill(self, out: Outcome) -> None:
        """What the next head resumes from: every chunk acknowledged before that checkpoint was written is in it
        once; the chunks acknowledged after it are lost with the killed head (and were acknowledged after it)."""
        written, census, meta = read_checkpoint(self.cluster.run_dir)
        wrongs = self._audit(written, census, meta)
        added = int(meta["counters"].get("transitions_added", 0))
        for tagged in self.cluster.all_tagged:
            copies, wrong = census.get(tagged.segment, Counter()), wrongs[tagged.segment]
            out.check("kill_loses_only_after_checkpoint", not any(wrong.values()),
                      f"tagged {tagged.segment}: {({k: v[:10] for k, v in wrong.items() if v})}")
            excused = self._lost(tagged) | self._maybe_overwritten(tagged, added)
            newly = {n for n in tagged.credit_time if copies.get(n, 0) == 0 and n not in excused}
            out.check("kill_loses_only_after_checkpoint", all(tagged.credit_time[n] >= written for n in newly),
                      f"tagged {tagged.segment}: lost chunks acknowledged before the checkpoint")
            self.lost_with_head |= {(tagged.segment, n) for n in newly}
            out.details.setdefault("lost_with_head", {})[tagged.segment] = len(newly)

    def _fault_host_loss(self, fault: Fault, out: Outcome) -> None:
        c = self.cluster
        i = fault.hosts[0]
        ids = set(c.real_ids(i)) | {c.tagged[i].collector_id}
        c.lose_host(i)
        others = [h for h in range(self.args.hosts) if h != i]
        during = c.snapshot()
        t0 = time.monotonic()
        reclaimed = wait_for(lambda: ids <= c.reclaimed_ids(), HEAD_TIMEOUT_S + 15, 0.5)
        out.check("lost_host_reclaimed", reclaimed, f"registrations {sorted(ids)}, reclaimed {c.reclaimed_ids()}")
        out.check("others_unaffected", wait_for(lambda: c.flowing(during, others), RECOVER_S, 0.5) if others else True,
                  str(c.snapshot()))
        time.sleep(max(0.0, t0 + fault.seconds - time.monotonic()))
        self.net.restore_host(i)
        c.start_host(i)
        out.ended_s = self.elapsed()
        fresh = c.snapshot()
        fresh["bytes"][i], fresh["credited"][i] = 0, 0
        self._recover(out, fresh, FRESH_S, f"a fresh machine took host {i}'s place")
        c.note_real_pid(i)
        self.monitor.mark_baselines()

    # ------------------------------------------------------------------ the end
    def finish(self) -> None:
        """Stop the tagged collectors (everything acknowledged), then the head (SIGINT: the final checkpoint)."""
        c = self.cluster
        for tagged in c.tagged:
            if not tagged._stop.is_set():
                tagged.finish()
        last = c.row()
        c.head.send_signal(signal.SIGINT)
        try:
            code = c.head.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        self.final["head_exit_code"] = code
        self.final["last_row"] = {k: last.get(k) for k in ("env_steps", "weight_version", "rejected_by_reason",
                                                           "gaps", "registrations_reclaimed", "collectors_alive")}
        self.carried += Counter({f"rejected:{k}": v for k, v in last.get("rejected_by_reason", {}).items() if v})
        self.carried["gaps"] += last.get("gaps", 0)
        self.carried["reclaimed"] += last.get("registrations_reclaimed", 0)
        self.final["replay"] = self._final_replay()

    def _final_replay(self) -> dict[str, Any]:
        read = read_checkpoint(self.cluster.run_dir)
        if read is None:
            return {"checkpoint": False}
        _, census, meta = read
        state = json.loads((self.cluster.run_dir / "checkpoint" / "replay" / "state.json").read_text())
        result: dict[str, Any] = {"checkpoint": True, "transitions_added": state["transitions_added"],
                                  "env_steps": meta["counters"]["env_steps"], "tagged": {}}
        wrongs = self._audit(float("inf"), census, meta)
        for tagged in self.cluster.all_tagged:
            copies, wrong, lost = census.get(tagged.segment, Counter()), wrongs[tagged.segment], self._lost(tagged)
            in_flight = tagged.in_flight - tagged.credited
            never_verified = sorted(n for n in tagged.credited - lost if (tagged.segment, n) not in self.verified)
            result["tagged"][tagged.segment] = {
                "host": tagged.host, "sent": tagged.sent, "credited": len(tagged.credited),
                "registrations": tagged.registrations, "errors": tagged.errors,
                "in_flight_at_drops": len(in_flight), "in_flight_lost": sum(copies.get(n, 0) == 0 for n in in_flight),
                "lost_with_killed_heads": len(lost), "stored_once": sum(k == FRAMES_PER_CHUNK for k in copies.values()),
                "maybe_overwritten": len(self._maybe_overwritten(tagged, state["transitions_added"])),
                "never_verified": never_verified[:20], **{k: v[:20] for k, v in wrong.items()},
                "wrong": {k: len(v) for k, v in wrong.items()}}
        return result

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.cluster is not None:
            self.cluster.close()
        self.net.close()

    def leftovers(self) -> dict[str, list]:
        """What is left of the soak after close(): namespaces and links, processes, the heads' temp folders."""
        c = self.cluster
        procs = [p.pid for p in [*(c.heads if c else []), *(c.launchers if c else [])] if p.poll() is None]
        procs += [k for p in (c.heads + c.launchers if c else []) for k in children_of(p.pid)]
        tmp = sorted(p.name for p in c.tmpdir.iterdir() if p.name.startswith(tempdirs.PREFIX)) if c else []
        tmp += sorted(p.name for p in c.run_dir.glob(f"{TMP_PREFIX}*")) if c else []  # a killed head's half checkpoint
        return {"namespaces_and_links": self.net.leftovers(), "processes": procs, "temp_folders": tmp}

    # ------------------------------------------------------------------ the report
    def invariants(self) -> dict[str, dict[str, Any]]:
        """Each invariant: ok, and what failed (the faults' checks folded in by name)."""
        inv: dict[str, dict[str, Any]] = {}

        def put(name: str, ok: bool, detail: Any = "") -> None:
            prior = inv.get(name, {"ok": True, "detail": []})
            prior["ok"] = prior["ok"] and bool(ok)
            if not ok:
                prior["detail"].append(detail)
            inv[name] = prior

        for out in self.outcomes:
            for name, ok in out.checks.items():
                put(name, ok, f"fault {out.fault.index} ({out.fault.kind}): "
                              + "; ".join(n for n in out.notes if n.startswith(name)))
        replay = self.final.get("replay", {})
        put("final_checkpoint", replay.get("checkpoint", False), "no final checkpoint")
        for segment, t in replay.get("tagged", {}).items():
            put("acknowledged_stored_once", not (t["missing"] or t["torn"] or t["never_verified"] or t["errors"]),
                f"tagged {segment}: missing {t['missing']}, torn {t['torn']}, never found stored once "
                f"{t['never_verified']}, errors {t['errors']}")
            put("never_twice", not t["twice"], f"tagged {segment}: twice {t['twice']}")
            put("tagged_collectors_ran", t["sent"] > 0 and t["credited"] > 0, f"tagged {segment}: {t}")
        if replay.get("checkpoint"):
            put("replay_counts_what_the_head_accepted", replay["transitions_added"] == replay["env_steps"],
                f"replay {replay['transitions_added']}, head {replay['env_steps']}")
        over = self.monitor.over_bound() if self.monitor else {}
        put("memory_bounded", not over, f"over the bound: {over}")
        put("head_exit_clean", self.final.get("head_exit_code") == 0, f"exit {self.final.get('head_exit_code')}")
        left = self.final.get("leftovers", {})
        put("nothing_left_behind", not any(left.values()), str(left))
        for failure in self.failures:
            put("soak_completed", False, failure)
        return inv

    def report(self, interrupted: bool = False, error: str = "") -> dict[str, Any]:
        inv = self.invariants()
        if error:
            inv["soak_completed"] = {"ok": False, "detail": [error]}
        failed = sorted(name for name, v in inv.items() if not v["ok"])
        rss = self.monitor
        replay = self.final.get("replay", {})
        tagged = replay.get("tagged", {}).values()
        totals = {
            "faults": Counter(o.fault.kind for o in self.outcomes),
            "head_generations": len(self.cluster.heads) if self.cluster else 0,
            "env_steps_in_final_checkpoint": replay.get("env_steps"),
            "tagged_sent": sum(t["sent"] for t in tagged), "tagged_credited": sum(t["credited"] for t in tagged),
            "tagged_in_flight_lost": sum(t["in_flight_lost"] for t in tagged),
            "tagged_lost_with_killed_heads": len(self.lost_with_head),
            "rejected": {k.split(":", 1)[1]: v for k, v in self.carried.items() if k.startswith("rejected:")},
            "gaps": self.carried["gaps"], "registrations_reclaimed": self.carried["reclaimed"],
            "recovery_s_max": max((o.recovered_after_s or 0 for o in self.outcomes), default=0),
        }
        return {
            "minutes": self.args.minutes, "seed": self.args.seed, "hosts": self.args.hosts,
            "capacity": self.args.capacity, "head_timeout_s": HEAD_TIMEOUT_S,
            "port": self.cluster.port if self.cluster else None, "elapsed_s": round(self.elapsed(), 1),
            "startup_s": None if self.startup_s is None else round(self.startup_s, 1),
            "bounds": {"recover_s": RECOVER_S, "rejoin_s": REJOIN_S, "fresh_s": FRESH_S, "weights_s": WEIGHTS_S,
                       "head_rss_bound_mb": round(rss.head_bound()) if rss else None,
                       "collector_rss_slack_mb": COLLECTOR_SLACK_MB},
            "schedule": [o.fault.to_json() for o in self.outcomes],
            "faults": [o.to_json() for o in self.outcomes],
            "invariants": inv,
            "rss": {"head_baseline_mb": round(rss.head_baseline) if rss else None,
                    "head_max_mb": round(rss.head_max) if rss else None,
                    "collector_max_mb": round(max(rss.collector_max.values(), default=0)) if rss else None,
                    "collectors": {str(p): [round(rss.collector_first.get(p, 0)), round(m)]
                                   for p, m in rss.collector_max.items()} if rss else {},
                    "soak_process_max_mb": round(rss.soak_max) if rss else None},
            "totals": totals, "final": self.final, "workdir": str(self.work), "interrupted": interrupted,
            "failed": failed, "ok": not failed and not interrupted,
        }


# ---------------------------------------------------------------------------- the command
class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (`error: ...`, status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see python -m tests.hostile.soak_net --help)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m tests.hostile.soak_net", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="how long faults are started (wall time from the start)")
    p.add_argument("--json", required=True, help="where the report goes")
    p.add_argument("--hosts", type=int, default=2, help="collector hosts (1-8)")
    p.add_argument("--seed", type=int, default=1, help="seeds the fault schedule and the head")
    p.add_argument("--capacity", type=int, default=2_000_000,
                   help="replay slots: nothing may be overwritten for the accounting (~1,000 transitions/s here)")
    p.add_argument("--workdir", help="where the run, keys and logs go (default: a new temp folder, removed unless "
                                     "the soak failed)")
    args = p.parse_args(argv)
    if not 0 < args.minutes <= 24 * 60:
        p.error(f"--minutes {args.minutes} is invalid: allowed 0 < minutes <= 1440")
    if not 1 <= args.hosts <= 8:
        p.error(f"--hosts {args.hosts} is invalid: allowed 1..8")
    if args.capacity < 100_000:
        p.error(f"--capacity {args.capacity} is invalid: allowed >= 100000")
    if not Path(args.json).resolve().parent.is_dir():
        p.error(f"--json {args.json}: no such folder {Path(args.json).resolve().parent}")
    if reason := unavailable():
        p.exit(2, f"error: {reason}: the multi-host soak needs network namespaces\n")
    return args


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    soak = NetSoak(args)
    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: everything is taken down
    interrupted, error = False, ""
    try:
        soak.run()
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:  # noqa: BLE001 - the report says what stopped the soak
        error = f"{type(exc).__name__}: {exc}"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        soak.close()
    soak.final["leftovers"] = soak.leftovers()
    report = soak.report(interrupted, error)
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    Path(args.json).write_text(text + "\n")
    print(json.dumps({k: report[k] for k in ("ok", "failed", "elapsed_s", "totals")}, default=str))
    if soak.own_work and (report["ok"] or interrupted):
        shutil.rmtree(soak.work, ignore_errors=True)
    if interrupted:
        return 130
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

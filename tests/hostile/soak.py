"""Fault soak: a real head trained for a set time while its collectors, its peers, its disk and the head itself fail.

    python -m tests.hostile.soak --minutes 5            # make soak SOAK_MINUTES=5
    python -m tests.hostile.soak --minutes 60 --json soak.json

The run is a chain of segments, each one `python -m launcher` process (CartPole-v1 by default, two local
collectors, port 0, its own TMPDIR), the first starting fresh and each later one resuming the run dir.
While a segment runs, a fault every 1.5-4 s, at random (seeded): kill -9 of a collector, SIGSTOP of a
collector for 1-8 s (past the stall timeout of 5 s it is killed as stalled and replaced), poisoned chunks
(NaN, 3e38 observations, a 3.4e38 reward), HELLOs nested too deep, foreign peers on a registration's data
socket (tests/hostile/attack.py), and the abrupt loss of the soak's own tagged collector's connection (what it had
in flight may be lost, never written twice). A segment ends in one of three ways:

- clean: SIGTERM, exit 0, a final checkpoint;
- disk full: the head runs under RLIMIT_FSIZE (the kernel refuses any file larger than the logs), so
  every checkpoint fails; SIGTERM must give exit 3 and leave the previous checkpoint untouched;
- head killed: kill -9 of the head; its collectors must exit by themselves, and the next head's start must
  remove the temp folders the dead head left.

The first three segments are one of each kind, in that order; later ones are drawn at random, and the last is
clean. On a machine slower than planned the soak runs past --minutes rather than skip a kind.

What is checked (each segment's figures and every failed check go into the JSON report; exit 1 on any):

- after a clean segment, its checkpoint's replay passes `check_valid`, and the transitions the replay
  counts (replay/state.json) equal the env steps the head counted as accepted (the checkpoint's counters),
  before and after the segment: whatever the head accepted was written once, and resuming neither
  re-added nor dropped any of it;
- the tagged collector (in this process) sends complete 16-step episodes whose observations encode the
  segment, a chunk number and the step (x = 7.75, which CartPole never reaches); every chunk the head
  acknowledged (CREDIT) is in the segment's checkpoint exactly once (17 frames), a chunk lost in flight at
  most once, and none twice;
- every rejection the head counted, by reason, is one the soak caused (and all of them were counted);
  no sequence gap between a live collector and the head;
- the head's RSS stays under --rss-bound-mb;
- when the soak ends no process of any of its heads is left, nor any ipc temp folder.

Linux only (/proc for RSS and process lists).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
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

from shared import tempdirs
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, NO_ACTION, TransitionChunk
from shared.protocol import CREDIT, decode_header
from tests.hostile import attack as A
from tests.hostile.procs import children_of, rss_mb
from tests.hostile.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
TAG_X = 7.75  # observation[0] of the tagged collector's frames: CartPole's cart position ends at |x| = 2.4
TAG_STEPS = 16  # a tagged chunk: one complete 16-step episode, 17 frames
STALL_TIMEOUT_S = 5.0
CHECKPOINT_EVERY_S = 10.0
KINDS = ("clean", "disk_full", "head_killed")
POISONS = A.CHUNK_ATTACKS  # poisoned chunk kind -> the head's rejection reason


# ---------------------------------------------------------------------------- processes
def heads_tmpdir(work: Path) -> Path:
    """The heads' TMPDIR: work/t, or else a new soak-* folder of its own under the temp dir (then under /tmp) when
    work/t is too long for the heads' unix sockets, so their ipc folders land where the soak looks for them
    (shared/tempdirs.py) and nobody else's do: never a shared folder such as /tmp itself, whose other heads'
    folders the soak's checks would count as its own (and which it removes when done)."""
    def fits(path: str) -> bool:
        return len(os.fsencode(path)) + 1 + tempdirs.NAME_ROOM + 1 + tempdirs.SOCKET_NAME_ROOM <= tempdirs.SOCKET_PATH_MAX

    own = work / "t"
    if fits(str(own)):
        own.mkdir(parents=True, exist_ok=True)
        return own
    for base in (tempfile.gettempdir(), tempdirs.FALLBACK_ROOT):
        if fits(os.path.join(base, "soak-12345678")) and os.path.isdir(base):
            return Path(tempfile.mkdtemp(prefix="soak-", dir=base))
    raise SystemExit("error: no temp dir short enough for the heads' unix socket paths (set TMPDIR=/tmp)")


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


# ---------------------------------------------------------------------------- the tagged collector
def tagged_chunk(segment: int, number: int, stream: int, reward: float = 1.0) -> TransitionChunk:
    """One complete episode whose frames say where they come from: (TAG_X, segment/128, number/65536, t/64),
    `reward` per step (a real collector's: the env's 1 x env.reward_scale, within the head's bound)."""
    frames = np.empty((TAG_STEPS + 1, 4), dtype=np.float32)
    frames[:, 0] = TAG_X
    frames[:, 1] = segment / 128
    frames[:, 2] = number / 65536
    frames[:, 3] = np.arange(TAG_STEPS + 1) / 64
    actions = np.zeros(TAG_STEPS + 1, dtype=np.int32)
    actions[-1] = NO_ACTION
    rewards = np.full(TAG_STEPS + 1, reward, dtype=np.float32)
    rewards[-1] = 0.0
    flags = np.zeros(TAG_STEPS + 1, dtype=np.uint8)
    flags[0] = FLAG_FIRST
    flags[TAG_STEPS - 1] |= FLAG_TERMINATED
    return TransitionChunk(stream, 0, frames, actions, rewards, flags, np.ones(TAG_STEPS + 1, dtype=np.float32))


class TaggedCollector:
    """Registers with the head like a collector and sends tagged chunks within its credit; `reconnect` drops the
    connection abruptly (whatever is in flight may be lost) and registers again."""

    def __init__(self, ctx: zmq.Context, connect: str, segment: int) -> None:
        self.ctx, self.connect, self.segment = ctx, connect, segment
        self.lock = threading.Lock()
        self.credited: set[int] = set()  # chunk numbers the head acknowledged
        self.in_flight: set[int] = set()  # sent, not acknowledged when their connection was dropped
        self.sent = 0
        self.registrations = 0
        self.errors: list[str] = []
        self._fake: A.FakeCollector | None = None
        self._by_seq: dict[int, int] = {}  # seq -> chunk number of the chunks sent and not yet acknowledged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tagged-collector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _register(self) -> None:
        self._fake = A.FakeCollector(self.ctx, self.connect, host="soak", timeout_s=60)
        self._by_seq = {}
        self.registrations += 1
        cfg = self._fake.welcome.get("config", {})
        self._credit = max(1, int(cfg.get("transport", {}).get("max_chunks_in_flight", 2) or 2))
        self._streams = max(1, len(self._fake.welcome.get("epsilons") or [0]))
        self._reward = float(cfg.get("env", {}).get("reward_scale", 1.0))  # the env's +1, scaled as collectors send it

    def _drop(self) -> None:
        if self._fake is not None:
            self._collect_credits(0)
            self.in_flight |= {n for s, n in self._by_seq.items() if s > self._fake.credited}
            self._fake.close()
            self._fake = None

    def _collect_credits(self, timeout_ms: int) -> None:
        fake = self._fake
        while fake.data.poll(timeout_ms):
            header = decode_header(fake.data.recv_multipart()[0])
            if header.msg_type == CREDIT:
                fake.credited = max(fake.credited, header.seq)
            timeout_ms = 0
        for seq in [s for s in self._by_seq if s <= fake.credited]:  # acknowledged: no longer awaited
            self.credited.add(self._by_seq.pop(seq))

    def _run(self) -> None:
        try:
            self._register()
            while not self._stop.is_set():
                with self.lock:
                    fake = self._fake
                    if fake.seq - fake.credited < self._credit and self.sent < 65536:
                        number = self.sent
                        self.sent += 1
                        self._by_seq[fake.chunk(tagged_chunk(self.segment, number, number % self._streams,
                                                                 self._reward))] = number
                    self._collect_credits(20)
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - reported; the soak goes on without it
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def reconnect(self) -> None:
        with self.lock:
            if self._fake is not None and not self._stop.is_set():
                self._drop()
                self._register()

    def finish(self, timeout_s: float = 60.0) -> None:
        """Stop sending, wait for the acknowledgement of everything sent, then close."""
        self._stop.set()
        self._thread.join(30)
        with self.lock:
            if self._fake is not None:
                self._fake.wait_credit(self._fake.seq, timeout_s)
                self._collect_credits(0)
                self._drop()


# ---------------------------------------------------------------------------- one segment
@dataclass
class Segment:
    index: int
    kind: str
    seconds: float
    exit_code: int | None = None
    faults: Counter = field(default_factory=Counter)
    expected_rejections: Counter = field(default_factory=Counter)
    counted_rejections: dict[str, int] = field(default_factory=dict)
    head_rss_max_mb: float = 0.0
    collectors_rss_max_mb: float = 0.0
    env_steps: int = 0  # the run's env steps at this head's last metrics row (accepted transitions, cumulative)
    base_env_steps: int = 0  # ... in the checkpoint it resumed from
    gaps: int = 0
    restarts: int = 0
    tagged: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, note: str = "") -> None:
        self.checks[name] = bool(ok)
        if not ok:
            self.notes.append(f"{name} failed{': ' + note if note else ''}")


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="soak-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.work / "run"
        self.tmpdir = heads_tmpdir(self.work)
        self.head_pids: list[int] = []
        self.segments: list[Segment] = []
        self.ctx = zmq.Context()

    # ------------------------------------------------------------------ the head
    def _argv(self, resume: bool) -> list[str]:
        a = self.args
        argv = [sys.executable, "-m", "launcher", "--env", a.env, "--profile", "cpu", "--collectors", "2",
                "--port", "0", "--log-interval", "1", "--seed", str(a.seed), "--run-dir", str(self.run_dir),
                "--set", "learner.save_replay=true", "--set", f"learner.checkpoint_every_s={CHECKPOINT_EVERY_S}",
                "--set", f"replay.capacity={a.capacity}", "--set", f"transport.stall_timeout_s={STALL_TIMEOUT_S}",
                # ipc (not the default): a killed head's temp folders are part of what must not be left behind
                "--set", "transport.local_transport=ipc"]
        return [*argv, "--resume", str(self.run_dir)] if resume else argv

    def _start_head(self, seg: Segment, resume: bool) -> subprocess.Popen:
        (self.run_dir / "endpoints.json").unlink(missing_ok=True)  # a killed head leaves its own
        limit = self._file_size_limit() if seg.kind == "disk_full" else None

        def preexec() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes raise

        env = dict(os.environ, TMPDIR=str(self.tmpdir), OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
                   MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.work / f"head-{seg.index}.out", "wb") as out:
            proc = subprocess.Popen(self._argv(resume), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec)
        self.head_pids.append(proc.pid)
        return proc

    def _file_size_limit(self) -> int:
        """RLIMIT_FSIZE for a disk-full segment: above every log the head appends to (metrics.jsonl, head.log),
        so only the checkpoint's files can hit it."""
        sizes = [p.stat().st_size for p in self.run_dir.rglob("*") if p.is_file() and "checkpoint" not in p.parts]
        return max(sizes, default=0) + (2 << 20)

    def _disk_full_possible(self) -> bool:
        """Whether the replay's frames.npy (capacity x 4 float32) is larger than that limit: the logs grow with
        the soak, so late in a long one the remaining disk-full segments become clean ones."""
        return self.args.capacity * 4 * 4 > self._file_size_limit()

    def _endpoints(self, proc: subprocess.Popen) -> dict[str, str] | None:
        path = self.run_dir / "endpoints.json"
        if not wait_for(lambda: path.exists() or proc.poll() is not None, 300):
            return None
        return json.loads(path.read_text()) if path.exists() else None

    def _rows(self, since: int) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()[since:] if line.strip()]

    def _metrics_lines(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    # ------------------------------------------------------------------ faults
    def _fault(self, seg: Segment, proc: subprocess.Popen, connect: str, tagged: TaggedCollector,
               stopped: dict[int, float]) -> None:
        kind = self.rng.choice(["kill", "stop", "stop", "poison", "deep_json", "foreign", "tagged_drop"])
        kids = children_of(proc.pid)
        if kind == "kill" and kids:
            if signal_pid(self.rng.choice(kids), signal.SIGKILL):
                seg.faults["collector_killed"] += 1
        elif kind == "stop" and kids:
            pid = self.rng.choice(kids)
            if pid not in stopped and signal_pid(pid, signal.SIGSTOP):
                stopped[pid] = time.monotonic() + self.rng.uniform(1.0, 8.0)
                seg.faults["collector_stopped"] += 1
        elif kind == "poison":
            poison = self.rng.choice(sorted(POISONS))
            result = A.chunk_attack(self.ctx, connect, [poison], count=1)
            if result["acknowledged"]:
                seg.expected_rejections[POISONS[poison]] += 1
                seg.faults["poisoned_chunk"] += 1
            else:
                seg.notes.append(f"poisoned chunk not acknowledged: {result}")
        elif kind == "deep_json":
            result = A.deep_json(self.ctx, connect, count=2, wait_s=0.5)
            seg.expected_rejections["bad_json"] += result["sent"]
            seg.faults["deep_json_hello"] += result["sent"]
        elif kind == "foreign":
            result = A.second_peer(self.ctx, connect, owner_chunks=1, poll_s=0.5)
            seg.expected_rejections["foreign_peer"] += result["foreign_sent"]
            seg.faults["foreign_peer"] += result["foreign_sent"]
            if not result["owner_not_stalled"] or any(result["received_by_other_peers"].values()):
                seg.notes.append(f"foreign peers touched the owner: {result}")
                seg.checks["foreign_peers_harmless"] = False
        elif kind == "tagged_drop":
            tagged.reconnect()
            seg.faults["tagged_connection_dropped"] += 1

    def _sample(self, seg: Segment, proc: subprocess.Popen) -> None:
        seg.head_rss_max_mb = max(seg.head_rss_max_mb, rss_mb(proc.pid))
        seg.collectors_rss_max_mb = max(seg.collectors_rss_max_mb, sum(rss_mb(p) for p in children_of(proc.pid)))

    # ------------------------------------------------------------------ segments
    def run_segment(self, seg: Segment, resume: bool) -> None:
        before = self._checkpoint_state() if resume else None
        seg.base_env_steps = before["env_steps"] if before else 0
        lines = self._metrics_lines()
        dead_folders = {p for p in self.tmpdir.iterdir() if p.name.startswith("mapx-")}
        proc = self._start_head(seg, resume)
        tagged = None
        try:
            endpoints = self._endpoints(proc)
            if endpoints is None:
                seg.check("head_started", False, (self.work / f"head-{seg.index}.out").read_text()[-2000:])
                return
            if dead_folders:  # a killed head's: this head's start removed them
                seg.check("killed_heads_temp_folders_removed", not any(p.exists() for p in dead_folders),
                          str(dead_folders))
            connect = endpoints["control"]
            seg.check("head_temp_folders_where_the_soak_looks",
                      any((tempdirs.owner(p.name) or (0,))[0] == proc.pid for p in self.tmpdir.iterdir()),
                      f"none of pid {proc.pid} in {self.tmpdir}")
            wait_for(lambda: proc.poll() is not None or len(children_of(proc.pid)) == 2, 120)
            tagged = TaggedCollector(self.ctx, connect, seg.index)
            tagged.start()
            stopped: dict[int, float] = {}
            end = time.monotonic() + seg.seconds
            next_fault = time.monotonic() + self.rng.uniform(1.5, 4.0)
            while time.monotonic() < end and proc.poll() is None:
                time.sleep(0.25)
                self._sample(seg, proc)
                for pid, until in list(stopped.items()):
                    if time.monotonic() >= until:
                        signal_pid(pid, signal.SIGCONT)
                        del stopped[pid]
                if time.monotonic() >= next_fault:
                    try:
                        self._fault(seg, proc, connect, tagged, stopped)
                    except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is reported
                        seg.notes.append(f"fault failed: {type(exc).__name__}: {exc}")
                    next_fault = time.monotonic() + self.rng.uniform(1.5, 4.0)
            for pid in stopped:
                signal_pid(pid, signal.SIGCONT)
            tagged.finish()
            seg.check("head_alive_through_the_faults", proc.poll() is None, f"exit {proc.poll()}")
            # every rejection caused is counted (a metrics row comes every second)
            expected = sum(seg.expected_rejections.values())
            wait_for(lambda: proc.poll() is not None or
                     any(r.get("rejected", 0) >= expected for r in self._rows(lines)[-1:]), 60)
            self._end(seg, proc)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if tagged is not None and not tagged._stop.is_set():
                tagged.finish(5)
        rows = self._rows(lines)
        last = rows[-1] if rows else {}
        seg.counted_rejections = {k: v for k, v in last.get("rejected_by_reason", {}).items() if v}
        seg.env_steps, seg.gaps, seg.restarts = last.get("env_steps", 0), last.get("gaps", 0), last.get("restarts", 0)
        seg.check("rejections_are_what_the_soak_caused",
                  seg.counted_rejections == {k: v for k, v in seg.expected_rejections.items() if v},
                  f"counted {seg.counted_rejections}, caused {dict(seg.expected_rejections)}")
        seg.check("no_sequence_gaps", seg.gaps == 0, str(seg.gaps))
        seg.check("head_rss_within_bound", seg.head_rss_max_mb <= self.args.rss_bound_mb,
                  f"{seg.head_rss_max_mb:.0f} MB > {self.args.rss_bound_mb} MB")
        seg.check("collectors_exited", wait_for(lambda: not children_of(proc.pid), 120), str(children_of(proc.pid)))
        self._check_checkpoint(seg, before, tagged)

    def _end(self, seg: Segment, proc: subprocess.Popen) -> None:
        if seg.kind == "head_killed":
            os.kill(proc.pid, signal.SIGKILL)  # not its group: its collectors must notice by themselves
            proc.wait()
            seg.exit_code = proc.returncode
            return
        proc.send_signal(signal.SIGTERM)
        try:
            seg.exit_code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            seg.check("exit_after_sigterm", False, "no exit within 300 s")
            return
        want = 3 if seg.kind == "disk_full" else 0
        seg.check(f"exit_{want}", seg.exit_code == want, f"exit {seg.exit_code}: "
                  + (self.work / f"head-{seg.index}.out").read_text()[-1500:])
        if seg.kind == "clean":
            seg.check("no_temp_folder_left", not [p for p in self.tmpdir.iterdir() if p.name.startswith("mapx-")])

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self) -> dict[str, Any] | None:
        meta = self.run_dir / "checkpoint" / "meta.json"
        if not meta.exists():
            return None
        data = json.loads(meta.read_text())
        state = json.loads((self.run_dir / "checkpoint" / "replay" / "state.json").read_text())
        return {"meta_bytes": meta.read_bytes(), "env_steps": int(data["counters"].get("env_steps", 0)),
                "transitions_added": int(state["transitions_added"])}

    def _check_checkpoint(self, seg: Segment, before: dict[str, Any] | None, tagged: TaggedCollector | None) -> None:
        after = self._checkpoint_state()
        if seg.kind == "disk_full":
            seg.check("previous_checkpoint_untouched", before is not None and after is not None
                      and after["meta_bytes"] == before["meta_bytes"])
            return
        if seg.kind == "head_killed" or after is None:
            if seg.kind == "clean":
                seg.check("checkpoint_written", False)
            return
        from replay.buffer import ReplayBuffer

        replay = ReplayBuffer.load(self.run_dir / "checkpoint" / "replay")
        try:
            replay.check_valid()
            seg.check("replay_valid", True)
        except Exception as exc:  # noqa: BLE001 - the report names it
            seg.check("replay_valid", False, f"{type(exc).__name__}: {exc}")
        # the head's count includes what its collectors flushed while it closed (after its last metrics row)
        seg.env_steps = after["env_steps"]
        base = before["transitions_added"] if before else 0
        seg.check("replay_counts_what_the_head_accepted", after["transitions_added"] == after["env_steps"]
                  and after["transitions_added"] - base == seg.env_steps - seg.base_env_steps,
                  f"replay {base} -> {after['transitions_added']}, head {seg.base_env_steps} -> {after['env_steps']}")
        if tagged is not None:
            self._check_tagged(seg, tagged, after["transitions_added"] - base)

    def _check_tagged(self, seg: Segment, tagged: TaggedCollector, written: int) -> None:
        frames = np.load(self.run_dir / "checkpoint" / "replay" / "frames.npy")
        mine = frames[(frames[:, 0] == TAG_X) & (frames[:, 1] == np.float32(seg.index / 128))]
        copies = Counter((np.rint(mine[:, 2] * 65536)).astype(np.int64).tolist())
        frames_per_chunk = TAG_STEPS + 1
        twice = sorted(n for n, c in copies.items() if c > frames_per_chunk)
        credited = tagged.credited
        missing = sorted(n for n in credited if copies.get(n, 0) != frames_per_chunk)
        lost_in_flight = sorted(n for n in tagged.in_flight - credited if copies.get(n, 0) == 0)
        seg.tagged = {"sent": tagged.sent, "credited": len(credited), "registrations": tagged.registrations,
                      "in_flight_at_drops": len(tagged.in_flight - credited), "lost_in_flight": len(lost_in_flight),
                      "stored_once": sum(c == frames_per_chunk for c in copies.values()), "errors": tagged.errors}
        seg.check("tagged_never_twice", not twice, str(twice[:10]))
        if written < self.args.capacity // 2:  # nothing of this segment can have been overwritten
            seg.check("tagged_acknowledged_stored_once", not missing, str(missing[:10]))
        seg.check("tagged_collector_ran", tagged.sent > 0 and not tagged.errors, str(tagged.errors))

    # ------------------------------------------------------------------ the whole soak
    def plan(self, remaining: float, index: int) -> tuple[str, float, bool]:
        short = self.args.minutes <= 3
        lo, hi = (15.0, 25.0) if short else (40.0, 120.0)
        startup = 15.0
        kind = KINDS[index] if index < len(KINDS) else self.rng.choices(KINDS, weights=(6, 2, 2))[0]
        if kind == "disk_full" and not self._disk_full_possible():
            kind = "clean"
        seconds = self.rng.uniform(lo, hi)
        if index < len(KINDS):  # every kind runs once, then a clean last one, however slow the machine
            return kind, seconds if remaining - (seconds + startup) >= lo + startup else lo, False
        if remaining - (seconds + startup) < lo + startup:  # too little left for another one: this is the last
            return "clean", max(lo, remaining - startup), True
        return kind, seconds, False

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        deadline = started + 60 * self.args.minutes
        index = 0
        try:
            while True:
                kind, seconds, last = self.plan(deadline - time.monotonic(), index)
                seg = Segment(index, kind, round(seconds, 1))
                self.segments.append(seg)
                print(f"[SOAK] segment {index}: {kind}, {seconds:.0f} s", flush=True)
                self.run_segment(seg, resume=index > 0)
                print(f"[SOAK] segment {index}: exit {seg.exit_code}, faults {dict(seg.faults)}, "
                      f"failed {[k for k, v in seg.checks.items() if not v]}", flush=True)
                index += 1
                if last or not seg.checks.get("head_started", True):
                    break
        finally:
            for pid in self.head_pids:
                signal_pid(pid, signal.SIGKILL)
                for child in children_of(pid):
                    signal_pid(child, signal.SIGKILL)
            self.ctx.destroy(linger=0)
        leftovers = sorted(p.name for p in self.tmpdir.iterdir() if p.name.startswith("mapx-"))
        orphans = [p for pid in self.head_pids for p in children_of(pid)]
        failed = [f"segment {s.index}: {n}" for s in self.segments for n in s.notes if "failed" in n]
        final = {
            "no_process_left": not orphans,
            "no_temp_folder_left": not leftovers,
            "last_segment_clean": bool(self.segments) and self.segments[-1].kind == "clean"
            and all(self.segments[-1].checks.values()),
        }
        failed += [name for name, ok in final.items() if not ok]
        report = {
            "minutes": self.args.minutes, "seed": self.args.seed, "env": self.args.env, "capacity": self.args.capacity,
            "rss_bound_mb": self.args.rss_bound_mb, "elapsed_s": round(time.monotonic() - started, 1),
            "workdir": str(self.work), "heads_tmpdir": str(self.tmpdir),
            "segments": [_segment_json(s) for s in self.segments],
            "totals": {
                "segments": Counter(s.kind for s in self.segments),
                "faults": sum((s.faults for s in self.segments), Counter()),
                "rejections": sum((Counter(s.counted_rejections) for s in self.segments), Counter()),
                "collector_restarts": sum(s.restarts for s in self.segments),
                "env_steps_accepted": sum(s.env_steps - s.base_env_steps for s in self.segments),
                "env_steps_in_last_checkpoint": self.segments[-1].env_steps if self.segments else 0,
                "tagged_sent": sum(s.tagged.get("sent", 0) for s in self.segments),
                "tagged_credited": sum(s.tagged.get("credited", 0) for s in self.segments),
                "tagged_lost_in_flight": sum(s.tagged.get("lost_in_flight", 0) for s in self.segments),
                "head_rss_max_mb": round(max((s.head_rss_max_mb for s in self.segments), default=0.0)),
                "collectors_rss_max_mb": round(max((s.collectors_rss_max_mb for s in self.segments), default=0.0)),
            },
            "final": final, "failed": failed, "ok": not failed,
        }
        return report


def _segment_json(s: Segment) -> dict[str, Any]:
    return {"index": s.index, "kind": s.kind, "seconds": s.seconds, "exit_code": s.exit_code,
            "faults": dict(s.faults), "expected_rejections": dict(s.expected_rejections),
            "counted_rejections": s.counted_rejections, "env_steps": s.env_steps,
            "env_steps_accepted": s.env_steps - s.base_env_steps, "gaps": s.gaps,
            "restarts": s.restarts, "head_rss_max_mb": round(s.head_rss_max_mb),
            "collectors_rss_max_mb": round(s.collectors_rss_max_mb), "tagged": s.tagged, "checks": s.checks,
            "notes": s.notes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.hostile.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="how long the soak runs (wall time)")
    p.add_argument("--seed", type=int, default=1, help="seeds the fault schedule and the head")
    p.add_argument("--env", default="CartPole-v1", help="a vector env the chunk attacks fit (4 float observations)")
    p.add_argument("--capacity", type=int, default=400_000,
                   help="replay frame slots: its frames.npy must exceed the disk-full segment's file size limit")
    p.add_argument("--rss-bound-mb", type=float, default=1024.0,
                   help="largest head RSS allowed (MB; a CartPole head with the default capacity: ~420)")
    p.add_argument("--workdir", help="where the run dir, the heads' TMPDIR and their output go (default: a new "
                                     "temp folder, removed after a soak that passed)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if not 0 < args.minutes <= 24 * 60:
        p.exit(2, f"error: --minutes {args.minutes} is invalid: allowed 0 < minutes <= 1440\n")
    if args.capacity < 10_000:
        p.exit(2, f"error: --capacity {args.capacity} is invalid: allowed >= 10000\n")
    if not sys.platform.startswith("linux"):
        p.exit(2, "error: the soak reads /proc: Linux only\n")
    soak = Soak(args)
    report = soak.run()
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    if report["ok"]:
        if not args.workdir:
            shutil.rmtree(soak.work, ignore_errors=True)
        if soak.work not in soak.tmpdir.parents:
            shutil.rmtree(soak.tmpdir, ignore_errors=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

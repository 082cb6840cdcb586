"""Transport and collector benchmarks (functions returning dicts; `bench.driver` calls them).

- transport_tps: transitions/s of 84x84 uint8 chunks (128 transitions each) from a sender
  process through one DEALER->DEALER data socket (as collectors use), with the full encode -> decode + validate path.
- mpqueue_transport_tps: the naive baseline, one pickled (s, a, r, s', done) tuple of 4x84x84
  stacks per multiprocessing.Queue put.
- collector_overhead: everything a collector does per step except env.step/reset, as a
  fraction of env time, at K envs (real Mario when available, else the counting env).

    python -m bench.transport [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import time
from dataclasses import replace
from typing import Any

import numpy as np

from shared.chunk import FLAG_FIRST, NO_ACTION, TransitionChunk
from shared.tempdirs import owned_tempdir

CHUNK_TRANSITIONS = 128
N_STEP, STACK = 3, 4
OBS = (84, 84)


def synthetic_chunk(transitions: int = CHUNK_TRANSITIONS, stream: int = 0) -> TransitionChunk:
    """A valid chunk with exactly `transitions` complete n-step transitions."""
    f = transitions + N_STEP
    rng = np.random.default_rng(stream)
    actions = rng.integers(0, 4, size=f).astype(np.int32)
    actions[-1] = NO_ACTION
    flags = np.zeros(f, np.uint8)
    flags[0] = FLAG_FIRST
    return TransitionChunk(stream, 0, rng.integers(0, 256, size=(f, *OBS), dtype=np.uint8), actions,
                           rng.random(f).astype(np.float32), flags, rng.random(f).astype(np.float32))


MIN_MESSAGES = 8  # chunks a transport bench sends whatever its duration


def _zmq_sender(endpoint: str, seconds: float, sockbuf: int) -> None:
    import zmq

    from shared.protocol import BYE, encode_chunk, encode_simple, send_parts

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.sndhwm = 16
    if sockbuf:
        sock.sndbuf = sockbuf
    sock.connect(endpoint)
    chunk = synthetic_chunk()
    seq = 0
    end = time.monotonic() + seconds
    # at least MIN_MESSAGES: the receiver times from the first, so a starved machine still gets a rate to report
    while seq < MIN_MESSAGES or time.monotonic() < end:
        seq += 1
        send_parts(sock, encode_chunk(chunk, 1, seq, 0))
    send_parts(sock, encode_simple(BYE, 1, seq + 1))
    sock.close(linger=5000)
    ctx.term()


def transport_tps(transport: str = "ipc", seconds: float = 2.0, sockbuf: int = 0) -> dict[str, Any]:
    """Receiver side in this process: recv(copy=False) + decode + validate every message."""
    import zmq

    from shared.protocol import BYE, TRANSITION_CHUNK, ObsSpec, decode

    spec = ObsSpec(OBS, np.dtype(np.uint8), 4)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.rcvhwm = 64
    if sockbuf:
        sock.rcvbuf = sockbuf
    tmp = owned_tempdir()  # removed by the next head if this bench is killed
    if transport == "ipc":
        endpoint = f"ipc://{os.path.join(tmp, 'bench.ipc')}"
        sock.bind(endpoint)
    else:
        endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    proc = mp.get_context("spawn").Process(target=_zmq_sender, args=(endpoint, seconds, sockbuf), daemon=True)
    proc.start()
    transitions = messages = sent = 0
    t_first = t_last = 0.0
    try:
        while True:
            if not sock.poll(1000):
                if not proc.is_alive():
                    raise RuntimeError(f"bench sender exited with code {proc.exitcode}")
                continue
            msg = decode(sock.recv_multipart(copy=False), spec)
            now = time.perf_counter()
            if msg.header.msg_type == BYE:
                sent = msg.header.seq - 1  # the sender numbers its chunks 1..n and its BYE n + 1
                break
            if msg.header.msg_type == TRANSITION_CHUNK:
                if messages == 0:
                    t_first = now  # the first message absorbs process start-up; time from it
                else:
                    transitions += CHUNK_TRANSITIONS
                messages += 1
                t_last = now
    finally:
        proc.join(10)
        sock.close(linger=0)
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    if messages != sent:  # a rate over chunks lost or invented would measure nothing
        raise RuntimeError(f"bench receiver decoded {messages} chunks of the {sent} the sender sent")
    elapsed = max(t_last - t_first, 1e-9)
    return {"transport": transport, "transitions": transitions, "chunks": messages, "seconds": elapsed,
            "transitions_per_s": transitions / elapsed, "mb_per_s": transitions / CHUNK_TRANSITIONS
            * synthetic_chunk().frames.nbytes / elapsed / 2**20}


def _mpqueue_sender(queue: Any, seconds: float) -> None:
    rng = np.random.default_rng(0)
    state = rng.integers(0, 256, size=(STACK, *OBS), dtype=np.uint8)
    next_state = rng.integers(0, 256, size=(STACK, *OBS), dtype=np.uint8)
    end = time.monotonic() + seconds
    sent = 0
    while sent < MIN_MESSAGES or time.monotonic() < end:  # as _zmq_sender: a rate even on a starved machine
        queue.put((state, 1, 0.5, next_state, False))
        sent += 1
    queue.put(sent)  # the end, with how many tuples came before it


def mpqueue_transport_tps(seconds: float = 2.0) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=1024)
    proc = ctx.Process(target=_mpqueue_sender, args=(queue, seconds), daemon=True)
    proc.start()
    count = sent = 0
    t_first = t_last = 0.0
    try:
        while True:
            try:
                item = queue.get(timeout=1)
            except queue_mod.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"bench sender exited with code {proc.exitcode}") from None
                continue
            now = time.perf_counter()
            if isinstance(item, int):
                sent = item
                break
            if count == 0:
                t_first = now
            count += 1
            t_last = now
    finally:
        proc.join(10)
    if count != sent:
        raise RuntimeError(f"bench receiver got {count} tuples of the {sent} the sender put")
    elapsed = max(t_last - t_first, 1e-9)
    return {"transitions": count - 1, "tuples": count, "seconds": elapsed, "transitions_per_s": (count - 1) / elapsed}


def collector_overhead(env_id: str | None = None, k: int = 8, steps: int = 100, warmup: int = 10) -> dict[str, Any]:
    """The real collector loop and link, sending to a drained local data socket; fraction = (loop - env) / env.

    No head is needed (collectors never import the head's code): the bench binds the two
    sockets a WELCOME would name, drains the data socket in a thread and never sends weights.
    """
    import threading

    import zmq

    from actors.client import HeadLink, Welcome
    from actors.collector import Collector
    from envs.factory import env_spec
    from shared.config import Config, EnvConfig
    from shared.weights import network_template

    if env_id is None:
        env_id = "SuperMarioBros-1-1-v0" if _mario_available() else "ApeXCounting-v0"
    cfg = Config()
    cfg = replace(cfg, env=EnvConfig(env_id=env_id), collectors=replace(cfg.collectors, count=1, envs_per_collector=k),
                  transport=replace(cfg.transport, head_timeout_s=3600.0))  # no head heartbeats in this bench
    ctx = zmq.Context()
    tmp = owned_tempdir()
    sink, weights = ctx.socket(zmq.DEALER), ctx.socket(zmq.PUB)
    sink.linger = weights.linger = 0
    sink.bind(f"ipc://{tmp}/data.ipc")
    weights.bind(f"ipc://{tmp}/weights.ipc")
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            if sink.poll(50):
                sink.recv_multipart(copy=False)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    welcome = Welcome(1, f"ipc://{tmp}/data.ipc", f"ipc://{tmp}/weights.ipc", 0.1, 1, 0, cfg)
    link = HeadLink(ctx, welcome, network_template(env_spec(welcome.config.env), welcome.config.learner))
    collector = Collector(cfg, welcome.collector_id, welcome.epsilons or welcome.epsilon, link)
    try:
        collector.run(max_steps=warmup)
        collector.timing = type(collector.timing)()
        collector.run(max_steps=steps)
        t = collector.timing
    finally:
        collector.close()
        link.close()
        stop.set()
        drainer.join(5)
        sink.close()
        weights.close()
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    env_ms = 1e3 * t.env_s / t.steps
    other_ms = 1e3 * (t.total_s - t.env_s) / t.steps
    return {"env_id": env_id, "k": k, "steps": t.steps, "env_ms_per_step": env_ms, "other_ms_per_step": other_ms,
            "infer_ms_per_step": 1e3 * t.infer_s / t.steps, "overhead_frac": t.overhead_frac,
            "env_ms_per_env_step": env_ms / k}


def _mario_available() -> bool:
    try:
        from envs.mario.emulator import import_mario_package

        import_mario_package()  # without old gym's import banner
    except Exception:  # noqa: BLE001 - any import failure means: bench on the counting env
        return False
    return True


def run_transport_bench(quick: bool = True) -> dict[str, Any]:
    """All figures `bench.driver` expects: transport_tps, mpqueue_transport_tps, collector_overhead_frac."""
    seconds = 2.0 if quick else 6.0
    ipc = transport_tps("ipc", seconds)
    tcp = transport_tps("tcp", seconds)
    naive = mpqueue_transport_tps(seconds)
    overhead = collector_overhead(steps=40 if quick else 200)
    best = max(ipc["transitions_per_s"], tcp["transitions_per_s"])
    return {
        "transport_tps": ipc["transitions_per_s"], "transport_tps_ipc": ipc["transitions_per_s"],
        "transport_tps_tcp": tcp["transitions_per_s"], "mpqueue_transport_tps": naive["transitions_per_s"],
        "transport_speedup": best / max(naive["transitions_per_s"], 1e-9),
        "collector_overhead_frac": overhead["overhead_frac"],
        "details": {"ipc": ipc, "tcp": tcp, "mpqueue": naive, "collector": overhead},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.transport", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    print(json.dumps(run_transport_bench(args.quick), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

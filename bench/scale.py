"""Scale simulation: 1 to 64 collectors feeding one head on this machine, ours against the naive design.

Real collectors cost a core each (the emulator), so a 2-core box cannot run 64 of them; what
it can run is 64 collectors' *traffic*. Synthetic collectors replay chunks recorded once from
the real Mario 1-1 env (bench/recorded.py: real frames, actions, rewards, priorities) at a set
rate per collector (RATE_PER_COLLECTOR transitions/s, one core's emulator rate) and cost almost
no CPU, so the head's side is what is measured.

Ours: each synthetic collector is a real client of the real head parts. It registers over the
head's control socket (actors.client.register: HELLO/WELCOME), owns its data socket, routing id
(the WELCOME's token), sequence numbers and credits (actors.client.HeadLink), and sends
TRANSITION_CHUNK messages through the Registrar + ConsolidationThread + ReplayBuffer +
WeightPublisher that launcher/head.py wires (here without the learner and the supervisor).
A few sender processes each own many collectors, every one with its own sockets.

Naive: the seed design in the same harness: each synthetic collector puts one transition
(4x84x84 state and next state stacks, as the seed's collector did) at a time on one shared
`multiprocessing.Queue` (pickled); the head's drain thread moves them into a locked `deque`
(bench/scale_naive.py).

In both heads a consumer thread stands in for a GPU learner: it samples batches of
SAMPLE_BATCH as fast as it can (ours: PER sample then update_priorities with new |td|; naive:
`random.sample` under the lock, then `np.stack`), timing each sample. Per collector count the
head reports what it ingested in a steady window, its CPU use and the sampling rate/latency.
The capacity ladder (CAPACITY_COLLECTORS collectors offering RATE_PER_COLLECTOR times each of
CAPACITY_STEPS, None = as fast as the design lets them; the consumer paced at SAMPLE_GOAL_PER_S,
the same sampling rate for both designs) gives each design's maximum sustainable ingest while the
learner is fed: the highest ingest of a step whose sampling held the goal (`head_capacity_tps`,
`naive_head_capacity_tps`). On a 2-core box the senders share the cores with the head, so the
ingest thread's CPU per transition is reported too: it is what a head with a core of its own for
ingest would be bound by.

    python -m bench.scale [--quick] [--out runs/bench/scale.json]
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.scale_consumer import PREFILL_TRANSITIONS, SAMPLE_BATCH, Consumer, measure_window
from bench.scale_naive import NAIVE_CAPACITY, NAIVE_QUEUE_MAX, naive_head, naive_senders
from bench.workers import WorkerGroup

RATE_PER_COLLECTOR = 120.0  # transitions/s: one core's measured emulator rate (BENCHMARKS.md, 1 collector)
FULL_COUNTS, QUICK_COUNTS = (1, 4, 16, 64), (1, 64)
FULL_WINDOW_S, QUICK_WINDOW_S = 8.0, 2.5
WARM_S = 1.0  # between the senders' start and the timed window: credits and sockets settle
SENDER_PROCESSES = 2  # each owns N / SENDER_PROCESSES collectors (one when N == 1)
SAMPLE_GOAL_PER_S = 100.0  # batches/s a GPU learner at ~100 updates/s would ask for
CAPACITY_COLLECTORS = 64
# x RATE_PER_COLLECTOR; 32 x 120/s x 64 collectors ~ 246k transitions/s, ~1.8 GB/s of frames through the sockets
FULL_CAPACITY_STEPS = (1.0, 2.0, 4.0, 8.0, 16.0, 20.0, 24.0, 32.0, None)
QUICK_CAPACITY_STEPS = (16.0, 20.0, 24.0, None)
KEEP_UP_FRAC = 0.95  # a row keeps up when it ingests this share of what was offered


# ---------------------------------------------------------------------- our head
def _our_head(cfg_dict: dict[str, Any], cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any) -> None:
    """The head's data plane (registration, consolidation, replay, weights heartbeat) and a consumer, on
    transport.bind (loopback) with CURVE when transport.curve_keys_dir names keys."""
    try:
        import torch
        import zmq

        from bench.recorded import load_chunks
        from envs.factory import env_spec
        from ingest.consolidation import ConsolidationThread
        from ingest.registration import MAX_SOCKETS, Registrar
        from learner.broadcast import WeightPublisher
        from replay.buffer import ReplayBuffer
        from shared.config import Config
        from shared.keys import load_server
        from shared.protocol import ObsSpec
        from shared.tempdirs import owned_tempdir

        torch.set_num_threads(1)
        cfg = Config.from_dict(cfg_dict)
        t = cfg.transport  # bind (loopback unless given) and CURVE keys (none unless given), as the real head's
        curve = load_server(t.curve_keys_dir) if t.curve_keys_dir else None
        env = env_spec(cfg.env)
        replay = ReplayBuffer.build(cfg.replay, env, torch.device("cpu"))
        chunks, _ = load_chunks()
        while replay.transitions_added < PREFILL_TRANSITIONS:  # before the consolidation thread: one writer
            for chunk in chunks:
                replay.add_chunk(chunk)
        spec = ObsSpec.of(env)
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
        ipc_dir = owned_tempdir()  # named after this process: removed by the next head if this bench is killed
        publisher = WeightPublisher([f"ipc://{ipc_dir}/weights.ipc", f"tcp://{t.bind}:0"], context=ctx,
                                    heartbeat_s=cfg.collectors.heartbeat_s, curve=curve)
        registrar = Registrar(spec, {"local": publisher.endpoints[0], "remote": publisher.endpoints[1]}, ctx,
                              transport=cfg.transport, collectors=cfg.collectors, replay=cfg.replay,
                              welcome_config=cfg.to_dict(), control_endpoint=f"tcp://{t.bind}:0",
                              num_collectors=CAPACITY_COLLECTORS)
        consolidation = ConsolidationThread(replay, spec, registrar, transport=cfg.transport,
                                            collectors=cfg.collectors, episode_window=cfg.logging.episode_window,
                                            latest_weight_version=lambda: publisher.version)
        consolidation.start()
        rng = np.random.default_rng(0)

        def sample_once() -> None:
            batch = replay.sample(SAMPLE_BATCH)
            replay.update_priorities(batch.indices, rng.random(SAMPLE_BATCH) * 2.0)  # the learner's new |td|

        consumer = Consumer(sample_once)
        consumer.start()
        ready_q.put(0)
        try:
            while (command := cmd_q.get()) is not None:
                kind = command[0]
                if kind == "endpoint":
                    result_q.put({"endpoint": consolidation.control_endpoint})
                elif kind == "measure":
                    _, seconds, pace = command
                    res = measure_window(consumer, lambda: consolidation.transitions, seconds, pace,
                                         consolidation.native_id)
                    st = consolidation.stats()
                    result_q.put({**res, "open_registrations": len(st.collectors), "rejected": st.rejected,
                                  "rejected_by_reason": st.rejected_by_reason, "gaps": st.gaps,
                                  "replay_len": len(replay)})
                elif kind == "settle":  # until every collector of the last row has left
                    deadline = time.monotonic() + 15.0
                    while consolidation.stats().collectors and time.monotonic() < deadline:
                        time.sleep(0.05)
                    result_q.put({"open_registrations": len(consolidation.stats().collectors)})
        finally:
            consumer.stop_event.set()
            consumer.join(5.0)
            consolidation.stop()
            publisher.close()
            ctx.term()
            import shutil

            shutil.rmtree(ipc_dir, ignore_errors=True)
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which raises it
        result_q.put({"error": f"{type(exc).__name__}: {exc}"})


# ---------------------------------------------------------------------- our synthetic collectors
def _our_senders(index: int, cfg_dict: dict[str, Any], cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any) -> None:
    """Per command ("run", endpoint, k, rate, start_at, seconds): k collectors of the real protocol.

    Each registers (HELLO/WELCOME), owns a HeadLink (data DEALER with its token, weights SUB,
    sequence numbers, credits) and sends recorded chunks every chunk_transitions / rate seconds
    (rate None: whenever credits and the socket allow). One poller serves all k: credits and
    head heartbeats are read as they arrive, so no collector blocks another.
    """
    try:
        import torch
        import zmq

        from actors.client import HeadLink, register
        from bench.recorded import load_chunks
        from envs.factory import env_spec
        from shared.config import Config
        from shared.keys import load_client
        from shared.network import build_q_network
        from shared.protocol import BYE, encode_simple, send_parts

        torch.set_num_threads(1)
        cfg = Config.from_dict(cfg_dict)
        keys = cfg.transport.curve_keys_dir  # the head's keys: its collectors' shared pair (shared/keys.py)
        curve = load_client(keys) if keys else None
        spec = env_spec(cfg.env)
        template = build_q_network(spec.obs_shape, spec.stack, spec.num_actions, cfg.learner.hidden,
                                   cfg.learner.dueling).state_dict()
        chunks, counts = load_chunks()
        ctx = zmq.Context()
        ready_q.put(index)
        while (command := cmd_q.get()) is not None:
            _, endpoint, k, rate, start_at, seconds = command
            links = []
            for _ in range(k):
                welcome = register(ctx, endpoint, slot=-1, curve=curve, timeout_s=30.0, envs=1)
                links.append(HeadLink(ctx, welcome, template, curve=curve))
            result_q.put({"index": index, "registered": k})
            sent = [0] * k
            blocked = 0
            poller = zmq.Poller()
            owner: dict[Any, HeadLink] = {}
            for link in links:
                for sock in (link.data, link.sub):
                    poller.register(sock, zmq.POLLIN)
                    owner[sock] = link
            while time.time() < start_at:  # every process starts its collectors at the same moment
                time.sleep(0.005)
            now = time.monotonic()
            end = now + seconds  # from this process's start: a late registration shifts, never shortens, it
            # (due time, collector): staggered so k collectors do not send in lock step
            due = [(now + (j / max(1, k)) * (counts[0] / rate if rate else 0.0), j) for j in range(k)]
            heapq.heapify(due)
            cursor = [(index * 7919 + j * 13) % len(chunks) for j in range(k)]
            next_beat = now
            while now < end:
                wait_s = max(0.0, due[0][0] - now) if due else 0.05
                for sock, _ in poller.poll(min(50.0, wait_s * 1000.0)):
                    owner[sock].poll_head()  # CREDITs, head heartbeats
                now = time.monotonic()
                held: list[tuple[float, int]] = []
                while due and due[0][0] <= now:
                    t_due, j = heapq.heappop(due)
                    link = links[j]
                    in_flight_ok = not link.max_chunks_in_flight or len(link.unacked_chunks) < link.max_chunks_in_flight
                    if not (in_flight_ok and link.data.poll(0, zmq.POLLOUT)):
                        held.append((t_due, j))  # the head holds it back (credits): it falls behind
                        blocked += 1
                        continue
                    chunk = chunks[cursor[j]]
                    link.send_chunk(chunk)
                    sent[j] += counts[cursor[j]]
                    cursor[j] = (cursor[j] + 1) % len(chunks)
                    period = counts[cursor[j]] / rate if rate else 0.0
                    heapq.heappush(due, (max(t_due + period, now - 2 * period), j))  # at most 2 periods of catch-up
                for item in held:
                    heapq.heappush(due, item)
                if held and (not due or due[0][0] <= now):
                    poller.poll(1)  # wait for a credit instead of spinning
                if now >= next_beat:
                    next_beat = now + 0.25
                    for link in links:
                        link.maybe_heartbeat()
                now = time.monotonic()
            for link in links:  # leave as a collector does: BYE, the head reclaims the registration
                send_parts(link.data, encode_simple(BYE, link.collector_id, link.seq + 1))
                link.data.close(linger=1000)
                link.sub.close(linger=0)
            result_q.put({"index": index, "sent_transitions": sum(sent), "held_back": blocked, "seconds": seconds})
        ctx.term()
    except Exception as exc:  # noqa: BLE001
        result_q.put({"error": f"{type(exc).__name__}: {exc}"})


# ---------------------------------------------------------------------- the harness
def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def whole_periods(window_s: float, rate: float | None, quantum: float) -> float:
    """The window stretched or shrunk to a whole number (>= 1) of one collector's send periods.

    A collector delivers `quantum` transitions at a time, every quantum / rate seconds. A window of
    whole periods holds exactly as many deliveries from each collector as the rate promises; any
    other length reads 1 collector's 120/s as 112/s in 8 s (7 of 7.5 chunks of 128), a shortfall
    of the count, not of the head."""
    if not rate:
        return window_s
    period = quantum / rate
    return max(1, round(window_s / period)) * period


def _row(head: WorkerGroup, senders: WorkerGroup, endpoint: str | None, n: int, rate: float | None,
         window_s: float, pace: float | None, quantum: float) -> dict[str, Any]:
    """One collector count: register, send for WARM_S + window, measure the window in the head."""
    window_s = whole_periods(window_s, rate, quantum)
    shares = [k for k in _split(n, min(n, len(senders.procs)))]
    active = list(range(len(shares)))
    start_at = time.time() + 0.5 + 0.02 * n  # registration of every collector fits before the start
    run_s = WARM_S + window_s + 1.0  # outlasts the head's window (which adds a 0.2 s settle)
    for i in active:
        senders.send([i], ("run", endpoint, shares[i], rate, start_at, run_s))
    senders.results(len(active), key="registered")  # every sender has started by max(start_at, now)
    delay = max(start_at, time.time()) + WARM_S - time.time()
    if delay > 0:
        time.sleep(delay)
    head.send([0], ("measure", window_s, pace))
    res = head.results(1)[0]
    sent = senders.results(len(active), key="held_back")
    head.send([0], ("settle",))
    head.results(1)
    offered = n * rate if rate else None
    return {
        "collectors": n, "offered_tps": offered, **{k: v for k, v in res.items() if k != "index"},
        "behind_frac": (1.0 - res["ingested_tps"] / offered) if offered else None,
        "keeps_up": (res["ingested_tps"] >= KEEP_UP_FRAC * offered) if offered else None,
        "sender_held_back": sum(s["held_back"] for s in sent),
        "sender_sent_transitions": sum(s["sent_transitions"] for s in sent),
        "sender_processes": len(active),
    }


def run_design(design: str, cfg: Any, counts: tuple[int, ...], window_s: float,
               steps: tuple[float | None, ...], rate: float = RATE_PER_COLLECTOR) -> dict[str, Any]:
    """Rows per collector count at `rate` each, then the capacity ladder; one head, one sender pool."""
    import multiprocessing as mp

    cfg_dict = cfg.to_dict()
    if design == "ours":
        head_args, sender_args, data_q = [(cfg_dict,)], [(i, cfg_dict) for i in range(SENDER_PROCESSES)], None
        head_target, sender_target = _our_head, _our_senders
    else:
        data_q = mp.get_context("spawn").Queue(maxsize=NAIVE_QUEUE_MAX)
        head_args, sender_args = [(data_q,)], [(i, data_q) for i in range(SENDER_PROCESSES)]
        head_target, sender_target = naive_head, naive_senders
    out: dict[str, Any] = {"design": design, "rows": []}
    quantum = _chunk_transitions() if design == "ours" else 1.0  # what one send delivers (naive: one transition)
    with WorkerGroup(head_target, head_args, data_queue=None) as head, \
            WorkerGroup(sender_target, sender_args, data_queue=data_q) as senders:
        endpoint = None
        if design == "ours":
            head.send([0], ("endpoint",))
            endpoint = head.results(1)[0]["endpoint"]
        for n in counts:
            out["rows"].append({"design": design, **_row(head, senders, endpoint, n, rate, window_s, None, quantum)})
        out["capacity"] = [
            {"design": design, "rate_multiple": m,
             **_row(head, senders, endpoint, CAPACITY_COLLECTORS, rate * m if m else None, window_s, SAMPLE_GOAL_PER_S,
                    quantum)}
            for m in steps]
        out["startup_s"] = head.startup_s + senders.startup_s
    return out


def capacity_tps(ladder: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """The highest ingest of a ladder step whose sampling held the goal (0.95 x SAMPLE_GOAL_PER_S:
    the paced consumer's own jitter), or None with the reason when no step did."""
    held = [r["ingested_tps"] for r in ladder if r.get("ingested_tps") is not None
            and (r.get("sample_batches_per_s") or 0.0) >= 0.95 * SAMPLE_GOAL_PER_S]
    if held:
        return float(max(held)), None
    seen = ", ".join(f"{r.get('ingested_tps') or 0:,.0f}/s at {r.get('sample_batches_per_s') or 0:.0f} batches/s"
                     for r in ladder)
    return None, f"no capacity step kept sampling at {SAMPLE_GOAL_PER_S:.0f} batches/s ({seen})"


def ingest_cpu_us(ladder: list[dict[str, Any]]) -> float | None:
    """Ingest thread CPU microseconds per transition at the busiest step (what one core of ingest buys)."""
    rows = [r for r in ladder if r.get("ingest_thread_cpu_frac") and r.get("ingested_tps")]
    if not rows:
        return None
    top = max(rows, key=lambda r: r["ingested_tps"])
    return 1e6 * top["ingest_thread_cpu_frac"] / top["ingested_tps"]


@functools.cache  # run_scale asks once per design and once for the report: one read of the file
def _chunk_transitions() -> float:
    """Mean complete transitions per recorded chunk (the profiles' chunk_steps, less episode ends)."""
    from bench.recorded import load_chunks

    return float(np.mean(load_chunks()[1]))


def run_scale(cfg: Any, quick: bool, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Both designs, then the figures the report needs and the PNG beside the JSON."""
    counts = QUICK_COUNTS if quick else FULL_COUNTS
    window = QUICK_WINDOW_S if quick else FULL_WINDOW_S
    steps = QUICK_CAPACITY_STEPS if quick else FULL_CAPACITY_STEPS
    ours = run_design("ours", cfg, counts, window, steps)
    naive = run_design("naive", cfg, counts, window, steps)
    head_cap, head_why = capacity_tps(ours["capacity"])
    naive_cap, naive_why = capacity_tps(naive["capacity"])
    keys = ("collectors", "offered_tps", "ingested_tps", "head_cpu_frac", "sample_batches_per_s",
            "sample_p50_ms", "sample_p99_ms")
    rows = [{"design": r["design"], **{k: r.get(k) for k in keys}} for r in ours["rows"] + naive["rows"]]
    result: dict[str, Any] = {
        "scale": rows, "head_capacity_tps": head_cap, "naive_head_capacity_tps": naive_cap,
        "ingest_cpu_us_per_transition": {"ours": ingest_cpu_us(ours["capacity"]),
                                         "naive": ingest_cpu_us(naive["capacity"])},
        "errors": {k: v for k, v in (("head_capacity_tps", head_why), ("naive_head_capacity_tps", naive_why)) if v},
        "details": {"ours": ours, "naive": naive, "rate_per_collector": RATE_PER_COLLECTOR, "window_s": window,
                    "sample_batch": SAMPLE_BATCH, "sample_goal_per_s": SAMPLE_GOAL_PER_S,
                    "capacity_collectors": CAPACITY_COLLECTORS, "naive_deque_len": NAIVE_CAPACITY,
                    "replay_capacity": cfg.replay.capacity, "chunk_transitions": _chunk_transitions()},
    }
    if out_dir is not None:
        try:
            result["plot"] = str(plot_scale(rows, Path(out_dir) / "scale.png", head_cap, naive_cap,
                                            ours["capacity"] + naive["capacity"]))
        except Exception as exc:  # noqa: BLE001 - a missing plotting backend must not lose the figures
            result["errors"]["scale_plot"] = f"{type(exc).__name__}: {exc}"
    return result


def plot_scale(rows: list[dict[str, Any]], path: Path, head_cap: float | None, naive_cap: float | None,
               ladder: list[dict[str, Any]] | None = None) -> Path:
    """Left: ingest vs collector count for both designs (log-log) with the offered rate and the
    capacities. Right (when given): the capacity ladder, ingest and sampling rate vs offered rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if ladder else 1, figsize=(11.5 if ladder else 6.4, 4.2), dpi=110, squeeze=False)
    ax = axes[0][0]
    for design, style, cap in (("ours", "o-", head_cap), ("naive", "s--", naive_cap)):
        pts = [(r["collectors"], r["ingested_tps"]) for r in rows if r["design"] == design and r["ingested_tps"]]
        if pts:
            line = ax.plot(*zip(*pts, strict=True), style, label=f"{design}: ingested")[0]
            if cap:
                ax.axhline(cap, color=line.get_color(), ls=":", lw=1, label=f"{design}: capacity {cap:,.0f}/s")
    offered = sorted({(r["collectors"], r["offered_tps"]) for r in rows if r["offered_tps"]})
    if offered:
        ax.plot(*zip(*offered, strict=True), "k:", lw=1, label=f"offered ({RATE_PER_COLLECTOR:.0f}/s per collector)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("collectors")
    ax.set_ylabel("transitions/s into replay")
    ax.set_title(f"One head, consumer sampling batches of {SAMPLE_BATCH}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    if ladder:
        ax = axes[0][1]
        twin = ax.twinx()
        top = max((r["ingested_tps"] or 0.0) for r in ladder)
        for design, style in (("ours", "o-"), ("naive", "s--")):
            steps = [r for r in ladder if r["design"] == design]
            xs = [r["offered_tps"] or 1.3 * max((q["offered_tps"] or 0.0) for q in ladder) for r in steps]
            line = ax.plot(xs, [r["ingested_tps"] for r in steps], style, label=f"{design}: ingested")[0]
            twin.plot(xs, [r["sample_batches_per_s"] for r in steps], style, color=line.get_color(), alpha=0.4,
                      label=f"{design}: batches/s")
        twin.axhline(SAMPLE_GOAL_PER_S, color="grey", ls=":", lw=1)
        twin.set_ylabel(f"sampled batches/s (paced at {SAMPLE_GOAL_PER_S:.0f})")
        twin.set_ylim(0, 1.5 * SAMPLE_GOAL_PER_S)
        ax.set_ylim(0, 1.1 * top)
        ax.set_xlabel(f"offered transitions/s, {CAPACITY_COLLECTORS} collectors (rightmost: as fast as allowed)")
        ax.set_ylabel("transitions/s into replay")
        ax.set_title("Capacity ladder")
        ax.legend(loc="upper left", fontsize=8)
        twin.legend(loc="lower right", fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--profile", default="auto")
    p.add_argument("--out", default="runs/bench/scale.json")
    args = p.parse_args(argv)
    from config_optimized import load_profile

    cfg = load_profile(args.profile, [])
    result = run_scale(cfg, args.quick, Path(args.out).parent)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


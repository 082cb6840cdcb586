"""Report plumbing for `make bench`: machine facts, the JSON file, the printed table.

Kept apart from the measuring code so it can be tested in milliseconds with made-up figures,
and so the rule "a figure that was not measured is null, with its reason in `errors`" is
enforced in exactly one place (`assemble_report`) instead of at every call site.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from shared.sizes import meminfo

# Every key the JSON must carry at top level, in the order the table prints them. A key that a
# run could not measure is still present (null) and has an entry in report["errors"].
HEADLINE_KEYS: tuple[str, ...] = (
    "quick",
    "emulator_ceiling_sps",
    "project_env_sps",
    "naive_pipeline_sps",
    "naive_drain_sps",
    "pipeline_sps",
    "training_sps",
    "pipeline_efficiency",
    "pipeline_env_efficiency",
    "cpu_efficiency",
    "cpu_efficiency_training",
    "cpu_s_per_1k_steps",
    "train_pair",
    "scale",
    "head_capacity_tps",
    "naive_head_capacity_tps",
    "ingest_cpu_us_per_transition",
    "replay_insert_tps",
    "replay_insert_single_chunk_tps",
    "insert_copy_floor_tps",
    "insert_vs_copy_floor",
    "replay_sample32_ms",
    "replay_sample512_ms",
    "naive_replay_sample512_ms",
    "copy_floor_sample512_ms",
    "sample512_vs_copy_floor",
    "torchrl_sample512_ms",
    "bytes_per_transition",
    "naive_bytes_per_transition",
    "transport_tps",
    "mpqueue_transport_tps",
    "collector_overhead_frac",
    "learner_updates_per_s",
    "learner_updates_per_s_by_threads",
    "learner_host_cpu_ms_per_update",
    "learner_host_launch_ms_per_update",
    "learner_device_busy_frac",
    "learner_wait_frac",
)

# What each headline figure means, printed as the table's last column (units included).
DESCRIPTIONS: dict[str, str] = {
    "emulator_ceiling_sps": "raw emulator agent steps/s, all collectors, no learning (median over the interleaved repeats)",
    "project_env_sps": "env factory env (what collectors step), random actions, no learning",
    "naive_pipeline_sps": "seed design: mp.Queue + deque replay, training (transitions/s)",
    "naive_drain_sps": "seed design, learner only drains (transitions/s)",
    "pipeline_sps": "our pipeline, learner drains only (env steps/s)",
    "training_sps": "our pipeline, learner training (env steps/s)",
    "quick": "--quick: a smoke test (short windows); headline figures come from full runs",
    "pipeline_efficiency": "pipeline_sps / emulator_ceiling_sps per interleaved repeat: median (min-max)",
    "pipeline_env_efficiency": "pipeline_sps / project_env_sps",
    "cpu_efficiency": "project env CPU per step / pipeline (draining) CPU per step, all processes: median (min-max)",
    "cpu_efficiency_training": "project env CPU per step / pipeline (training) CPU per step (the learner's CPU included)",
    "cpu_s_per_1k_steps": "CPU seconds (user+sys, every process of the design) per 1,000 env steps, median by phase",
    "train_pair": "training, like for like (same batch, precision, no replay ratio): env steps/s and updates/s",
    "scale": "scale sim: per design and collector count (table below; plot scale.png beside the JSON)",
    "head_capacity_tps": "scale sim: most transitions/s one head ingested while sampling >= 100 batches of 512/s",
    "naive_head_capacity_tps": "the same for the naive design (mp.Queue of pickled transitions, locked deque)",
    "ingest_cpu_us_per_transition": "scale sim: head ingest thread CPU per transition (us) at its busiest step",
    "replay_insert_tps": "replay inserts as the head makes them, insert_batch_chunks chunks per call (transitions/s)",
    "replay_insert_single_chunk_tps": "replay inserts, one chunk per call (transitions/s)",
    "insert_copy_floor_tps": "plain copy of the same frames into a ring (transitions/s): the insert floor",
    "insert_vs_copy_floor": "replay_insert_tps / insert_copy_floor_tps (goal >= 0.8)",
    "sample512_vs_copy_floor": "replay_sample512_ms / copy_floor_sample512_ms (goal <= 1.3)",
    "replay_sample32_ms": "replay sample, batch 32 (ms)",
    "replay_sample512_ms": "replay sample, batch 512 (ms)",
    "naive_replay_sample512_ms": "deque + random.sample + np.stack, batch 512 (ms)",
    "copy_floor_sample512_ms": "memcpy floor for a 512 batch (ms)",
    "torchrl_sample512_ms": "torchrl replay sample, batch 512 (ms)",
    "bytes_per_transition": "replay bytes per transition",
    "naive_bytes_per_transition": "deque replay bytes per transition",
    "transport_tps": "ZeroMQ transport (transitions/s)",
    "mpqueue_transport_tps": "multiprocessing.Queue transport (transitions/s)",
    "collector_overhead_frac": "collector time not spent in the emulator (fraction)",
    "learner_updates_per_s": "learner updates/s by mode (bench.learner's; {eager,device,captured}_PRECISION_bBATCH: "
                             "learner.step_mode side by side, bench.learner_step)",
    "learner_updates_per_s_by_threads": "CPU learner updates/s at batch 32 by PRECISION_tTHREADS (torch threads it can "
                                         "measure here, interleaved; what `auto` splits a CPU-only machine's cores by)",
    "learner_host_cpu_ms_per_update": "process CPU ms per update by step mode, batch and precision (on a CPU: all of it)",
    "learner_host_launch_ms_per_update": "process CPU ms per update to enqueue updates onto an idle GPU: the host's own "
                                         "work, without spin-waiting on the GPU (CUDA only)",
    "learner_device_busy_frac": "GPU kernel time / wall time while the learner updates, by step mode (CUDA only)",
    "learner_wait_frac": "share of the learner loop waiting for data (eager: the prefetch queue; device: ring drains)",
}

# Derived figures: (key, numerator, denominator), computed here so they can never disagree with their inputs.
RATIOS: tuple[tuple[str, str, str], ...] = (
    ("pipeline_efficiency", "pipeline_sps", "emulator_ceiling_sps"),
    ("pipeline_env_efficiency", "pipeline_sps", "project_env_sps"),
    ("insert_vs_copy_floor", "replay_insert_tps", "insert_copy_floor_tps"),
    ("sample512_vs_copy_floor", "replay_sample512_ms", "copy_floor_sample512_ms"),
)

# Figures that are {median, min, max, values} over repeats, and the physical limit none can pass:
# an efficiency above 1.0 means the pipeline beat the emulator it runs on, i.e. the machine's
# drift between the two windows, so it is flagged as noise instead of reported as a result.
SPREAD_KEYS: tuple[str, ...] = ("pipeline_efficiency", "cpu_efficiency", "cpu_efficiency_training")
PHYSICAL_LIMIT = 1.0

_PACKAGES = ("torch", "numpy", "nes-py", "gym-super-mario-bros", "gym", "gymnasium", "pyzmq")


def machine_facts(argv: list[str] | None = None) -> dict[str, Any]:
    """Where the figures came from: ratios only compare within one machine and one sitting."""
    facts: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_bytes": meminfo("MemTotal"),
        "memory_available_bytes": meminfo("MemAvailable"),
        "gpu": _gpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in _PACKAGES},
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,  # other load skews ratios
        "command": shlex.join([sys.executable, "-m", "bench.driver", *(sys.argv[1:] if argv is None else argv)]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return facts


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo, else platform.processor()), None when neither says."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpu_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the bench
        return None
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def assemble_report(
    figures: dict[str, Any],
    errors: dict[str, str],
    *,
    sweep: list[dict[str, Any]] | None = None,
    details: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    facts: dict[str, Any] | None = None,
    quick: bool | None = None,
) -> dict[str, Any]:
    """Merge measured figures into one report; every headline key exists, null ones explained.

    A null figure without a recorded reason gets "not measured in this run" so a reader never
    has to guess whether a missing number was skipped, failed or forgotten.
    """
    errors = dict(errors)
    figures = dict(figures)
    if quick is not None:
        figures["quick"] = bool(quick)
    report: dict[str, Any] = {}
    for key in HEADLINE_KEYS:
        value = figures.get(key)
        report[key] = value
        if value is None and key not in errors:
            errors[key] = "not measured in this run"
    for key, value in figures.items():
        report.setdefault(key, value)
    for key, num, den in RATIOS:
        if report.get(key) is not None:
            continue
        if report.get(den) and report.get(num) is not None:
            ratio = report[num] / report[den]
            report[key] = {"median": ratio, "min": ratio, "max": ratio, "values": [ratio]} if key in SPREAD_KEYS else ratio
            errors.pop(key, None)
        elif errors.get(key) == "not measured in this run":
            errors[key] = "needs " + " and ".join(k for k in (num, den) if not report.get(k))
    for key in SPREAD_KEYS:
        flag_noise(report, errors, key)
    report["bounds"] = bounds(report)
    report["sweep"] = list(sweep or [])
    report["details"] = dict(details or {})
    report["settings"] = dict(settings or {})
    report["machine"] = dict(facts or {})
    report["errors"] = errors
    return report


def bounds(report: dict[str, Any]) -> dict[str, str]:
    """Per phase, what bounds it, read off this run's own figures (a phase without them is left out)."""
    out: dict[str, str] = {}
    cpu = report.get("cpu_s_per_1k_steps") or {}
    eff = (report.get("cpu_efficiency") or {}).get("median")
    if cpu.get("project_env") and cpu.get("pipeline") and eff:
        out["pipeline"] = (f"the emulator: {cpu['project_env']:.2f} of the pipeline's {cpu['pipeline']:.2f} CPU s per "
                           f"1,000 steps are env stepping (cpu_efficiency {eff:.2f}); the rest is inference, "
                           "transport and the head")
    pair = report.get("train_pair") or {}
    if pair.get("ours_ups") and cpu.get("training"):
        out["training"] = (f"the cores: collectors and learner share them ({pair['ours_ups']:.1f} updates/s beside "
                           f"{pair.get('ours_sps') or 0:.0f} env steps/s; {cpu['training']:.2f} CPU s per 1,000 steps)")
    if report.get("insert_vs_copy_floor") is not None:
        out["replay_insert"] = (f"{report['insert_vs_copy_floor']:.2f} x the plain-copy floor: the rest is per-chunk "
                                "validation, n-step targets and segment planning (numpy calls per chunk)")
    if report.get("sample512_vs_copy_floor") is not None:
        out["replay_sample512"] = (f"{report['sample512_vs_copy_floor']:.2f} x the copy floor: the gather of "
                                   "2 x 512 stacks plus the sum-tree descent")
    us = report.get("ingest_cpu_us_per_transition") or {}
    if us.get("ours"):
        out["head_ingest"] = (f"{us['ours']:.1f} us of ingest-thread CPU per transition (~{1e6 / us['ours']:,.0f}/s per "
                              "core); on 2 cores the synthetic senders and the sampler share the cores with it")
    if us.get("naive"):
        out["naive_ingest"] = (f"{us['naive']:.1f} us of drain-thread CPU per transition (unpickling 2 stacks each), "
                               "and the deque's lock and GIL shared with random.sample + np.stack")
    return out


def flag_noise(report: dict[str, Any], errors: dict[str, str], key: str) -> None:
    """Mark repeats above PHYSICAL_LIMIT as noise; a median above it is no result (null, reason in errors)."""
    value = report.get(key)
    if not isinstance(value, dict):
        return
    over = [v for v in value.get("values", []) if v > PHYSICAL_LIMIT]
    if not over:
        return
    value["noise"] = over
    if value.get("median") is not None and value["median"] > PHYSICAL_LIMIT:
        errors[key] = (f"noise: median {value['median']:.3g} is above the physical limit {PHYSICAL_LIMIT:g} "
                       f"(repeats {', '.join(f'{v:.3g}' for v in value['values'])}): the machine drifted between windows")
        value["median"] = None
    else:
        errors.setdefault(f"{key}.noise", f"{len(over)} of {len(value['values'])} repeats above "
                                          f"{PHYSICAL_LIMIT:g} ({', '.join(f'{v:.3g}' for v in over)}): noise, not results")


def print_json(result: dict[str, Any], out: str | os.PathLike[str] | None = None) -> None:
    """A component bench's result: JSON on stdout, and the same text in `out` when given."""
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def write_report(report: dict[str, Any], out: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write `out` (latest) and a timestamped copy beside it; return both paths.

    The copy keeps history for BENCHMARKS.md without anyone having to remember to archive.
    """
    latest = Path(out)
    latest.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stamped = latest.with_name(f"{latest.stem}-{stamp}{latest.suffix or '.json'}")
    if latest.stem == "latest":
        stamped = latest.with_name(f"bench-{stamp}{latest.suffix or '.json'}")
    text = json.dumps(report, indent=2, sort_keys=False, default=_json_default) + "\n"
    for path in (stamped, latest):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: a reader never sees half a report
    return latest, stamped


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def format_value(value: Any) -> str:
    """Human-sized numbers: 3 significant figures, thousands grouped, dicts inline."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items())
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "nan"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return f"{value:.3g}"
    return str(value)


def format_table(report: dict[str, Any], markdown: bool = False) -> str:
    """The headline table, then the sweep, then errors; Markdown pastes into BENCHMARKS.md."""
    errors: dict[str, str] = report.get("errors", {})
    rows: list[tuple[str, ...]] = []
    for key in HEADLINE_KEYS:
        value = report.get(key)
        if isinstance(value, list):  # the scale rows: their own table below
            rows.append((key, f"{len(value)} rows", DESCRIPTIONS.get(key, "")))
        elif isinstance(value, dict) and "median" in value:  # repeats: median (min-max), noise named
            rows.append((key, format_spread(value), DESCRIPTIONS.get(key, "") if value.get("median") is not None
                         else errors.get(key, "")))
        elif isinstance(value, dict):  # by-mode figures: one row per mode keeps the table narrow
            rows.append((key, "", DESCRIPTIONS.get(key, "")))
            rows += [(f"{key}.{mode}", format_value(v), "") for mode, v in value.items()]
        else:
            rows.append((key, format_value(value), DESCRIPTIONS.get(key, "") if value is not None else errors.get(key, "")))
    out = [_table(("figure", "value", "meaning / why missing"), rows, markdown)]
    scale = report.get("scale") or []
    if isinstance(scale, list) and scale:
        cols = ("design", "collectors", "offered_tps", "ingested_tps", "head_cpu_frac", "sample_batches_per_s",
                "sample_p50_ms", "sample_p99_ms")
        out.append(_table(cols, [tuple(format_value(row.get(c)) for c in cols) for row in scale], markdown))
    sweep = report.get("sweep") or []
    if sweep:
        cols = ("collectors", "emulator_ceiling_sps", "pipeline_sps", "pipeline_efficiency")
        sweep_rows = [tuple(format_value(row.get(c)) for c in cols) for row in sweep]
        out.append(_table(cols, sweep_rows, markdown))
    other = {k: v for k, v in errors.items() if k not in HEADLINE_KEYS}
    if other:
        out.append(_table(("part", "error"), [(k, v) for k, v in other.items()], markdown))
    machine = report.get("machine") or {}
    if machine:
        out.append(
            f"machine: {machine.get('cores')} cores, {machine.get('cpu_model') or 'unknown CPU'}, "
            f"{format_value((machine.get('memory_bytes') or 0) / 2**30)} GiB, GPU {machine.get('gpu') or 'none'}"
            + (f", load average {machine['load_average'][0]:.1f} at the end" if machine.get("load_average") else "")
        )
    return "\n\n".join(out)


def format_spread(value: dict[str, Any]) -> str:
    """'0.891 (0.85-0.93)'; repeats above the physical limit are named as noise, never as the result."""
    lo, hi, mid = value.get("min"), value.get("max"), value.get("median")
    text = f"{format_value(mid)} ({format_value(lo)}-{format_value(hi)})" if mid is not None else \
        f"noise ({format_value(lo)}-{format_value(hi)})"
    if value.get("noise") and mid is not None:
        text += f", noise: {', '.join(format_value(v) for v in value['noise'])}"
    return text


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], markdown: bool) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    if markdown:
        esc = lambda s: s.replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(esc(c) for c in cells[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in cells[1:]])

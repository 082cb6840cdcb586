"""The component benches `make bench` calls (replay, transport, learner): (module, function) pairs in bench/,
each `function(quick) -> dict` of the keys listed beside it, called in the driver's process."""

from __future__ import annotations

import importlib
from typing import Any

# Component benches owned by other modules: (candidate (module, function) pairs, keys they report).
COMPONENTS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "replay": (
        (("bench.replay_bench", "run_replay_bench"),),
        ("replay_insert_tps", "replay_sample32_ms", "replay_sample512_ms", "naive_replay_sample512_ms",
         "copy_floor_sample512_ms", "bytes_per_transition", "naive_bytes_per_transition", "torchrl_sample512_ms",
         "insert_copy_floor_tps", "replay_insert_single_chunk_tps", "insert_batch_chunks",
         "insert_vs_copy_floor_rounds"),
    ),
    "transport": (  # the data socket and the collector's own costs (its senders are spawned processes)
        (("bench.transport", "run_transport_bench"),),
        ("transport_tps", "mpqueue_transport_tps", "collector_overhead_frac"),
    ),
    "learner": ((("bench.learner", "run_learner_bench"),), ("learner_updates_per_s", "learner_updates_per_s_by_threads")),
    # its learner_updates_per_s entries (by step mode, precision and batch) join bench.learner's
    "learner_step": ((("bench.learner_step", "run_step_bench"),),
                     ("learner_updates_per_s", "learner_host_cpu_ms_per_update", "learner_host_launch_ms_per_update",
                      "learner_device_busy_frac", "learner_wait_frac")),
}


def null_hint(key: str) -> str:
    """A checked (not guessed) reason for a null component figure, where one is known."""
    import importlib.util

    if key.startswith("torchrl") and importlib.util.find_spec("torchrl") is None:
        return " (torchrl is not installed)"
    return " (no reason given)"


def call_component(candidates: tuple[tuple[str, str], ...], quick: bool) -> dict[str, Any]:
    """Call the component's bench(quick): the first candidate whose module imports."""
    missing = []
    for module_name, func_name in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                missing.append(module_name)
                continue
            raise
        fn = getattr(module, func_name, None)
        if fn is None:
            missing.append(f"{module_name}.{func_name}")
            continue
        result = fn(quick)
        if not isinstance(result, dict):
            raise TypeError(f"{module_name}.{func_name} returned {type(result).__name__}, expected dict")
        return {**result, "source": f"{module_name}.{func_name}"}
    raise ImportError(f"not available: {', '.join(missing)}")

"""`auto` on a CPU-only machine: the split of its cores between collectors and learner threads (shared/cpu_split.py)
holds the per-env-step rule's ratio with neither side waiting, keeps this 2-core VM's measured recipe, and says
what it projected."""

import math

import pytest

import config_optimized
from config_optimized import RULE_BATCH, RULE_SAMPLES_PER_INSERT, load_config, load_profile
from launcher.cli import profile_note
from shared.cpu_split import (
    ENV_STEP_CPU_MS,
    MAX_LEARNER_THREADS,
    MEASURED_UPDATES_PER_S,
    CpuCosts,
    measured_costs,
    projected_updates_per_s,
    split_cpu,
)

pytestmark = pytest.mark.envonly  # arithmetic and configs: no torch needed

RATIO = RULE_SAMPLES_PER_INSERT / RULE_BATCH
PER_CORE = 1000.0 / ENV_STEP_CPU_MS["nes-py"]


def test_the_rule_is_a_quarter_update_per_env_step():
    assert RATIO == pytest.approx(0.25)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("cores", [1, 2])
def test_two_cores_keep_the_measured_recipe(cores, precision):
    split = split_cpu(measured_costs(cores, precision, RATIO))
    assert (split.collectors, split.learner_threads) == (cores, 0)  # what auto chose before: the learner's own rule
    assert split.env_steps_per_s == pytest.approx(MEASURED_UPDATES_PER_S[precision][1] / RATIO)
    assert "2-core recipe" in split.reason


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("cores", [4, 8, 16, 64])
def test_neither_side_waits_at_the_ratio(cores, precision):
    costs = measured_costs(cores, precision, RATIO)
    split = split_cpu(costs)
    ups, projected = projected_updates_per_s(costs, split.learner_threads)
    assert projected and "projected" in split.reason  # only 1 thread is measured: every other count is projected
    # the learner runs at its rate and that rate holds the ratio at the collectors' rate
    assert split.updates_per_s == pytest.approx(ups)
    assert split.env_steps_per_s == pytest.approx(ups / RATIO)
    # the collectors can supply it, on the cores the learner leaves them
    assert split.collectors * PER_CORE >= split.env_steps_per_s
    assert split.learner_threads + split.env_steps_per_s / PER_CORE <= cores
    assert split.collectors >= 2  # the recipe's two-collector epsilon spread
    assert 1 <= split.learner_threads <= min(MAX_LEARNER_THREADS, cores - 1)
    # faster than the old split (cores - 1 collectors, one learner thread at its measured rate)
    assert split.env_steps_per_s > MEASURED_UPDATES_PER_S[precision][1] / RATIO
    # no idle collectors: one fewer could not supply the rate (unless the epsilon spread's minimum holds them)
    assert split.collectors == 2 or (split.collectors - 1) * PER_CORE < split.env_steps_per_s


def test_many_cores_stop_adding_threads_where_the_gain_ends():
    by_cores = {c: split_cpu(measured_costs(c, "bf16", RATIO)) for c in (4, 8, 16, 64)}
    # 4 cores: a third thread would leave one collector core (~143 env steps/s), below what two threads hold (~155)
    assert by_cores[4].learner_threads == 2
    # 8 cores: 5 threads (6 would add < 2%); 16 and more: 6, where the projection's gain ends
    assert by_cores[8].learner_threads == 5 and by_cores[16].learner_threads == by_cores[64].learner_threads == 6
    assert by_cores[4].env_steps_per_s < by_cores[8].env_steps_per_s <= by_cores[16].env_steps_per_s
    assert by_cores[16].env_steps_per_s == by_cores[64].env_steps_per_s
    assert "spare" in by_cores[16].reason


def test_a_fast_learner_gives_the_cores_to_the_collectors():
    costs = CpuCosts(cores=16, env_step_cpu_ms=5.0, updates_per_s=((1, 1000.0),), precision="bf16",
                     updates_per_env_step=RATIO)
    split = split_cpu(costs)
    assert (split.collectors, split.learner_threads) == (15, 1)
    assert split.env_steps_per_s == pytest.approx(15 * 200.0)
    assert "collectors set the pace" in split.reason


def test_measured_thread_counts_are_used_as_measured():
    table = ((1, 30.0), (2, 50.0), (4, 80.0), (8, 90.0))  # what the many-core check writes
    costs = CpuCosts(cores=16, env_step_cpu_ms=5.68, updates_per_s=table, precision="bf16", updates_per_env_step=RATIO)
    assert projected_updates_per_s(costs, 4) == (80.0, False)
    split = split_cpu(costs)  # 7 threads (projected, 86.5) are more than 2% under 8's 90
    assert (split.learner_threads, split.collectors) == (8, 3) and "projected" not in split.reason
    assert split.env_steps_per_s == pytest.approx(90.0 / RATIO)


def test_amdahl_projection_from_two_measured_counts():
    costs = CpuCosts(cores=8, env_step_cpu_ms=5.0, updates_per_s=((1, 10.0), (2, 15.0)), precision="fp32",
                     updates_per_env_step=RATIO)
    ups, projected = projected_updates_per_s(costs, 4)  # speedup 1.5 at 2: p = 2/3, 1 / (1/3 + 1/6) = 2
    assert projected and ups == pytest.approx(20.0)


def test_no_gain_is_assumed_without_a_figure_for_it():
    costs = CpuCosts(cores=16, env_step_cpu_ms=5.0, updates_per_s=((1, 20.0),), precision="fp32",
                     updates_per_env_step=RATIO)
    assert projected_updates_per_s(costs, 8) == (20.0, True)
    split = split_cpu(costs)
    assert (split.collectors, split.learner_threads) == (2, 1)


def test_a_slower_second_thread_projects_no_loss_beyond_it():
    costs = CpuCosts(cores=8, env_step_cpu_ms=5.0, updates_per_s=((1, 20.0), (2, 15.0)), precision="fp32",
                     updates_per_env_step=RATIO)
    assert projected_updates_per_s(costs, 4) == (20.0, True)
    assert split_cpu(costs).learner_threads == 1


@pytest.mark.parametrize("bad", [dict(cores=0), dict(env_step_cpu_ms=0.0), dict(updates_per_env_step=-1.0)])
def test_bad_costs_are_refused(bad):
    fields = dict(cores=4, env_step_cpu_ms=5.0, updates_per_s=((1, 20.0),), precision="fp32",
                  updates_per_env_step=RATIO)
    with pytest.raises(ValueError):
        split_cpu(CpuCosts(**{**fields, **bad}))


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp16"):
        measured_costs(4, "fp16", RATIO)


@pytest.mark.parametrize("cores", [2, 16])
def test_auto_profile_takes_the_split(monkeypatch, cores):
    monkeypatch.setattr(config_optimized.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(config_optimized, "_cuda_memory_bytes", lambda: 0)
    split = config_optimized.cpu_auto_split()
    cfg = load_profile("auto")
    assert (cfg.collectors.count, cfg.learner.torch_threads) == (split.collectors, split.learner_threads)
    if cores == 2:
        assert (cfg.collectors.count, cfg.learner.torch_threads) == (2, 0)  # as before on this VM
    else:
        assert cfg.learner.torch_threads >= 1 and cfg.collectors.count >= 2
        assert math.isclose(split.updates_per_s, split.env_steps_per_s * RATIO)
    note = profile_note("auto", cfg)
    assert split.reason in note and f"collectors.count={cfg.collectors.count}" in note
    assert profile_note("cpu", cfg) == ""


def test_small_envs_keep_the_learners_own_thread_rule(monkeypatch):
    monkeypatch.setattr(config_optimized.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(config_optimized, "_cuda_memory_bytes", lambda: 0)
    assert load_config("auto", ["env.env_id=CartPole-v1"]).learner.torch_threads == 0
    assert load_config("auto").learner.torch_threads >= 1  # Mario takes the split's threads


def test_collectors_are_costed_by_their_emulator_backend():
    nes, retro = (measured_costs(16, "bf16", RATIO, b) for b in ("nes-py", "retro"))
    assert nes.env_step_cpu_ms == ENV_STEP_CPU_MS["nes-py"] > retro.env_step_cpu_ms == ENV_STEP_CPU_MS["retro"]
    with pytest.raises(ValueError, match="backend 'auto'"):
        measured_costs(16, "bf16", RATIO, "auto")  # a resolved backend only
    # a cheaper env step needs fewer collector cores for the same learner-bound rate
    a, b = split_cpu(nes), split_cpu(retro)
    assert a.env_steps_per_s == pytest.approx(b.env_steps_per_s) and b.collectors <= a.collectors


def test_the_gpu_server_profile_sizes_its_collectors_by_the_backend(monkeypatch):
    import config_optimized as co

    monkeypatch.setattr(co.os, "cpu_count", lambda: 64)
    nes, retro = co.gpu_server_profile("nes-py"), co.gpu_server_profile("retro")
    assert nes.collectors.count == 30 and retro.collectors.count == co.GPU_SERVER_MAX_COLLECTORS["retro"]
    # the projection: retro collectors enough for the captured learner's 7,000 env steps/s, no more
    per_retro = co.GPU_NESPY_COLLECTOR_ENV_STEPS_PER_S / co.RETRO_COST_RATIO
    assert (retro.collectors.count - 1) * per_retro < co.GPU_LEARNER_ENV_STEPS_PER_S <= retro.collectors.count * per_retro
    assert co.load_profile("gpu-server", backend="retro").collectors.count == retro.collectors.count


def test_a_runs_backend_is_read_from_its_overrides_and_resolved():
    import config_optimized as co
    from envs.mario.backend import resolve_backend

    assert co.backend_of([], "SuperMarioBros-1-1-v0") == "nes-py"  # the config's default
    assert co.backend_of(["env.backend=retro", "env.backend=nes-py"], "SuperMarioBros-1-1-v0") == "nes-py"
    assert co.backend_of(["env.backend=auto"], "SuperMarioBros-1-1-v0") == resolve_backend("auto")
    assert co.backend_of(["env.backend=retro"], "ALE/Pong-v5") == "nes-py"  # no NES emulator: nes-py's costs

"""The Ray launcher (`make run ARGS="--launcher ray --ray-address ADDR"`).

The cluster test starts a simulated multi-node Ray cluster on this machine (ray.cluster_utils:
one raylet per node, all local) and runs the real head against it, as a user would, with CURVE
on: collectors land on both nodes with distinct head-assigned slots, data flows, an actor killed
through Ray is restarted and data flows again, and a graceful stop leaves no collector actor and,
once the cluster is shut down, no Ray process. Skipped only where Ray is not installed. The
other tests need no Ray: flag errors, the run-time CURVE allowlist the actors' keys go on, and the
head's bookkeeping of actor incarnations and their keys (against an in-memory stand-in for Ray).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import zmq

from shared.keys import AllowList, generate
from tests.support.cluster import kill_tree, read_metrics, start_head, stop_head
from tests.support.waits import wait_for

HAVE_RAY = importlib.util.find_spec("ray") is not None
PLACED = re.compile(r"collector slot (\d+): actor (\S+) on node ([0-9a-f]+) \(host \S+, pid (\d+)\)")
REGISTERED = re.compile(r"collector \d+ registered \(host=\S+ pid=(\d+) slot=(\d+) eps=([0-9.]+)\)")
RAY_PROCESS_WORDS = (b"ray::", b"raylet", b"gcs_server", b"default_worker.py", b"ray/dashboard", b"log_monitor")


# ---------------------------------------------------------------------- no Ray needed
def test_launcher_ray_without_ray_installed_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from launcher.__main__ import main

    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # find_spec("ray") -> None: "not installed"
    code = main(["--profile", "cpu", "--collectors", "0", "--launcher", "ray", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--launcher ray needs Ray" in err and ".[ray]" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, words", [
    (["--ray-address", "auto"], "--ray-address is invalid without --launcher ray"),
    (["--launcher", "ray", "--inprocess"], "--inprocess is invalid with --launcher ray"),
    (["--launcher", "kubernetes"], "invalid choice"),
])
def test_launcher_flag_errors_are_one_line_and_exit_2(tmp_path, capsys, flags, words):
    from launcher.__main__ import main

    try:
        code = main(["--profile", "cpu", "--collectors", "0", *flags, "--run-dir", str(tmp_path / "r")])
    except SystemExit as exc:  # argparse's own errors (a bad choice) exit from the parser
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "r").exists()


def test_allowlist_admits_the_keys_dir_and_run_time_keys_only(tmp_path):
    keys = generate(tmp_path / "keys")
    allow = AllowList(keys)
    fixed = (keys / "client.key").read_text().split('public-key = "')[1].split('"')[0].encode()
    public, _secret = zmq.curve_keypair()
    assert allow.callback("*", fixed)
    assert not allow.callback("*", public)
    allow.add(public.decode())
    assert allow.callback("*", public)
    allow.discard(public.decode())
    assert not allow.callback("*", public) and allow.callback("*", fixed)


class _Ref:
    def __init__(self, value):
        self.value = value


class _Method:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        return _Ref(self._fn(*args))


class _Handle:
    """An actor as the head sees it: each call answers at once; `pid` and `key` name the incarnation."""

    def __init__(self):
        self.pid, self.key, self.admitted, self.killed = 100, "k100", [], None
        self.identity = _Method(lambda: {"node_id": "n" * 12, "host": "h", "pid": self.pid, "public_key": self.key,
                                         "ended": ""})
        self.admit = _Method(self.admitted.append)
        self.stop = _Method(lambda grace_s: "stop")


class _FakeRay:
    """The part of Ray's API the head's collector bookkeeping calls; actors answer synchronously."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        RayError = RuntimeError

    class util:  # noqa: N801 - mirrors ray.util
        @staticmethod
        def get_node_ip_address():
            return "10.0.0.1"

    def __init__(self):
        self.handles = []

    def init(self, **_kw):
        pass

    def shutdown(self):
        pass

    def nodes(self):
        return [{"Alive": True, "NodeManagerAddress": "10.0.0.1"}]

    def cluster_resources(self):
        return {"CPU": 2}

    def remote(self, _cls):
        ray = self

        class _Options:
            def options(self, **_kw):
                return self

            def remote(self, *_args):
                ray.handles.append(_Handle())
                return ray.handles[-1]
        return _Options()

    def wait(self, refs, num_returns, timeout):
        return list(refs), []

    def get(self, ref):
        return ref.value

    def kill(self, handle, no_restart):
        handle.killed = no_restart


def test_run_time_keys_follow_incarnations_and_outlive_a_graceful_stop(tmp_path, monkeypatch):
    """A restarted actor's old key is refused at once; at a graceful stop the keys stay admitted while
    the actors are killed (Ray's kill is asynchronous: a handshake begun before the stop must not be
    refused), and every registration is freed."""
    from launcher import ray_collectors

    ray = _FakeRay()
    monkeypatch.setattr(ray_collectors, "import_ray", lambda: ray)
    allow = AllowList(generate(tmp_path / "keys"))
    exits = []
    collectors = ray_collectors.RayCollectors(2, "tcp://127.0.0.1:5555", b"server", allow, lambda pid, host: None,
                                              60.0, on_exit=lambda pid, host: exits.append(pid))
    collectors.start()
    first, second = ray.handles
    second.pid, second.key = 200, "k200"
    collectors.poll()  # asks who they are
    collectors.poll()  # admits them
    assert allow.callback("*", b"k100") and allow.callback("*", b"k200")
    assert first.admitted == ["k100"] and second.admitted == ["k200"]

    first.pid, first.key = 101, "k101"  # Ray restarted slot 0: a new process with a new key
    monkeypatch.setattr(ray_collectors, "IDENTITY_EVERY_S", 0.0)  # ask again at once
    collectors.poll()
    collectors.poll()
    assert not allow.callback("*", b"k100") and allow.callback("*", b"k101")
    assert collectors.restarts_total == 1 and exits == [100]

    collectors.stop()
    assert first.killed is True and second.killed is True
    assert sorted(exits) == [100, 101, 200]
    assert allow.callback("*", b"k101") and allow.callback("*", b"k200")


# ---------------------------------------------------------------------- a simulated two-node cluster
def _ray_processes() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if ") Z" not in stat and any(word in cmdline for word in RAY_PROCESS_WORDS):
            found.add(int(entry.name))
    return found


def _collector_actor_processes() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::CollectorActor"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def ray_cluster(monkeypatch):
    """Two Ray nodes on this machine, 2 CPUs each (so SPREAD, not a lack of CPUs, puts collectors apart)."""
    if not HAVE_RAY:
        pytest.skip("ray is not installed (pip install -e '.[ray]'): Ray launcher test not run")
    from ray.cluster_utils import Cluster

    before = _ray_processes()
    # Ray's session folder holds unix sockets (sun_path: 107 bytes), so Ray (here and in the head, which inherits the
    # variable) gets a short folder of its own under /tmp, not the test's TMPDIR, whose path grows with pytest's
    # folders (a worker's popen-gwN among them)
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)
    node_args = {"num_cpus": 2, "object_store_memory": 100 * 1024 * 1024}
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
        try:
            cluster.add_node(**node_args)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()
            assert wait_for(lambda: not _ray_processes() - before, 30), \
                f"Ray processes left: {_ray_processes() - before}"
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_collectors_spread_over_nodes_restart_through_ray_and_leave_nothing(ray_cluster, tmp_path):
    import ray

    keys = generate(tmp_path / "keys")  # CURVE on: the actors' own keys must be admitted at run time
    run_dir = tmp_path / "run"
    out = tmp_path / "head.out"
    proc = start_head(["--env", "CartPole-v1", "--profile", "cpu", "--collectors", "2", "--log-interval", "1",
                       "--set", "transport.port=0", "--set", "collectors.envs_per_collector=4",
                       "--curve-keys", str(keys), "--launcher", "ray", "--ray-address", ray_cluster.address,
                       "--run-dir", str(run_dir)], out)
    try:
        def placed() -> dict[int, tuple[str, str, int]]:
            return {int(m[0]): (m[1], m[2], int(m[3])) for m in PLACED.findall(out.read_text())}

        assert wait_for(lambda: len(placed()) == 2, 120), out.read_text()[-4000:]
        first = placed()
        nodes = {node for _name, node, _pid in first.values()}
        assert len(nodes) == 2, f"both collectors on one node: {first}"
        assert wait_for(lambda: any(r["env_steps"] > 2000 for r in read_metrics(run_dir)), 120), \
            out.read_text()[-4000:]
        registered = REGISTERED.findall(out.read_text())
        # head-assigned and distinct (on a loaded machine a slot may already have re-registered once: a
        # replacement keeps its slot and its epsilon)
        slots = {int(slot): eps for _pid, slot, eps in registered}
        assert sorted(slots) == [0, 1], registered
        assert len(set(slots.values())) == 2  # so Ape-X epsilons differ across nodes
        assert all(slots[int(slot)] == eps for _pid, slot, eps in registered), registered

        ray.init(address=ray_cluster.address, namespace="mario-apex", logging_level="WARNING")
        try:
            victim_name, _node, victim_pid = first[0]
            ray.kill(ray.get_actor(victim_name), no_restart=False)  # Ray must bring it back
            assert wait_for(lambda: placed().get(0, first[0])[2] != victim_pid, 60), out.read_text()[-4000:]
            assert wait_for(lambda: read_metrics(run_dir)[-1].get("restarts", 0) >= 1, 20)
            steps = read_metrics(run_dir)[-1]["env_steps"]
            new_pid = placed()[0][2]
            assert wait_for(lambda: any(int(pid) == new_pid for pid, _s, _e in REGISTERED.findall(out.read_text())),
                            60), out.read_text()[-4000:]
            assert wait_for(lambda: read_metrics(run_dir)[-1]["env_steps"] > steps + 2000, 60)

            assert stop_head(proc) == 0, out.read_text()[-4000:]
            names = [name for name, _node, _pid in placed().values()]
            for name in names:  # removed from the cluster, not merely stopped
                assert wait_for(lambda n=name: not _named_actor_alive(ray, n), 20), f"{name} still alive"
            assert wait_for(lambda: not _collector_actor_processes(), 20), _collector_actor_processes()
        finally:
            ray.shutdown()
    finally:
        kill_tree(proc)
    log = out.read_text()
    assert "ZAP DENIED" not in log and "Traceback" not in log, log[-4000:]


def _named_actor_alive(ray, name: str) -> bool:
    try:
        ray.get_actor(name)
    except ValueError:  # a dead actor's name is released
        return False
    return True

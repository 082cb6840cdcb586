"""Collectors on another "machine": a network namespace joined to the head by a veth pair.

The head binds the veth address with CURVE keys and starts no local collectors. A collector in
the namespace with an authorized key joins over TCP and its data arrives; a collector with an
unauthorized key is refused (logged at the head as ZAP DENIED) and gets no data in.
Needs root and iproute2 (`ip netns`); skipped with the reason where that is not permitted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.cluster import (
    ROOT,
    head_env,
    kill_tree,
    read_metrics,
    start_head,
    stop_head,
    wait_endpoints,
)
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@pytest.fixture
def netns():
    """A namespace `apx<pid>` with veth 10.231.<n>.2 facing the head's 10.231.<n>.1."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed: multi-host test not run")
    if os.geteuid() != 0:
        pytest.skip("not root: cannot create network namespaces, multi-host test not run")
    tag = os.getpid() % 10000
    ns, host_if, ns_if = f"apx{tag}", f"apxh{tag}", f"apxn{tag}"
    subnet = 231
    octet = (tag % 250) + 1
    head_ip, ns_ip = f"10.{subnet}.{octet}.1", f"10.{subnet}.{octet}.2"
    setup = [
        ("ip", "netns", "add", ns),
        ("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if),
        ("ip", "link", "set", ns_if, "netns", ns),
        ("ip", "addr", "add", f"{head_ip}/30", "dev", host_if),
        ("ip", "link", "set", host_if, "up"),
        ("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if),
        ("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"),
        ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"),
    ]
    try:
        for cmd in setup:
            result = _run(*cmd)
            if result.returncode != 0:
                pytest.skip(f"network namespaces not permitted here ({' '.join(cmd)}: {result.stderr.strip()})")
        yield ns, head_ip
    finally:
        _run("ip", "link", "del", host_if)
        _run("ip", "netns", "del", ns)


def _collector_in(ns: str, connect: str, keys: str, log_path) -> subprocess.Popen:
    argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "actors", "--connect", connect, "--collectors", "1",
            "--curve-keys", keys, "--register-timeout", "15"]
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=head_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def test_remote_collector_joins_with_curve_and_wrong_key_is_refused(netns, tmp_path):
    from shared.keys import generate

    ns, head_ip = netns
    good = generate(tmp_path / "keys")
    rogue = generate(tmp_path / "rogue")
    shutil.copy(good / "server.key", rogue / "server.key")  # knows the server, but its own key is not authorized
    run_dir = tmp_path / "run"
    head = start_head(["--env", "CartPole-v1", "--profile", "cpu", "--collectors", "0", "--no-train",
                       "--bind", head_ip, "--port", "0", "--curve-keys", str(good), "--log-interval", "1",
                       "--set", "collectors.envs_per_collector=2", "--run-dir", str(run_dir)], tmp_path / "head.out")
    collectors = []
    try:
        connect = wait_endpoints(run_dir, head)["control"]  # port 0: the ports the head bound, read back
        assert connect.startswith(f"tcp://{head_ip}:"), connect
        collectors.append(_collector_in(ns, connect, str(good), tmp_path / "good.out"))
        assert wait_for(lambda: any(r["env_steps"] > 500 for r in read_metrics(run_dir)), 120), \
            (tmp_path / "good.out").read_text()[-2000:] + (tmp_path / "head.out").read_text()[-2000:]
        steps_before_rogue = read_metrics(run_dir)[-1]["env_steps"]
        rogue_proc = _collector_in(ns, connect, str(rogue), tmp_path / "rogue.out")
        collectors.append(rogue_proc)
        assert rogue_proc.wait(timeout=60) != 0  # registration never completes
        head_log = (run_dir / "head.log").read_text()
        assert "ZAP DENIED" in head_log
        assert head_log.count("registered (host=") == 1  # only the authorized collector got a socket
        assert f"-> tcp://{head_ip}:" in head_log  # its data crossed the veth over TCP, not a local ipc path
        assert read_metrics(run_dir)[-1]["env_steps"] >= steps_before_rogue
        assert stop_head(head) == 0
    finally:
        for proc in collectors:
            kill_tree(proc)
        kill_tree(head)

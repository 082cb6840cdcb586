"""Checkpoint round trip, atomic layout, and precise CheckpointErrors for corrupt/mismatched files."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from learner.checkpoint import (
    CheckpointError,
    check_geometry,
    check_state_dict,
    find_checkpoint,
    load_checkpoint,
)
from tests.support.learner_fakes import FakeReplay, learner_of, make_learner, small_config, state_copy


def test_round_trip_bit_identical_and_counters_continue(tmp_path) -> None:
    replay = FakeReplay(seed=1)
    a = make_learner(small_config(), replay=replay, seed=0)
    try:
        a.run_updates(5)
        path = a.save_checkpoint(tmp_path, replay=replay, counters={"env_steps": 1234, "episodes": 7})
        assert path == tmp_path / "checkpoint"
        assert sorted(p.name for p in path.iterdir()) == [
            "config.json", "meta.json", "model.pt", "optimizer.pt", "replay", "rng.pt", "scaler.pt"]
        assert not any(p.name.startswith(".checkpoint.tmp") for p in tmp_path.iterdir())
        expected_rng = (torch.rand(3), np.random.rand(3), random.random())
        saved_priorities = replay.priorities.copy()
    finally:
        a.close()

    replay_b = FakeReplay(seed=1)
    b = make_learner(small_config(), replay=replay_b, seed=99)  # different init, untouched priorities
    try:
        counters = b.load_checkpoint(tmp_path, replay=replay_b)
        assert counters["env_steps"] == 1234 and counters["episodes"] == 7 and counters["updates"] == 5
        assert (b.updates, b.samples) == (5, 5 * 8)
        rng_after = (torch.rand(3), np.random.rand(3), random.random())
        assert torch.equal(rng_after[0], expected_rng[0])
        np.testing.assert_array_equal(rng_after[1], expected_rng[1])
        assert rng_after[2] == expected_rng[2]
        saved = torch.load(tmp_path / "checkpoint" / "model.pt", weights_only=True)
        for k, v in b.online.state_dict().items():
            assert torch.equal(v, saved["online"][k]), k  # bit-identical
        for k, v in b.target.state_dict().items():
            assert torch.equal(v, saved["target"][k]), k
        np.testing.assert_array_equal(replay_b.priorities, saved_priorities)
        assert b.optimizer.state_dict()["state"][0]["step"].item() == 5
        b.run_updates(1)
        assert b.updates == 6 and b.samples == 6 * 8  # counters continue
    finally:
        b.close()


def test_resume_continues_identically(tmp_path) -> None:
    """Save after k updates, then one more update from the original and from the restored learner."""
    r1 = FakeReplay(seed=4)
    a = make_learner(small_config(), replay=r1, seed=0)
    try:
        a.run_updates(3)
        a.save_checkpoint(tmp_path, replay=r1)
        r1.rng = np.random.default_rng(77)
        a.run_updates(2)
        after_a = state_copy(a.online)
    finally:
        a.close()
    r2 = FakeReplay(seed=4)
    b = make_learner(small_config(), replay=r2, seed=123)
    try:
        b.load_checkpoint(tmp_path, replay=r2)
        r2.rng = np.random.default_rng(77)
        b.run_updates(2)
        for k, v in state_copy(b.online).items():
            assert torch.equal(v, after_a[k]), k
        assert b.updates == 5
    finally:
        b.close()


def test_a_checkpoint_of_other_adam_kernels_resumes_with_this_learner_s() -> None:
    """Adam's saved param groups name the kernels they ran (fused, foreach): a checkpoint from another device or
    older code resumes with the kernels this learner chose (fused on the CPU), and continues as the original."""
    r1 = FakeReplay(seed=4)
    a = make_learner(small_config(), replay=r1, seed=0)
    try:
        assert a.optimizer.param_groups[0]["fused"] is True
        a.run_updates(3)
        state, priorities = copy.deepcopy(a.state_dict()), r1.priorities.copy()
        r1.rng = np.random.default_rng(77)
        a.run_updates(2)
        after_a = state_copy(a.online)
    finally:
        a.close()
    for group in state["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=True)  # what a CPU learner once saved
    r2 = FakeReplay(seed=4)
    b = make_learner(small_config(), replay=r2, seed=123)
    try:
        b.load_state_dict(state)
        assert all(g["fused"] is True and not g["foreach"] for g in b.optimizer.param_groups)
        r2.priorities[:] = priorities
        r2.rng = np.random.default_rng(77)
        b.run_updates(2)
        for k, v in state_copy(b.online).items():
            assert torch.equal(v, after_a[k]), k
    finally:
        b.close()


def test_truncated_file_names_the_file(tmp_path) -> None:
    learner = make_learner()
    try:
        learner.run_updates(1)
        path = learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    model = path / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    fresh = make_learner()
    try:
        with pytest.raises(CheckpointError, match=r"model\.pt.*(truncated|bytes)"):
            fresh.load_checkpoint(tmp_path)
        # without the size record the unreadable file is still reported by name
        meta = json.loads((path / "meta.json").read_text())
        del meta["files"]["model.pt"]
        (path / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(CheckpointError, match=r"model\.pt: unreadable"):
            fresh.load_checkpoint(tmp_path)
    finally:
        fresh.close()


def test_shape_mismatch_and_geometry_mismatch(tmp_path) -> None:
    learner = make_learner(small_config(hidden=32))
    try:
        learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    wider = make_learner(small_config(hidden=48))
    try:
        with pytest.raises(CheckpointError, match="hidden: checkpoint 32 vs learner 48"):
            wider.load_checkpoint(tmp_path)
        # the same file with the geometry record edited: the tensor check names the key and shapes
        meta_path = tmp_path / "checkpoint" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["geometry"]["hidden"] = 48
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(CheckpointError, match=r"shape mismatch for head\.\w+\.0\.weight: checkpoint \(32, \d+\) vs learner \(48, \d+\)"):
            wider.load_checkpoint(tmp_path)
    finally:
        wider.close()
    other_actions = make_learner(replay=FakeReplay(num_actions=7))
    try:
        with pytest.raises(CheckpointError, match="num_actions: checkpoint 5 vs learner 7"):
            other_actions.load_checkpoint(tmp_path)
    finally:
        other_actions.close()


def test_missing_key_and_missing_checkpoint(tmp_path) -> None:
    learner = make_learner()
    try:
        with pytest.raises(CheckpointError, match="no checkpoint found"):
            learner.load_checkpoint(tmp_path)
        state = learner.state_dict()
        del state["online"]["head.value.0.bias"]
        with pytest.raises(CheckpointError, match=r"missing key\(s\) \['head\.value\.0\.bias'\]"):
            learner.load_state_dict(state)
    finally:
        learner.close()


def test_atomic_replace_keeps_latest_and_recovers_old(tmp_path) -> None:
    learner = make_learner()
    try:
        learner.run_updates(1)
        learner.save_checkpoint(tmp_path)
        learner.run_updates(1)
        learner.save_checkpoint(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
        assert json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["counters"]["updates"] == 2
        # a crash between the two renames leaves only checkpoint.old: still found
        (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
        assert find_checkpoint(tmp_path) == tmp_path / "checkpoint.old"
        assert learner.load_checkpoint(tmp_path)["updates"] == 2
    finally:
        learner.close()


def test_a_symlinked_checkpoint_folder_keeps_checkpointing(tmp_path) -> None:
    """run/checkpoint a symlink to a folder elsewhere (another disk): every save replaces the folder it points
    to, the link stays, and nothing is left behind. The swap used to rename the link itself: the second save
    failed on the leftover checkpoint.old link and left a .checkpoint.tmp-<pid>/."""
    run, elsewhere = tmp_path / "run", tmp_path / "disk" / "ckpt"
    elsewhere.mkdir(parents=True)
    run.mkdir()
    (run / "checkpoint").symlink_to(elsewhere, target_is_directory=True)
    learner = make_learner()
    try:
        for updates in (1, 2, 3):
            learner.run_updates(1)
            learner.save_checkpoint(run)
            assert (run / "checkpoint").is_symlink() and (run / "checkpoint").resolve() == elsewhere.resolve()
            assert json.loads((elsewhere / "meta.json").read_text())["counters"]["updates"] == updates
            assert sorted(p.name for p in run.iterdir()) == ["checkpoint"]
            assert sorted(p.name for p in elsewhere.parent.iterdir()) == ["ckpt"]
        assert learner.load_checkpoint(run)["updates"] == 3
        # a crash between the two renames leaves only the target's .old sibling: still found through the link
        elsewhere.rename(elsewhere.with_name("ckpt.old"))
        assert find_checkpoint(run) == elsewhere.with_name("ckpt.old")
        assert learner.load_checkpoint(run)["updates"] == 3
        learner.save_checkpoint(run)  # and the next save puts the folder back where the link points
        assert (elsewhere / "meta.json").is_file() and not elsewhere.with_name("ckpt.old").exists()
    finally:
        learner.close()


def test_a_save_removes_the_temp_dirs_of_writers_that_no_longer_run(tmp_path) -> None:
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead, alive = tmp_path / f".checkpoint.tmp-{int(done.stdout)}", tmp_path / f".checkpoint.tmp-{os.getppid()}"
    odd = tmp_path / ".checkpoint.tmp-notapid"
    for path in (dead, alive, odd):
        (path / "replay").mkdir(parents=True)
        (path / "replay" / "frames.npy").write_bytes(b"x" * 1000)
    learner = make_learner()
    try:
        learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    assert not dead.exists()  # its writer exited: a leftover of a killed save
    assert alive.exists() and odd.exists()  # a running process's (maybe saving now), and not ours to judge
    assert (tmp_path / "checkpoint" / "meta.json").is_file()


# ---------------------------------------------------------------------- hardening
def _rehash(ckpt, name: str) -> None:
    """Record `name`'s current size and sha256 in meta.json, as if the checkpoint had been written that way."""
    meta_path = ckpt / "meta.json"
    meta = json.loads(meta_path.read_text())
    data = (ckpt / name).read_bytes()
    meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta_path.write_text(json.dumps(meta))


def _poison_first_weight(sd: dict[str, torch.Tensor], count: int = 3) -> str:
    name = next(k for k, v in sd.items() if v.is_floating_point() and v.numel() >= count)
    sd[name].view(-1)[:count] = float("nan")
    return name


def test_save_refuses_nonfinite_weights_and_keeps_the_previous_checkpoint(tmp_path) -> None:
    learner = make_learner()
    try:
        learner.run_updates(1)
        learner.save_checkpoint(tmp_path)
        learner.run_updates(1)
        with torch.no_grad():
            name = _poison_first_weight(dict(learner.online.named_parameters()))
        total = dict(learner.online.named_parameters())[name].numel()
        with pytest.raises(CheckpointError, match=rf"not written, non-finite weights in online/{re.escape(name)}: "
                                                  rf"3 of {total} values"):
            learner.save_checkpoint(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # no temp dir left behind
        assert json.loads((tmp_path / "checkpoint" / "meta.json").read_text())["counters"]["updates"] == 1
    finally:
        learner.close()


def test_resume_refuses_a_checkpoint_with_nonfinite_weights(tmp_path) -> None:
    """What the exit path wrote before this fix: a well-formed checkpoint holding all-NaN weights."""
    learner = make_learner()
    try:
        path = learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    model = torch.load(path / "model.pt", weights_only=True)
    for sd in model.values():
        for t in sd.values():
            t.fill_(float("nan"))
    torch.save(model, path / "model.pt")
    _rehash(path, "model.pt")
    fresh = make_learner()
    try:
        before = {k: v.clone() for k, v in fresh.online.state_dict().items()}
        with pytest.raises(CheckpointError, match=r"model\.pt: non-finite weights in online/.+: (\d+) of \1 values "
                                                  r"\(and \d+ more tensors\); refusing to resume"):
            fresh.load_checkpoint(tmp_path)
        for k, v in fresh.online.state_dict().items():
            assert torch.equal(v, before[k]), k  # nothing was loaded
    finally:
        fresh.close()


def test_replay_files_are_hashed_in_meta(tmp_path) -> None:
    replay = FakeReplay()
    learner = make_learner(replay=replay)
    try:
        path = learner.save_checkpoint(tmp_path, replay=replay)
    finally:
        learner.close()
    files = json.loads((path / "meta.json").read_text())["files"]
    assert sorted(files) == ["model.pt", "optimizer.pt", "replay/priorities.npy", "replay/state.json", "rng.pt",
                             "scaler.pt"]
    for name, info in files.items():
        data = (path / name).read_bytes()
        assert info == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    # the replay is verified only where it is restored: evaluation reads the networks alone
    (path / "replay" / "priorities.npy").write_bytes(b"\0" * files["replay/priorities.npy"]["bytes"])
    assert load_checkpoint(tmp_path).has_replay
    with pytest.raises(CheckpointError, match=r"replay/priorities\.npy: sha256 differs"):
        load_checkpoint(tmp_path, verify_replay=True)


def _edit_meta(fn):
    def corrupt(ckpt) -> None:
        meta = json.loads((ckpt / "meta.json").read_text())
        fn(meta)
        (ckpt / "meta.json").write_text(json.dumps(meta))
    return corrupt


def _truncate(name: str):
    def corrupt(ckpt) -> None:
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: len(data) // 2])
    return corrupt


def _flip(name: str, at: float = 0.5):
    def corrupt(ckpt) -> None:
        data = bytearray((ckpt / name).read_bytes())
        data[int(len(data) * at)] ^= 0xFF
        (ckpt / name).write_bytes(bytes(data))
    return corrupt


def _delete(name: str):
    def corrupt(ckpt) -> None:
        target = ckpt / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return corrupt


def _write(name: str, content: bytes):
    return lambda ckpt: (ckpt / name).write_bytes(content)


def _replace_torch(name: str, obj):
    def corrupt(ckpt) -> None:
        torch.save(obj, ckpt / name)
        _rehash(ckpt, name)
    return corrupt


def _nan_weights(ckpt) -> None:
    model = torch.load(ckpt / "model.pt", weights_only=True)
    _poison_first_weight(model["target"], count=1)
    torch.save(model, ckpt / "model.pt")
    _rehash(ckpt, "model.pt")


def _nan_optimizer(ckpt) -> None:
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    opt["state"][0]["exp_avg_sq"].view(-1)[0] = float("inf")
    torch.save(opt, ckpt / "optimizer.pt")
    _rehash(ckpt, "optimizer.pt")


CORRUPTIONS = {
    **{f"truncate {n}": (_truncate(n), rf"{re.escape(n)}: \d+ bytes but meta\.json records")
       for n in ("model.pt", "optimizer.pt", "scaler.pt", "rng.pt")},
    **{f"delete {n}": (_delete(n), rf"{re.escape(n)}: file missing") for n in ("model.pt", "optimizer.pt", "scaler.pt",
                                                                            "rng.pt")},
    "flip a byte of model.pt": (_flip("model.pt"), r"model\.pt: sha256 differs"),
    "flip a byte of optimizer.pt": (_flip("optimizer.pt", 0.9), r"optimizer\.pt: sha256 differs"),
    "delete meta.json": (_delete("meta.json"), "no checkpoint found"),
    "truncate meta.json": (_truncate("meta.json"), r"meta\.json: unreadable \(JSONDecodeError"),
    "meta.json not JSON": (_write("meta.json", b"\xff\xfe not json"), r"meta\.json: unreadable"),
    "meta.json nested 100k deep": (_write("meta.json", b"[" * 100_000), r"meta\.json: unreadable \(RecursionError"),
    "meta.json a list": (_write("meta.json", b"[1, 2]"), r"meta\.json: format 'list', this code reads format 1"),
    "meta.json format 2": (_edit_meta(lambda m: m.update(format=2)), "format 2, this code reads format 1"),
    "geometry a list": (_edit_meta(lambda m: m.update(geometry=[1, 2])), r"geometry=\[1, 2\] is invalid: allowed an"),
    "counters a list": (_edit_meta(lambda m: m.update(counters=[5])), r"counters=\[5\] is invalid"),
    "counter a string": (_edit_meta(lambda m: m["counters"].update(updates="5")),
                         r"counters\.updates='5' is invalid: allowed a count"),
    "counter a bool": (_edit_meta(lambda m: m["counters"].update(samples=True)), r"counters\.samples=True is invalid"),
    "counter NaN": (_edit_meta(lambda m: m["counters"].update(updates=float("nan"))), r"counters\.updates=nan"),
    "counter negative": (_edit_meta(lambda m: m["counters"].update(updates=-5)),
                         r"counters\.updates=-5 is invalid: allowed a count \(an integer in \[0, 2\*\*53\]\)"),
    "counter 1e300": (_edit_meta(lambda m: m["counters"].update(env_steps=1e300)), r"counters\.env_steps=1e\+300"),
    "counter fractional": (_edit_meta(lambda m: m["counters"].update(samples=2.5)), r"counters\.samples=2\.5"),
    "counter past 2**53": (_edit_meta(lambda m: m["counters"].update(broadcasts=2**60)), r"counters\.broadcasts="),
    "files a list": (_edit_meta(lambda m: m.update(files=["model.pt"])), r"files=\['model\.pt'\] is invalid"),
    "files entry a string": (_edit_meta(lambda m: m["files"].update({"model.pt": "abc"})),
                             r"files\['model\.pt'\]='abc' is invalid: allowed an object"),
    "files bytes a string": (_edit_meta(lambda m: m["files"]["rng.pt"].update(bytes="12")),
                             r"files\['rng\.pt'\]\.bytes='12' is invalid: allowed a non-negative integer"),
    "files sha256 an int": (_edit_meta(lambda m: m["files"]["scaler.pt"].update(sha256=5)),
                            r"files\['scaler\.pt'\]\.sha256=5 is invalid: allowed 64 lowercase hex digits"),
    "files escaping the checkpoint": (_edit_meta(lambda m: m["files"].update({"replay/../../x": m["files"]["rng.pt"]})),
                                      r"files\['replay/\.\./\.\./x'\]=.* is invalid: allowed only entries for"),
    "has_replay a string": (_edit_meta(lambda m: m.update(has_replay="yes")), r"has_replay='yes' is invalid"),
    "rng.python wrong": (_edit_meta(lambda m: m["rng"].update(python=[3, [1, 2], None])), r"rng\.python=.* is invalid"),
    "rng.numpy wrong": (_edit_meta(lambda m: m["rng"].update(numpy="MT19937")), r"rng\.numpy='MT19937' is invalid"),
    "rng a list": (_edit_meta(lambda m: m.update(rng=[1])), r"rng=\[1\] is invalid"),
    "rng.pt not a generator state": (_replace_torch("rng.pt", {"torch": torch.zeros(3), "cuda": []}),
                                     r"rng\.pt: 'torch' is not a CPU generator state"),
    "optimizer.pt a list": (_replace_torch("optimizer.pt", [1, 2]), r"optimizer\.pt: expected a state dict, got list"),
    "optimizer param_groups wrong": (_replace_torch("optimizer.pt", {"state": {}, "param_groups": 3}),
                                     r"\[optimizer\]: param_groups must be a list"),
    "scaler.pt a tensor": (_replace_torch("scaler.pt", torch.zeros(2)), r"scaler\.pt: expected a state dict"),
    "model.pt without target": (_replace_torch("model.pt", {"online": {}}), r"model\.pt: expected a dict with"),
    "NaN weights": (_nan_weights, r"model\.pt: non-finite weights in target/.+: 1 of \d+ values"),
    "inf in Adam's state": (_nan_optimizer, r"optimizer\.pt: non-finite optimizer state in optimizer/state/0/exp_avg_sq"),
    "replay file flipped": (_flip("replay/priorities.npy", 0.99), r"replay/priorities\.npy: sha256 differs"),
    "replay file truncated": (_truncate("replay/state.json"), r"replay/state\.json: \d+ bytes but meta\.json records"),
    "replay file deleted": (_delete("replay/priorities.npy"), r"replay/priorities\.npy: file missing"),
    "replay dir deleted": (_delete("replay"), r"replay: missing, but meta\.json says the checkpoint includes the replay"),
    "replay file added": (_write("replay/extra.npy", b"x"), r"replay/extra\.npy: not recorded in meta\.json"),
    "replay contents wrong, hashes updated": (
        lambda ckpt: (_write("replay/state.json", b"{}")(ckpt), _rehash(ckpt, "replay/state.json")),
        r"replay: KeyError"),
}


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    replay = FakeReplay(seed=2)
    learner = make_learner(replay=replay)
    try:
        learner.run_updates(2)
        learner.save_checkpoint(root, replay=replay, counters={"env_steps": 99})
    finally:
        learner.close()
    return root / "checkpoint"


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_every_corruption_is_a_checkpoint_error(case, saved_checkpoint, tmp_path) -> None:
    """Whatever is wrong with a checkpoint, resuming fails with one CheckpointError naming the file or
    field -- never a TypeError/KeyError/AttributeError traceback -- and leaves the learner untouched."""
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(saved_checkpoint, ckpt)
    corrupt, match = CORRUPTIONS[case]
    corrupt(ckpt)
    replay = FakeReplay(seed=5)
    learner = make_learner(replay=replay, seed=7)
    try:
        before = {k: v.clone() for k, v in learner.online.state_dict().items()}
        with pytest.raises(CheckpointError, match=match) as exc:
            learner.load_checkpoint(tmp_path, replay=replay)
        assert str(tmp_path) in str(exc.value) and "\n" not in str(exc.value)
        if "replay contents" not in case:  # everything but the replay is checked before any state changes
            assert learner.updates == 0
            for k, v in learner.online.state_dict().items():
                assert torch.equal(v, before[k]), k
    finally:
        learner.close()


def test_the_uncorrupted_copy_loads(saved_checkpoint, tmp_path) -> None:
    """The control for the corruption cases: the same copy, unmodified, resumes."""
    shutil.copytree(saved_checkpoint, tmp_path / "checkpoint")
    replay = FakeReplay(seed=5)
    learner = make_learner(replay=replay, seed=7)
    try:
        assert learner.load_checkpoint(tmp_path, replay=replay)["env_steps"] == 99 and learner.updates == 2
    finally:
        learner.close()


# ---------------------------------------------------------------------- the real replay's contents
VEC_OBS, VEC_STACK, VEC_ACTIONS = (4,), 2, 2  # a vector env (CartPole): float frames


def _vector_learner(seed: int | None = 0, bounds=None):
    from replay.buffer import ReplayBuffer
    from replay.value_bounds import ValueBounds

    buf = ReplayBuffer(128, VEC_OBS, np.float32, VEC_STACK, 3, 0.97, seed=seed,
                       bounds=bounds or ValueBounds(num_actions=VEC_ACTIONS))
    cfg = small_config(batch_size=8)
    return learner_of(cfg, EnvSpec(VEC_OBS, np.float32, VEC_ACTIONS, VEC_STACK), buf, "cpu"), buf


def _vector_chunks(count: int):
    from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, NO_ACTION, TransitionChunk

    data = np.random.default_rng(3)
    for stream in range(count):
        flags = np.zeros(12, dtype=np.uint8)
        flags[0], flags[-2] = FLAG_FIRST, FLAG_TERMINATED
        yield TransitionChunk(stream, 0, data.normal(size=(12, *VEC_OBS)).astype(np.float32),
                              np.append(data.integers(0, VEC_ACTIONS, 11), NO_ACTION).astype(np.int32),
                              data.normal(size=12).astype(np.float32), flags, np.ones(12, dtype=np.float32))


@pytest.fixture(scope="module")
def replay_checkpoint(tmp_path_factory):
    """A checkpoint of a vector learner with its real ReplayBuffer (float frames) after 3 updates."""
    root = tmp_path_factory.mktemp("vector")
    learner, buf = _vector_learner()
    try:
        for chunk in _vector_chunks(6):
            buf.add_chunk(chunk)
        learner.run_updates(3)
        learner.save_checkpoint(root, replay=buf)
    finally:
        learner.close()
    return root / "checkpoint"


def _edit_npy(ckpt, name: str, edit) -> None:
    arr = np.load(ckpt / name)
    edit(arr)
    np.save(ckpt / name, arr, allow_pickle=False)
    _rehash(ckpt, name)


def _edit_replay_state(ckpt, edit) -> None:
    state = json.loads((ckpt / "replay" / "state.json").read_text())
    edit(state)
    (ckpt / "replay" / "state.json").write_text(json.dumps(state))
    _rehash(ckpt, "replay/state.json")


def _set_live(arr, value) -> None:
    arr[1] = value  # slot 1: inside the first stored episode


REPLAY_CONTENTS = {
    # a NaN observation with its sha256 updated: the hashes pass, the values must not
    "NaN frame": (lambda c: _edit_npy(c, "replay/frames.npy", lambda a: a.__setitem__((5, 2), np.nan)),
                  r"replay/frames\.npy: slot 5 holds nan \(1 bad values in all\); allowed finite"),
    "inf frame in a free slot": (lambda c: _edit_npy(c, "replay/frames.npy", lambda a: a.__setitem__((-1, 0), np.inf)),
                                 r"replay/frames\.npy: slot 127 holds inf"),
    "NaN return": (lambda c: _edit_npy(c, "replay/ret.npy", lambda a: _set_live(a, np.nan)),
                   r"replay/ret\.npy: slot 1 holds nan"),
    "NaN discount": (lambda c: _edit_npy(c, "replay/disc.npy", lambda a: _set_live(a, np.nan)),
                     r"replay/disc\.npy: slot 1 holds nan .*allowed finite, >= 0\.0, <= 1\.0"),
    "discount above 1": (lambda c: _edit_npy(c, "replay/disc.npy", lambda a: _set_live(a, 1.5)),
                         r"replay/disc\.npy: slot 1 holds 1\.5"),
    "NaN priority": (lambda c: _edit_npy(c, "replay/leaves.npy", lambda a: _set_live(a, np.nan)),
                     r"replay/leaves\.npy: slot 1 holds nan"),
    "negative priority": (lambda c: _edit_npy(c, "replay/leaves.npy", lambda a: _set_live(a, -0.5)),
                          r"replay/leaves\.npy: slot 1 holds -0\.5 .*allowed finite, >= 0\.0"),
    "sampler_rng of another generator": (
        lambda c: _edit_replay_state(c, lambda s: s.update(sampler_rng={"bit_generator": "MT19937", "state": {"key": [1] * 624, "pos": 0}})),
        r"replay/state\.json: sampler_rng=.* is invalid \(not a PCG64 state\): allowed numpy\.random\.PCG64"),
    "sampler_rng negative": (
        lambda c: _edit_replay_state(c, lambda s: s["sampler_rng"]["state"].update(state=-1)),
        r"replay/state\.json: sampler_rng=.* is invalid"),
    "sampler_rng fractional": (
        lambda c: _edit_replay_state(c, lambda s: s["sampler_rng"]["state"].update(inc=1.5)),
        r"replay/state\.json: sampler_rng=.* is invalid \(does not read back unchanged\)"),
    "sampler_rng a string": (lambda c: _edit_replay_state(c, lambda s: s.update(sampler_rng="PCG64")),
                             r"replay/state\.json: sampler_rng='PCG64' is invalid"),
    # indices: an action the network has no output for was resumed and crashed the loss on the first batch
    "action out of range": (lambda c: _edit_npy(c, "replay/action.npy", lambda a: _set_live(a, VEC_ACTIONS + 5)),
                            r"replay/action\.npy: slot 1 holds 7 \(1 bad values in all\); allowed -1 \(no action\) "
                            r"or 0 \.\. 1 \(the env's 2 actions\); refusing to restore it$"),
    "negative action": (lambda c: _edit_npy(c, "replay/action.npy", lambda a: _set_live(a, -5)),
                        r"replay/action\.npy: slot 1 holds -5"),
    "action out of range in a free slot": (
        lambda c: _edit_npy(c, "replay/action.npy", lambda a: a.__setitem__(-1, 9)), r"replay/action\.npy: slot 127 holds 9"),
    "boot beyond the ring": (lambda c: _edit_npy(c, "replay/boot.npy", lambda a: a.__setitem__(-1, 10**6)),
                             r"replay/boot\.npy: slot 127 holds 1000000 .*allowed a ring slot 0 \.\. 127"),
    "negative floor": (lambda c: _edit_npy(c, "replay/floor.npy", lambda a: _set_live(a, -3)),
                       r"replay/floor\.npy: slot 1 holds -3"),
    "segment end past the ring": (lambda c: _edit_npy(c, "replay/seg_end.npy", lambda a: a.__setitem__(-1, 5000)),
                                  r"replay/seg_end\.npy: slot 127 holds 5000"),
    "segment end before its slot": (lambda c: _edit_npy(c, "replay/seg_end.npy", lambda a: _set_live(a, 1)),
                                    r"replay/seg_end\.npy: slot 1 holds 1, a segment ending at or before its own slot"),
    "segment start past the cursor": (lambda c: _edit_npy(c, "replay/seg_abs.npy", lambda a: _set_live(a, 10**9)),
                                      r"replay/seg_abs\.npy: slot 1 holds 1000000000 .*before the write cursor"),
    "cursor a string": (lambda c: _edit_replay_state(c, lambda s: s.update(cursor="5")),
                        r"replay/state\.json: cursor='5' is invalid: allowed an integer in \[0, 128\]"),
    "abs_cursor negative": (lambda c: _edit_replay_state(c, lambda s: s.update(abs_cursor=-5)),
                            r"replay/state\.json: abs_cursor=-5 is invalid"),
    "transitions_added huge float": (lambda c: _edit_replay_state(c, lambda s: s.update(transitions_added=1e300)),
                                     r"replay/state\.json: transitions_added=1e\+300 is invalid"),
}


@pytest.mark.parametrize("case", sorted(REPLAY_CONTENTS))
def test_replay_contents_are_checked_before_resuming(case, replay_checkpoint, tmp_path) -> None:
    """Files whose sha256 was updated with them pass the hash check; their values still must be what a
    run can produce (finite frames, returns, discounts in [0, 1], priorities >= 0, a PCG64 generator
    state), or resuming fails with one CheckpointError naming the file, and the replay stays as it was."""
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(replay_checkpoint, ckpt)
    corrupt, match = REPLAY_CONTENTS[case]
    corrupt(ckpt)
    learner, buf = _vector_learner(seed=1)
    try:
        with pytest.raises(CheckpointError, match=match) as exc:
            learner.load_checkpoint(tmp_path, replay=buf)
        assert str(ckpt / "replay") in str(exc.value) and "\n" not in str(exc.value)
        assert len(buf) == 0 and buf.transitions_added == 0  # nothing of the replay was restored
    finally:
        learner.close()


def _head_bounds():
    from envs.bounds import UNKNOWN_BOUND
    from replay.value_bounds import ValueBounds

    return ValueBounds.of_head(UNKNOWN_BOUND, UNKNOWN_BOUND)  # an env nothing is known of: |obs|, |reward| <= 1e6


# finite values no run can produce: what the wire would have refused as obs_out_of_range / reward_out_of_range
OUT_OF_RANGE = {
    "frame of 1e30": (lambda c: _edit_npy(c, "replay/frames.npy", lambda a: a.__setitem__((5, 2), 1e30)),
                      r"replay/frames\.npy: slot 5 holds 1e\+30 \(1 bad values in all\); allowed finite, "
                      r"\|x\| <= 1e\+06 \(env\.max_abs_obs\); refusing to restore it$"),
    "negative frame beyond the bound": (
        lambda c: _edit_npy(c, "replay/frames.npy", lambda a: a.__setitem__((-1, 0), -2e6)),
        r"replay/frames\.npy: slot 127 holds -2e\+06 .*allowed finite, \|x\| <= 1e\+06"),
    # 3-step returns at gamma 0.97 of rewards within 1e6: |R| <= 1e6 x (1 + 0.97 + 0.9409)
    "return beyond the n-step bound": (
        lambda c: _edit_npy(c, "replay/ret.npy", lambda a: _set_live(a, -3e6)),
        r"replay/ret\.npy: slot 1 holds -3e\+06 .*allowed finite, \|x\| <= 2\.9109e\+06 "
        r"\(max_abs_reward 1e\+06 over 3 steps at gamma 0\.97\); refusing"),
    # (1e30 + eps) ** 0.6: the mass of the largest |TD| the learner turns into a priority
    "priority beyond the cap": (lambda c: _edit_npy(c, "replay/leaves.npy", lambda a: _set_live(a, 1e300)),
                                r"replay/leaves\.npy: slot 1 holds 1e\+300 .*allowed finite, >= 0\.0, "
                                r"\|x\| <= 1e\+18"),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_replay_values_beyond_the_wire_bounds_are_refused(case, replay_checkpoint, tmp_path) -> None:
    """Finite is not enough: a value the head would never have let in (a 1e30 observation, a return no
    rewards within env.max_abs_reward sum to, a priority above the |TD| cap's) fails the restore with one
    line naming the file, the slot, the value and the bound, and nothing of the replay is restored."""
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(replay_checkpoint, ckpt)
    corrupt, match = OUT_OF_RANGE[case]
    corrupt(ckpt)
    learner, buf = _vector_learner(seed=1, bounds=_head_bounds())
    try:
        with pytest.raises(CheckpointError, match=match) as exc:
            learner.load_checkpoint(tmp_path, replay=buf)
        assert str(ckpt / "replay") in str(exc.value) and "\n" not in str(exc.value)
        assert len(buf) == 0 and buf.transitions_added == 0
    finally:
        learner.close()


def test_replay_values_at_the_wire_bounds_restore(replay_checkpoint, tmp_path) -> None:
    """The control: values at the bounds (a frame of exactly env.max_abs_obs, a return and a priority of
    the largest size the head can produce, as float32 / float64 round them) restore."""
    bounds = _head_bounds()
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(replay_checkpoint, ckpt)
    _edit_npy(ckpt, "replay/frames.npy", lambda a: a.__setitem__((5, 2), -1e6))
    biggest_return = np.float32(bounds.max_abs_return(3, 0.97))
    _edit_npy(ckpt, "replay/ret.npy", lambda a: _set_live(a, biggest_return))
    # ingest clips a collector's priorities to float32(1e30), a little above 1e30: the slack must admit it
    biggest_leaf = (float(np.float32(1e30)) + 1e-6) ** 0.6
    assert biggest_leaf > bounds.max_leaf(True, 0.6, 1e-6)
    _edit_npy(ckpt, "replay/leaves.npy", lambda a: _set_live(a, biggest_leaf))
    learner, buf = _vector_learner(seed=1, bounds=bounds)
    try:
        learner.load_checkpoint(tmp_path, replay=buf)
        assert len(buf) > 0 and buf.storage.frames[5, 2].item() == -1e6
        assert buf.storage.ret[1] == biggest_return
    finally:
        learner.close()


def test_the_uncorrupted_replay_checkpoint_resumes_with_its_sampler_stream(replay_checkpoint, tmp_path) -> None:
    """The control for the replay cases; and the sampler continues the saved generator, whatever seed the
    new replay was built with."""
    shutil.copytree(replay_checkpoint, tmp_path / "checkpoint")
    saved = json.loads((tmp_path / "checkpoint" / "replay" / "state.json").read_text())["sampler_rng"]
    learner, buf = _vector_learner(seed=12345)
    try:
        assert buf._reader.rng.bit_generator.state != saved
        learner.load_checkpoint(tmp_path, replay=buf)
        assert buf._reader.rng.bit_generator.state == saved and len(buf) > 0 and learner.updates == 3
        learner.run_updates(1)
    finally:
        learner.close()


def _resume_with_a_frame_of(value: float, tmp_path):
    """`python -m launcher --resume` of a CartPole run whose replay/frames.npy holds `value` at slot 17
    (sha256 updated to match); returns the finished process and the checkpoint's path."""
    return _resume_with_an_edit("replay/frames.npy", lambda a: a.__setitem__((17, 3), value), tmp_path)


def _resume_with_an_edit(name: str, edit, tmp_path):
    """`python -m launcher --resume` of a CartPole run whose checkpoint file `name` (a .npy of the replay)
    went through `edit` (sha256 updated to match); returns the finished process and the checkpoint's path."""

    def corrupt(ckpt) -> None:
        _edit_npy(ckpt, name, edit)
        load_checkpoint(ckpt, verify_replay=True)  # every sha256 matches: only the values are wrong

    return _resume_after(corrupt, tmp_path)


def _resume_after(corrupt, tmp_path):
    """`python -m launcher --resume` of a CartPole run (with its replay) whose checkpoint dir went through
    `corrupt`; returns the finished process and the checkpoint's path."""
    import subprocess
    import sys

    from envs.factory import env_spec
    from launcher.cli import parse_args
    from replay.buffer import ReplayBuffer
    from shared.chunk import FLAG_FIRST, FLAG_TRUNCATED, NO_ACTION, TransitionChunk
    from tests.support.cluster import ROOT, head_env

    flags = ["--profile", "cpu", "--env", "CartPole-v1", "--port", "0", "--collectors", "0", "--max-seconds", "1"]
    run = tmp_path / "run"
    cfg, _ = parse_args([*flags, "--run-dir", str(run)])
    spec = env_spec(cfg.env)
    buf = ReplayBuffer.build(cfg.replay, spec, "cpu")
    learner = learner_of(cfg, spec, buf, "cpu")
    data = np.random.default_rng(0)
    try:
        for stream in range(4):
            steps = 40
            marks = np.zeros(steps + 1, dtype=np.uint8)
            marks[0], marks[-2] = FLAG_FIRST, FLAG_TRUNCATED
            buf.add_chunk(TransitionChunk(
                stream, 0, data.normal(size=(steps + 1, *spec.obs_shape)).astype(spec.obs_dtype),
                np.append(data.integers(0, spec.num_actions, steps), NO_ACTION).astype(np.int32),
                np.full(steps + 1, spec.max_abs_reward, dtype=np.float32), marks,
                np.ones(steps + 1, dtype=np.float32)))
        learner.run_updates(1)
        ckpt = learner.save_checkpoint(run, replay=buf)
    finally:
        learner.close()
    corrupt(ckpt)
    proc = subprocess.run([sys.executable, "-m", "launcher", *flags, "--run-dir", str(tmp_path / "run2"),
                           "--resume", str(run)], cwd=ROOT, env=head_env(), capture_output=True, text=True,
                          timeout=300)
    return proc, ckpt


def test_resuming_from_frames_holding_a_nan_exits_2_naming_the_file(tmp_path) -> None:
    """The CLI's view: a CartPole run's checkpoint whose replay/frames.npy got one NaN (sha256 updated to
    match) is refused by `python -m launcher --resume`: exit 2 and one error line naming the file, where it
    used to resume and write the NaN into every later checkpoint."""
    proc, ckpt = _resume_with_a_frame_of(np.nan, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line or line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"{ckpt / 'replay' / 'frames.npy'}: slot 17 holds nan" in errors[0], errors[0]


def test_resuming_from_an_action_the_env_does_not_have_exits_2_naming_the_file(tmp_path) -> None:
    """An action of 7 on CartPole (2 actions) in replay/action.npy, sha256 updated: it used to resume and
    crash dqn_loss a few seconds later with an index error (rc 1, a traceback), saving the bad value again
    on the way, so every later resume crashed too."""
    proc, ckpt = _resume_with_an_edit("replay/action.npy", lambda a: a.__setitem__(17, 7), tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line or line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"{ckpt / 'replay' / 'action.npy'}: slot 17 holds 7" in errors[0], errors[0]
    assert "(the env's 2 actions)" in errors[0], errors[0]


@pytest.mark.parametrize("counter, value", [("updates", -5), ("env_steps", 1e300)])
def test_resuming_from_an_impossible_counter_exits_2_naming_it(counter, value, tmp_path) -> None:
    """meta.json's counters are counts: `updates=-5` or `env_steps=1e300` (both finite numbers) used to pass
    the checks and end the resumed run with rc 1 and a traceback."""
    proc, ckpt = _resume_after(_edit_meta(lambda m: m["counters"].update({counter: value})), tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line or line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"{ckpt / 'meta.json'}: counters.{counter}={value!r} is invalid: allowed a count" in errors[0], errors[0]


def test_resuming_from_frames_beyond_the_envs_bound_exits_2_naming_the_bound(tmp_path) -> None:
    """The same for a finite value the wire refuses (obs_out_of_range against CartPole's own bound, 20): a
    checkpoint whose frames.npy held 1e30 used to resume and training collapsed on it; 1e3 was still admitted
    while the bound was 1e6, and one chunk of such observations wrecks a CartPole network as surely."""
    proc, ckpt = _resume_with_a_frame_of(1e3, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line or line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"{ckpt / 'replay' / 'frames.npy'}: slot 17 holds 1000" in errors[0], errors[0]
    assert "allowed finite, |x| <= 20 (env.max_abs_obs); refusing to restore it" in errors[0], errors[0]


@pytest.mark.slow
def test_a_run_whose_final_checkpoint_cannot_be_written_exits_3(tmp_path) -> None:
    """A real head on a disk that takes no file over 128 KiB (RLIMIT_FSIZE: the kernel refuses the write,
    as a full disk would): the run trains, model.pt cannot be written, and `python -m launcher` exits 3
    with one ERROR line saying the progress is not on disk -- where it used to exit 0."""
    import resource
    import subprocess
    import sys

    from tests.support.cluster import ROOT, head_env

    limit = 128 << 10  # head.log, metrics and config fit; the network's weights do not

    def small_files_only() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes raise

    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "--profile", "cpu", "--env", "CartPole-v1", "--collectors", "1",
         "--port", "0", "--max-updates", "3", "--set", "learner.warmup_transitions=200", "--run-dir", str(run)],
        cwd=ROOT, env=head_env(), capture_output=True, text=True, preexec_fn=small_files_only, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "'reason': 'max_updates'" in proc.stdout  # it trained and stopped at its limit
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "final checkpoint failed" in errors[0] and "it wrote no checkpoint" in errors[0]
    assert "is not on disk" in errors[0]
    assert not (run / "checkpoint").exists() and not list(run.glob(".checkpoint.tmp-*"))


def test_a_run_dir_that_refuses_the_head_s_cleanup_still_exits_3(tmp_path) -> None:
    """A run dir gone read-only (a disk error; `chattr +i` in the field) fails the final checkpoint and then
    the removal of endpoints.json. The head logs the one ERROR for the checkpoint and one WARNING for the
    file, and `python -m launcher` exits 3 -- where close() raised and the process exited 1 with a
    traceback. Simulated as root can be: RLIMIT_FSIZE refuses model.pt, and endpoints.json, swapped for
    a non-empty directory once the head wrote it, cannot be unlinked."""
    import resource
    import signal
    import subprocess
    import sys
    import time

    from tests.support.cluster import ROOT, head_env

    limit = 128 << 10  # head.log, metrics and config fit; the network's weights do not

    def small_files_only() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes raise

    run = tmp_path / "run"
    endpoints = run / "endpoints.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--profile", "cpu", "--env", "CartPole-v1", "--collectors", "0",
         "--port", "0", "--run-dir", str(run)],
        cwd=ROOT, env=head_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=small_files_only)
    try:
        deadline = time.monotonic() + 240  # only a head that never starts gets here
        while not endpoints.exists():  # written (atomically) once the head's sockets are bound
            assert proc.poll() is None and time.monotonic() < deadline, "the head did not start"
            time.sleep(0.05)
        endpoints.unlink()
        endpoints.mkdir()
        (endpoints / "held").write_text("")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "final checkpoint failed" in errors[0], stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if " WARNING " in line and "endpoints.json" in line]
    assert len(warnings) == 1 and "could not remove" in warnings[0], stderr[-3000:]


# ---------------------------------------------------------------------- the encoder in the geometry
SHIPPED = Path(__file__).resolve().parents[1] / "docs" / "checkpoints" / "mario-1-1-cpu"


def _shipped_learner(encoder: str = "nature"):
    """A learner with the shipped run's own learner section (device cpu, no prefetch thread) on its Mario geometry."""
    from shared.config import Config

    cfg = Config.from_dict(json.loads((SHIPPED / "checkpoint" / "config.json").read_text()))
    lc = replace(cfg.learner, device="cpu", prefetch=False, encoder=encoder)
    replay = FakeReplay(obs_shape=(84, 84), stack=4, num_actions=5, pool=16)
    return learner_of(replace(cfg, learner=lc), EnvSpec((84, 84), np.uint8, 5, 4), replay)


def test_the_shipped_checkpoint_predates_the_encoder_keys_and_loads_as_nature() -> None:
    meta = json.loads((SHIPPED / "checkpoint" / "meta.json").read_text())
    raw = meta["geometry"]
    assert "encoder" not in raw and "encoder_width" not in raw  # written before the keys existed
    data = load_checkpoint(SHIPPED)
    assert (data.geometry["encoder"], data.geometry["encoder_width"]) == ("nature", 1)
    assert data.counters["updates"] == meta["counters"]["updates"]
    learner = _shipped_learner()  # what a default run's learner records and builds
    try:
        check_geometry(learner.geometry, data.geometry, SHIPPED)  # the check a resume makes first
        check_state_dict(learner.online.state_dict(), data.model["online"], "online")
        learner.online.load_state_dict(data.model["online"])  # strict: every name and shape of the nature CNN
        assert all(torch.equal(learner.online.state_dict()[k], v) for k, v in data.model["online"].items())
    finally:
        learner.close()


def test_a_checkpoint_of_another_encoder_is_refused_naming_the_field(tmp_path) -> None:
    impala = _shipped_learner("impala")
    try:
        with pytest.raises(CheckpointError) as err:
            impala.load_checkpoint(SHIPPED, restore_rng=False)
        message = str(err.value)
        assert "encoder: checkpoint 'nature' vs learner 'impala'" in message and "\n" not in message
    finally:
        impala.close()
    learner = make_learner(small_config(encoder="impala", encoder_width=2))
    try:
        learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    for overrides, words in (({}, "encoder: checkpoint 'impala' vs learner 'nature'"),
                             ({"encoder": "impala"}, "encoder_width: checkpoint 2 vs learner 1")):
        other = make_learner(small_config(**overrides))
        try:
            with pytest.raises(CheckpointError, match=re.escape(words)) as err:
                other.load_checkpoint(tmp_path)
            assert "\n" not in str(err.value)
        finally:
            other.close()


@pytest.mark.parametrize(("key", "value"), [("encoder", 3), ("encoder_width", "2"), ("encoder_width", 0)])
def test_a_wrongly_typed_encoder_in_meta_json_is_refused_by_name(tmp_path, key: str, value) -> None:
    learner = make_learner()
    try:
        learner.save_checkpoint(tmp_path)
    finally:
        learner.close()
    meta_path = tmp_path / "checkpoint" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["geometry"][key] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=rf"geometry\.{key}={re.escape(repr(value))} is invalid"):
        load_checkpoint(tmp_path)

"""The level campaign's seams: who trains a level and who plays checkpoints, as Protocols, and the real
ones, which run the project's own commands as child processes (so each command line can go into the shipped
provenance.json exactly as it ran).

Children run one at a time, each in a session of its own: Ctrl-C at the terminal reaches only the campaign,
which passes one SIGINT on to the child (`python -m launcher` then stops its collectors and writes its
checkpoint; a second Ctrl-C is passed on too and forces it). A child gets SIGTERM if the campaign dies (Linux
PR_SET_PDEATHSIG), and it inherits the campaign folder's lock, so a campaign started again waits until the
previous one's child has written its checkpoint and gone.
"""

from __future__ import annotations

import ast
import ctypes
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

PR_SET_PDEATHSIG = 1  # linux/prctl.h


ROOT = Path(__file__).resolve().parent.parent  # the repository


def recorded(path: Path) -> str:
    """How provenance.json names a path: relative to the repository when inside it (a record names no folder of
    the machine it was made on, and the same campaign folder in another clone is the same run), else absolute."""
    p = path.resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)


def shown(argv: Sequence[str]) -> str:
    """`argv` as the provenance records it: this interpreter's path as `python` (as World 1's commands read) and
    absolute paths as `recorded` names them."""
    return shlex.join(["python" if i == 0 and a == sys.executable else recorded(Path(a)) if os.path.isabs(a) else a
                       for i, a in enumerate(argv)])


class StopRequested(Exception):
    """The campaign was asked to stop (a signal) while a child ran; the child has exited."""


class ChildFailed(Exception):
    """A child command failed; the message is one line with its exit status and log."""


@dataclass(frozen=True)
class TrainJob:
    """Train one level's run until cleared or `max_seconds` (this segment's share of the level's budget)."""

    env_id: str
    run_dir: Path
    resume: bool  # continue the checkpointed run in run_dir
    max_seconds: float
    seed: int
    until_flags: float
    stop_flag_evals: int
    overrides: tuple[str, ...]
    log: Path  # where the child's output goes (appended)


@dataclass(frozen=True)
class TrainOutcome:
    exit_code: int
    reason: str | None  # the head's stop reason (flags_cleared, max_seconds, signal, ...); None if it printed none


class Trainer(Protocol):
    def command(self, job: TrainJob) -> list[str]:
        """The command line that trains `job` (it goes into the provenance)."""

    def train(self, job: TrainJob) -> TrainOutcome:
        """Train until the head stops; StopRequested when the campaign was interrupted meanwhile."""


class Evaluator(Protocol):
    """Plays checkpoints. Each call returns the command line it ran; outputs land under the given paths."""

    def suite(self, checkpoints: Sequence[Path], level: str, seeds: Sequence[int], episodes: int, out: Path,
              baselines: Path) -> str:
        """`level` over `checkpoints`: out/suite.json (evaluate/suite.py's format)."""

    def export(self, source: Path, out: Path) -> str:
        """The evaluation-only copy of `source` into out/checkpoint/."""

    def gif(self, checkpoint: Path, out: Path, seed: int, episodes: int) -> str:
        """Episodes at epsilon 0.05; the best one as out/best_episode.gif."""

    def random_policy(self, config: Path, level: str, out_dir: Path, episodes: int) -> str:
        """The random policy's row for `level` on the run's env: out_dir/random_policy_<level>*.json."""


def _die_with_parent() -> None:  # in the child, between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the child outlives a killed campaign
        pass


class Children:
    """Runs the campaign's child commands one at a time; `interrupt()` (from a signal handler) passes a SIGINT on."""

    def __init__(self, keep_fds: Sequence[int] = (), env: dict[str, str] | None = None) -> None:
        self.keep_fds = tuple(keep_fds)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.interrupted = False

    def interrupt(self) -> None:
        self.interrupted = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    def run(self, argv: Sequence[str], log: Path) -> int:
        """Run `argv` to its end, output appended to `log`; its exit status. StopRequested if interrupted."""
        if self.interrupted:
            raise StopRequested
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"$ {shlex.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, pass_fds=self.keep_fds, env=self.env,
                                         preexec_fn=_die_with_parent)
            try:
                code = self.proc.wait()
            finally:
                self.proc = None
        if self.interrupted:
            raise StopRequested
        return code

    def check(self, argv: Sequence[str], log: Path) -> str:
        """Run `argv`; ChildFailed unless it exits 0. Returns its command line."""
        code = self.run(argv, log)
        if code != 0:
            raise ChildFailed(f"{shown(argv)} exited {code}: {_tail(log)} (all of it in {log})")
        return shown(argv)


def done_reason(text: str) -> str | None:
    """The stop reason in `python -m launcher`'s last `[DONE] {...}` line of `text`."""
    for line in reversed(text.splitlines()):
        if line.startswith("[DONE] "):
            try:
                summary = ast.literal_eval(line[len("[DONE] "):])
            except (ValueError, SyntaxError):
                return None
            return str(summary.get("reason")) if isinstance(summary, dict) else None
    return None


class LauncherTrainer:
    """Trains with `python -m launcher` (`launcher` replaces that command, for tests)."""

    def __init__(self, children: Children, launcher: Sequence[str] = (sys.executable, "-m", "launcher")) -> None:
        self.children = children
        self.launcher = tuple(launcher)

    def command(self, job: TrainJob) -> list[str]:
        argv = [*self.launcher]
        if job.resume:
            argv += ["--resume", str(job.run_dir)]
        argv += ["--env", job.env_id, "--seed", str(job.seed), "--port", "0", "--until-flags", f"{job.until_flags:g}",
                 "--set", f"logging.stop_flag_evals={job.stop_flag_evals}"]
        for item in job.overrides:
            argv += ["--set", item]
        return argv + ["--run-dir", str(job.run_dir), "--max-seconds", f"{job.max_seconds:.0f}"]

    def train(self, job: TrainJob) -> TrainOutcome:
        start = job.log.stat().st_size if job.log.is_file() else 0
        try:
            code = self.children.run(self.command(job), job.log)
        finally:
            with open(job.log, "rb") as fh:
                fh.seek(start)
                reason = done_reason(fh.read().decode(errors="replace"))
        return TrainOutcome(code, reason)


class ModuleEvaluator:
    """Plays checkpoints with `python -m evaluate.suite` / `.export` / `evaluate` / `.random_policy`."""

    def __init__(self, children: Children, log: Path, epsilon: float = 0.05, max_steps: int | None = None,
                 python: str = sys.executable) -> None:
        self.children = children
        self.log = log
        self.epsilon = epsilon
        self.max_steps = max_steps  # a cap on steps per episode: for quick checks only, never for shipped figures
        self.python = python

    def _cap(self) -> list[str]:
        return [] if self.max_steps is None else ["--max-steps", str(self.max_steps)]

    def suite(self, checkpoints: Sequence[Path], level: str, seeds: Sequence[int], episodes: int, out: Path,
              baselines: Path) -> str:
        return self.children.check(
            # absolute: suite.json names a checkpoint relative to the repository only when it lies inside it, and the
            # Levels table looks for the provenance.json beside it there
            [self.python, "-m", "evaluate.suite", *(str(Path(c).resolve()) for c in checkpoints), "--levels", level, "--episodes",
             str(episodes), "--epsilon", f"{self.epsilon:g}", "--seeds", ",".join(map(str, seeds)), *self._cap(),
             "--baselines", str(baselines), "--out", str(out)], self.log)

    def export(self, source: Path, out: Path) -> str:
        return self.children.check([self.python, "-m", "evaluate.export", str(source), str(out)], self.log)

    def gif(self, checkpoint: Path, out: Path, seed: int, episodes: int) -> str:
        return self.children.check(
            [self.python, "-m", "evaluate", str(checkpoint), "--episodes", str(episodes), "--epsilon",
             f"{self.epsilon:g}", "--seed", str(seed), *self._cap(), "--out", str(out)], self.log)

    def random_policy(self, config: Path, level: str, out_dir: Path, episodes: int) -> str:
        return self.children.check(
            [self.python, "-m", "evaluate.random_policy", "--config", str(config), "--levels", level, "--episodes",
             str(episodes), *self._cap(), "--out-dir", str(out_dir)], self.log)


def _tail(path: Path, chars: int = 300) -> str:
    try:
        return " ".join(path.read_text(errors="replace")[-chars:].split())
    except OSError:
        return ""


def python_env() -> dict[str, str]:
    """The campaign's environment with this checkout first on PYTHONPATH (children import the same code)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env

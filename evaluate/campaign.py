"""`python -m evaluate.campaign --levels 2-1,3-1 --hours 4` (`make levels LEVELS="2-1 3-1" HOURS=4`): a level
campaign. For each level in turn it trains with the default recipe (and the level's own preset where
config_optimized.ENV_PRESETS has one) until the head's evaluations clear it (`--until-flags`, two evaluations
in a row by default) or its budget of training time is spent, then ships it (evaluate/campaign_ship.py: the
snapshot chosen by the suite on selection seeds, its evaluation-only export, GIF and provenance.json, the suite
on held-out seeds) and regenerates the README's Levels table (evaluate/levels_table.py).

Layout: the campaign folder (--dir, default runs/campaign) holds campaign.json (its state), campaign.lock, logs/
and one run per level, <dir>/<level>/ (e.g. runs/campaign/2-1/). A level folder that already holds a checkpointed
run is adopted: trained with the same flags (--seed, --until-flags, --set ...), it is resumed like one of the
campaign's own. The budget (--hours per level) counts the run's training time across all its segments
(evaluate/run_time.py), not the campaign's wall time.

Continuing a shipped network: `--set learner.init_from=docs/checkpoints/mario-2-1-cpu/checkpoint` starts each
level's new run from that network (fresh optimizer, counters and replay); its provenance then counts the source's
training into the totals (evaluate/lineage.py).

Stopping: Ctrl-C (or SIGTERM) passes one SIGINT to the running child, which for training writes its checkpoint;
the campaign then exits 130 with nothing left running, and the same command continues where it stopped (the
level and the run it was on), as it does after a crash or a kill. One log line per level says where it stands.
Exit status: 0 every level shipped; 1 a child failed (the line names its log); 2 bad arguments, a corrupt or
foreign campaign.json, or another campaign on the folder (one line); 130 stopped by a signal.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import config_optimized as opt
from evaluate import campaign_state, levels_table
from evaluate.campaign_parts import (
    ChildFailed,
    Children,
    Evaluator,
    LauncherTrainer,
    ModuleEvaluator,
    StopRequested,
    Trainer,
    TrainJob,
    python_env,
    shown,
)
from evaluate.campaign_ship import ROOT, ShipTo, foreign_ship, ship_level
from evaluate.levels import Level, LevelError, parse_levels
from evaluate.lineage import LineageError, prior_training
from evaluate.run_time import training_seconds
from shared.config import ConfigError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STOPPED = 0, 1, 2, 130
MIN_SEGMENT_S = 60.0  # less budget left than this: the level is done (a head's start alone takes 10-20 s)
LOCK_FILE = "campaign.lock"
LOCK_WAIT_S = 180.0  # a killed campaign's training child may still be writing its final checkpoint


class CampaignError(Exception):
    """Bad input (exit 2); the message is one line naming it."""


@dataclass(frozen=True)
class Plan:
    folder: Path
    levels: tuple[Level, ...]
    budget_s: float  # training seconds per level
    settings: campaign_state.Settings
    ship: ShipTo
    readme: Path
    max_steps: int | None = None  # cap on steps per evaluation episode: quick checks only

    def run_dir(self, level: Level) -> Path:
        return self.folder / level.name.replace(" ", "-")


def head_seeds_bound(settings: campaign_state.Settings, budget_s: float, eval_every_s: float,
                     eval_episodes: int) -> int:
    """One past the largest evaluation seed a level's head uses within `budget_s`: its k-th evaluation (counted
    from 0 in each segment) plays seed + k, its episode i env seed seed + k + i (launcher/evaluator.py)."""
    return settings.seed + math.ceil(budget_s / eval_every_s) + eval_episodes + 1


def check_seeds(settings: campaign_state.Settings, head_bound: int) -> None:
    """CampaignError unless the selection and held-out seeds are disjoint, and both above the heads' seeds."""
    sel, held = set(settings.selection_seeds), set(settings.held_out_seeds)
    if sel & held:
        raise CampaignError(f"--selection-seeds and --held-out-seeds share {sorted(sel & held)}: the held-out "
                            "figures must come from episodes that chose nothing")
    clash = sorted(s for s in sel | held if settings.seed <= s < head_bound)
    if clash:
        raise CampaignError(f"seeds {clash} are among the head's own evaluation seeds ({settings.seed}..{head_bound - 1} "
                            f"with --seed {settings.seed} and this budget): pick seeds from {head_bound} up")


def has_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / name / "meta.json").is_file() for name in ("checkpoint", "checkpoint.old"))


def check_no_head(run_dir: Path) -> None:
    """CampaignError when a head is serving in `run_dir` (its endpoints.json answers): another training there."""
    try:
        control = json.loads((run_dir / "endpoints.json").read_text())["control"]
        host, port = control.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=1.0):
            pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # none written, a stale one (a killed head), or not TCP: nothing answers there
    raise CampaignError(f"{run_dir}: a head is training in it ({control} answers): let it finish or stop it "
                        "(Ctrl-C), then run the campaign again")


class Campaign:
    """The loop over levels; `trainer` and `evaluator` are the seams (tests give fakes)."""

    def __init__(self, plan: Plan, trainer: Trainer, evaluator: Evaluator,
                 say: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.plan = plan
        self.trainer = trainer
        self.evaluator = evaluator
        self.say = say

    def run(self) -> None:
        """Every level trained and shipped; StopRequested or ChildFailed end it early (the state stays)."""
        plan = self.plan
        plan.folder.mkdir(parents=True, exist_ok=True)
        state = campaign_state.load(plan.folder, plan.settings)
        for level in plan.levels:  # before any training: a level whose shipping would fail fails now
            if state.level(level.name).stage != "shipped" and \
                    (taken := foreign_ship(level, plan.run_dir(level), plan.ship)) is not None:
                raise CampaignError(f"{taken}: a shipped checkpoint this campaign's run {plan.run_dir(level)} did not "
                                    "make (its provenance.json names no such campaign_run): the campaign does not "
                                    "replace it; move it away, or ship under another --tag")
        for level in plan.levels:
            stage = state.level(level.name).stage
            if stage in ("pending", "training"):
                state = self._train(level, state)
            if state.level(level.name).stage == "trained":
                state = self._ship(level, state)
            else:
                self.say(self._where(level, state))

    def _save(self, state: campaign_state.CampaignState) -> campaign_state.CampaignState:
        campaign_state.save(self.plan.folder, state)
        return state

    def _where(self, level: Level, state: campaign_state.CampaignState) -> str:
        p = state.level(level.name)
        trained = f"{training_seconds(self.plan.run_dir(level)) / 60:.0f} min trained"
        if p.stage == "shipped":
            s = p.shipped
            return (f"level {level.name}: shipped {s['name']} ({p.reason}, {trained}): held-out flags "
                    f"{round(s['flag_rate'] * s['episodes'])}/{s['episodes']}, mean x_pos {s['mean_x_pos']:.0f}")
        return f"level {level.name}: {p.stage} ({trained})"

    def _train(self, level: Level, state: campaign_state.CampaignState) -> campaign_state.CampaignState:
        plan, s = self.plan, self.plan.settings
        run_dir = plan.run_dir(level)
        if state.level(level.name).stage == "pending" and has_checkpoint(run_dir):
            note = (f"(adopted: {training_seconds(run_dir) / 60:.0f} min trained in {run_dir} before the campaign, "
                    "by a command not recorded here)")
            state = self._save(state.with_level(level.name, commands=(note,)))
            self.say(f"level {level.name}: adopting the run in {run_dir}")
        reason = "budget"
        while True:
            trained = training_seconds(run_dir)
            left = plan.budget_s - trained
            if left < MIN_SEGMENT_S:
                break
            check_no_head(run_dir)
            job = TrainJob(level.env_id, run_dir, has_checkpoint(run_dir), left, s.seed, s.until_flags,
                           s.stop_flag_evals, s.overrides, plan.folder / "logs" / f"{run_dir.name}-train.log")
            p = state.level(level.name)
            state = self._save(state.with_level(level.name, stage="training",
                                                commands=(*p.commands, shown(self.trainer.command(job)))))
            self.say(f"level {level.name}: training ({'resuming' if job.resume else 'new run in'} {run_dir}): "
                     f"{trained / 60:.0f} of {plan.budget_s / 60:.0f} min trained, up to {left / 60:.0f} more; "
                     f"log {job.log}")
            outcome = self.trainer.train(job)
            if outcome.reason == "signal":
                raise StopRequested  # someone stopped the head itself: the campaign stops with it
            if outcome.exit_code != 0 or outcome.reason not in ("flags_cleared", "max_seconds"):
                raise ChildFailed(f"level {level.name}: training exited {outcome.exit_code} (stop reason "
                                  f"{outcome.reason}); see {run_dir / 'head.log'} and {job.log}")
            if outcome.reason == "flags_cleared":
                reason = "flags_cleared"
                break
            if training_seconds(run_dir) <= trained:
                raise ChildFailed(f"level {level.name}: a training segment recorded no time in "
                                  f"{run_dir / 'metrics.jsonl'}; see {job.log}")
        trained = training_seconds(run_dir)
        self.say(f"level {level.name}: trained ({'cleared by the head' if reason == 'flags_cleared' else 'budget spent'},"
                 f" {trained / 60:.0f} min)")
        return self._save(state.with_level(level.name, stage="trained", reason=reason, trained_s=trained))

    def _ship(self, level: Level, state: campaign_state.CampaignState) -> campaign_state.CampaignState:
        plan = self.plan
        work = plan.folder / "ship" / plan.run_dir(level).name
        shipped = ship_level(level, plan.run_dir(level), work, plan.settings, state.level(level.name),
                             self.evaluator, plan.ship, self.say)
        write_table(plan.ship.results, plan.readme)
        self.say(f"level {level.name}: Levels table written into {plan.readme}")
        state = self._save(state.with_level(level.name, stage="shipped", shipped=shipped))
        self.say(self._where(level, state))
        return state


def write_table(results: Path, readme: Path) -> None:
    """The README's Levels table from every suite under results/suite/ (evaluate/levels_table.py)."""
    table = levels_table.render(sorted((results / "suite").glob("*/suite.json")), root=ROOT)
    readme.write_text(levels_table.splice(readme.read_text(), table, str(readme)))


# ---------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see python -m evaluate.campaign --help)\n")


def _seed_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CampaignError(f"{flag}={text!r}: allowed comma-separated integers >= 0, e.g. 100,101,102") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise CampaignError(f"{flag}={text!r}: allowed distinct integers >= 0")
    return seeds


def default_machine() -> str:
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a broken torch still trains nothing here; say what is known
        pass
    return f"{os.cpu_count()}-core {platform.machine()} machine, {gpu}"


def parse(argv: Sequence[str] | None) -> Plan:
    p = _Parser(prog="python -m evaluate.campaign", description=__doc__.splitlines()[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", required=True, help="levels in order, comma- or space-separated: 2-1,3-1")
    p.add_argument("--hours", type=float, required=True, help="training time per level (across resumes)")
    p.add_argument("--dir", type=Path, default=Path("runs/campaign"),
                   help="campaign folder: state, logs and one run per level, <dir>/<level>/ (default runs/campaign)")
    p.add_argument("--seed", type=int, default=0, help="training seed of every level (default 0)")
    p.add_argument("--until-flags", type=float, default=opt.CAMPAIGN_UNTIL_FLAGS, metavar="RATE",
                   help=f"stop a level's training at this flag rate (default {opt.CAMPAIGN_UNTIL_FLAGS})")
    p.add_argument("--stop-flag-evals", type=int, default=opt.CAMPAIGN_STOP_FLAG_EVALS, metavar="N",
                   help=f"... in N evaluations in a row (default {opt.CAMPAIGN_STOP_FLAG_EVALS})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="passed to every training command (python -m launcher --set); repeatable")
    p.add_argument("--selection-seeds", default=",".join(map(str, opt.CAMPAIGN_SELECTION_SEEDS)),
                   help="suite seeds that choose the snapshot to ship")
    p.add_argument("--held-out-seeds", default=",".join(map(str, opt.CAMPAIGN_HELD_OUT_SEEDS)),
                   help="suite seeds of the Levels table's figures (they choose nothing)")
    p.add_argument("--episodes", type=int, default=opt.CAMPAIGN_EPISODES_PER_SEED, help="suite episodes per seed")
    p.add_argument("--docs", type=Path, default=ROOT / "docs",
                   help="where shipped checkpoints, random-policy rows and GIFs go (default docs/)")
    p.add_argument("--results", type=Path, default=ROOT / "results",
                   help="where the suites' raw files go, the Levels table's source (default results/)")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md", help="whose Levels table is rewritten")
    p.add_argument("--tag", default="cpu", help="shipped names: mario-<level>-<tag> (default cpu)")
    p.add_argument("--machine", default=None, help="what trained, for the provenance (default: detected)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="cap on steps per evaluation episode: quick checks only, never for shipped figures")
    args = p.parse_args(argv)
    try:
        levels = parse_levels(",".join(args.levels.replace(",", " ").split()))
    except LevelError as exc:
        raise CampaignError(f"--levels: {exc}") from None
    if not (math.isfinite(args.hours) and args.hours > 0):
        raise CampaignError(f"--hours={args.hours}: allowed a number > 0")
    if not (0 < args.until_flags <= 1):
        raise CampaignError(f"--until-flags={args.until_flags}: allowed a flag rate in (0, 1]")
    for flag, value in (("--stop-flag-evals", args.stop_flag_evals), ("--episodes", args.episodes)):
        if value < 1:
            raise CampaignError(f"{flag}={value}: allowed an integer >= 1")
    if args.max_steps is not None and args.max_steps < 1:
        raise CampaignError(f"--max-steps={args.max_steps}: allowed an integer >= 1")
    if args.seed < 0:
        raise CampaignError(f"--seed={args.seed}: allowed an integer >= 0")
    settings = campaign_state.Settings(args.seed, args.until_flags, args.stop_flag_evals, tuple(args.overrides),
                                       _seed_list("--selection-seeds", args.selection_seeds),
                                       _seed_list("--held-out-seeds", args.held_out_seeds))
    budget_s = args.hours * 3600.0
    for level in levels:  # each level's config as its training command will build it: bad --set values fail here
        try:
            cfg = opt.load_config("auto", [f"env.env_id={level.env_id}", f"env.seed={args.seed}",
                                           f"logging.stop_flag_rate={args.until_flags}",
                                           f"logging.stop_flag_evals={args.stop_flag_evals}", *args.overrides])
            cfg.check_valid()
        except ConfigError as exc:
            raise CampaignError(f"{level.name}: {' '.join(str(exc).split())}") from None
        check_seeds(settings, head_seeds_bound(settings, budget_s, cfg.logging.eval_every_s,
                                               cfg.logging.eval_episodes))
        if cfg.learner.init_from:  # a network to continue: the ship must be able to say what it had trained
            try:
                prior_training(Path(cfg.learner.init_from))
            except LineageError as exc:
                raise CampaignError(f"learner.init_from: {exc}") from None
    if not args.readme.is_file():
        raise CampaignError(f"--readme {args.readme}: no such file")
    ship = ShipTo(args.docs, args.results, args.tag, args.machine or default_machine(), args.episodes,
                  opt.CAMPAIGN_GIF_EPISODES, opt.CAMPAIGN_RANDOM_EPISODES)
    return Plan(args.dir, levels, budget_s, settings, ship, args.readme, args.max_steps)


def lock(folder: Path, say: Callable[[str], None], wait_s: float | None = None) -> int:
    """An fd holding the folder's exclusive lock (children inherit it); CampaignError when another holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise CampaignError(f"{folder / LOCK_FILE}: another campaign (or its training child) is running "
                                    "on this folder") from None
            if not told:
                say(f"waiting for the process holding {folder / LOCK_FILE} (a stopped campaign's child writing its "
                    "checkpoint?)")
                told = True
            time.sleep(0.5)


Parts = Callable[[Children, Plan], tuple[Trainer, Evaluator]]


def real_parts(children: Children, plan: Plan) -> tuple[Trainer, Evaluator]:
    return LauncherTrainer(children), ModuleEvaluator(children, plan.folder / "logs" / "evaluate.log",
                                                      max_steps=plan.max_steps)


def main(argv: Sequence[str] | None = None, parts: Parts | None = None) -> int:
    say: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
    try:
        plan = parse(argv)
        fd = lock(plan.folder, say)
    except CampaignError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    children = Children(keep_fds=(fd,), env=python_env())
    trainer, evaluator = (parts or real_parts)(children, plan)

    def on_signal(signum: int, _frame: object) -> None:  # no print(): it may interrupt one (a reentrant write)
        os.write(sys.stderr.fileno(), f"signal {signum}: stopping; the running child gets it too (training writes "
                                      "its checkpoint; a second Ctrl-C forces it)\n".encode())
        children.interrupt()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        Campaign(plan, trainer, evaluator, say).run()
    except StopRequested:
        say(f"stopped: the same command continues where this one stopped ({plan.folder / campaign_state.STATE_FILE})")
        return EXIT_STOPPED
    except campaign_state.StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CampaignError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ChildFailed, levels_table.TableError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(fd)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

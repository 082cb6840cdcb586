"""`python -m evaluate.levels_table [SUITE_JSON ...] [--write | --check]`: the README's Levels table.

Built from the suites' JSON only (default: every `results/suite/*/suite.json`), so the table says what the
shipped checkpoints measurably do. One row per level and evaluated checkpoint: the checkpoint trained on
that level first, then any other checkpoint evaluated there (what a policy trained on another level
does on it). Columns: the flag rate and mean x_pos over the suite's episodes, the training behind the
checkpoint (env steps from its counters, or the `env_steps` of the `provenance.json` beside it where a run
started from another's network; minutes, machine and date from that file, "not recorded" where there is
none), the preset it was trained with (that file's `preset`: a level's own entry in config_optimized.ENV_PRESETS,
or none) and the random policy's row for the level. Under the table: the evaluation seeds behind the rows, and
whether they were held out (every checkpoint's provenance names them as its `held_out_seeds`, which the level
campaign, evaluate/campaign.py, writes: its snapshot was chosen on other seeds).

`--write` replaces the block between the README's `<!-- levels-table:start -->` and
`<!-- levels-table:end -->` markers; `--check` exits 1 when that block differs from what the suites
give (the test suite runs it). Exit status 2: a missing or malformed suite file, or a README without
the markers (one line naming it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluate.levels import LevelError, parse_level

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- levels-table:start -->", "<!-- levels-table:end -->"
HEADER = ("| level | checkpoint (trained on) | flags at epsilon 0.05 | mean x_pos | training | preset | random policy: "
          "flags, mean x_pos |\n|---|---|---:|---:|---|---|---:|")


class TableError(Exception):
    """Bad input (exit 2): the message is one line naming it."""


def default_suites(root: Path = ROOT) -> list[Path]:
    return sorted((root / "results" / "suite").glob("*/suite.json"))


def _level_of(env_id: str) -> str:
    """A checkpoint's training env as the suite names levels (`1-2`, `1-2-v1`, `random W1`); the id otherwise."""
    try:
        return parse_level(env_id).name
    except LevelError:  # e.g. the full game, SuperMarioBros-v0: no level of its own
        return env_id


def _provenance_path(checkpoint: dict[str, Any], root: Path) -> Path:
    return root / Path(checkpoint["path"]).parent / "provenance.json"


def _provenance(checkpoint: dict[str, Any], root: Path) -> dict[str, Any] | None:
    path = _provenance_path(checkpoint, root)
    if not path.is_file():
        return None
    try:
        prov = json.loads(path.read_text())
    except ValueError as exc:
        raise TableError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(prov, dict):
        raise TableError(f"{path}: not a JSON object")
    return prov


def _training(checkpoint: dict[str, Any], root: Path) -> str:
    steps = int(checkpoint.get("counters", {}).get("env_steps", 0))
    prov_path = _provenance_path(checkpoint, root)
    prov = _provenance(checkpoint, root)
    if prov is None:
        return f"{steps / 1000:,.0f}k env steps; time and machine not recorded"
    try:
        # a network started with --init-from has fresh counters: its provenance gives the whole lineage's total
        steps = int(prov.get("env_steps", steps))
        return (f"{steps / 1000:,.0f}k env steps, {prov['training_minutes']:.0f} min on {prov['machine']} "
                f"({prov['date']})")
    except (ValueError, KeyError, TypeError) as exc:
        raise TableError(f"{prov_path}: needs training_minutes, machine and date, and a whole number as env_steps "
                         f"where it has one ({type(exc).__name__}: {exc})") from exc


def rows(suite: dict[str, Any], root: Path = ROOT) -> list[tuple[str, bool, str]]:
    """(level, trained on it, table row) for every level x checkpoint of one suite."""
    by_path = {c["path"]: c for c in suite["checkpoints"]}
    out = []
    for level in suite["levels"]:
        rnd = level["random"]
        random_cell = f"{rnd['flag_rate']:.0%}, {rnd['mean_x_pos']:,.0f}"
        for result in level["checkpoints"]:
            ckpt = by_path[result["checkpoint"]]
            trained_on = _level_of(ckpt["env"]["env_id"])
            name = Path(ckpt["path"]).parent.name
            flags = round(result["flag_rate"] * result["episodes"])
            prov = _provenance(ckpt, root)
            preset = str(prov.get("preset", "not recorded")) if prov is not None else "not recorded"
            out.append((level["name"], trained_on == level["name"],
                        f"| {level['name']} | `{name}` ({trained_on}) | {flags}/{result['episodes']} "
                        f"({result['flag_rate']:.0%}) | {result['mean_x_pos']:,.0f} | {_training(ckpt, root)} | "
                        f"{preset} | {random_cell} |"))
    return out


def seeds_note(suite: dict[str, Any], root: Path = ROOT) -> tuple[str, bool]:
    """(the suite's episodes and evaluation seeds, e.g. "10 episodes under each of the seeds 0,1,2"; whether every
    checkpoint in it was chosen on other seeds: its provenance's held_out_seeds are these)."""
    settings = suite["settings"]
    seeds = [int(s) for s in settings["eval_seeds"]]
    held_out = all((prov := _provenance(c, root)) is not None and prov.get("held_out_seeds") == seeds
                   for c in suite["checkpoints"])
    return f"{int(settings['episodes_per_seed'])} episodes under each of the seeds {','.join(map(str, seeds))}", held_out


def render(paths: Sequence[Path], root: Path = ROOT) -> str:
    """The table for `paths`: levels in order, each level's own checkpoints first."""
    collected = []
    notes: dict[tuple[str, bool], set[str]] = {}  # (seeds, held out) -> the levels measured so
    for path in paths:
        try:
            suite = json.loads(Path(path).read_text())
            collected += rows(suite, root)
            notes.setdefault(seeds_note(suite, root), set()).update(lv["name"] for lv in suite["levels"])
        except OSError as exc:
            raise TableError(f"{path}: cannot read ({exc.strerror})") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise TableError(f"{path}: not a suite.json ({type(exc).__name__}: {exc})") from exc
    if not collected:
        raise TableError("no suite results: pass suite.json files (python -m evaluate.suite writes them)")
    collected.sort(key=lambda r: (r[0], not r[1]))
    lines = [f"- {', '.join(sorted(names))}: {seeds} ("
             + ("held out: the snapshots were chosen on other seeds)" if held_out else "not held out)")
             for (seeds, held_out), names in sorted(notes.items())]
    return "\n".join([HEADER, *(r[2] for r in collected), "", "Evaluation seeds (epsilon 0.05):", *lines])


def splice(readme: str, table: str, where: str = "README.md") -> str:
    """`readme` with the block between the markers replaced by `table`."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise TableError(f"{where}: no '{START}' ... '{END}' block to fill")
    return readme[: start + len(START)] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluate.levels_table", description=__doc__.splitlines()[0])
    ap.add_argument("suites", type=Path, nargs="*", help="suite.json files (default: results/suite/*/suite.json)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the README's table")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README's table is not the suites' table")
    args = ap.parse_args(argv)
    try:
        table = render(args.suites or default_suites())
        if not (args.write or args.check):
            print(table)
            return 0
        try:
            readme = args.readme.read_text()
        except OSError as exc:
            raise TableError(f"{args.readme}: cannot read ({exc.strerror})") from exc
        new = splice(readme, table, str(args.readme))
    except TableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != readme:
            print(f"{args.readme}: the Levels table differs from the suites' (python -m evaluate.levels_table --write)",
                  file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(new)
    print(f"wrote the Levels table into {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

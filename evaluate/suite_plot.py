"""suite.png from a suite.json dict (headless: matplotlib's Agg backend).

Two panels, flag rate and mean x_pos, one group per level: a bar at the IQM across checkpoints with
its 95% bootstrap interval as whiskers, each checkpoint's own value as a dot, and the random policy's
value (docs/random_policy_*.json) as a red line across the bar where one was recorded for the level.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evaluate.plots import pyplot, save_figure

PANELS = (("flag_rate", "flag rate"), ("mean_x_pos", "mean x_pos"))


def plot_suite(report: Mapping[str, Any], out_png: str | Path) -> Path:
    plt = pyplot()
    levels = report["levels"]
    n = len(report["checkpoints"])
    s = report["settings"]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(max(8.0, 2.2 * len(levels) + 3.0), 4.2))
    xs = range(len(levels))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        iqm = [lv["across_checkpoints"][key]["iqm"] for lv in levels]
        low = [lv["across_checkpoints"][key]["ci_low"] for lv in levels]
        high = [lv["across_checkpoints"][key]["ci_high"] for lv in levels]
        ax.bar(xs, iqm, width=0.6, color="tab:blue", alpha=0.75,
               label=f"IQM over {n} checkpoint{'s' if n != 1 else ''}")
        ax.errorbar(xs, iqm, yerr=[[m - lo for m, lo in zip(iqm, low, strict=True)],
                                   [hi - m for m, hi in zip(iqm, high, strict=True)]],
                    fmt="none", ecolor="black", capsize=6, linewidth=1.3, label="95% bootstrap CI")
        for x, m, hi in zip(xs, iqm, high, strict=True):
            ax.annotate(f"{m:.0%}" if key == "flag_rate" else f"{m:.0f}", (x, hi), xytext=(0, 4),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
        random_labelled = False
        for x, lv in zip(xs, levels, strict=True):
            values = [row[key] for row in lv["checkpoints"]]
            offsets = [0.0] if len(values) == 1 else [-0.18 + 0.36 * k / (len(values) - 1)
                                                      for k in range(len(values))]
            ax.plot([x + o for o in offsets], values, linestyle="none", marker="o", markersize=4,
                    color="tab:orange", label="one checkpoint" if x == 0 else None)
            rnd = lv.get("random")
            if rnd and isinstance(rnd.get(key), (int, float)):
                ax.hlines(rnd[key], x - 0.38, x + 0.38, colors="tab:red", linewidth=2.2,
                          label=None if random_labelled else "random policy")
                random_labelled = True
        ax.set_xticks(list(xs), [lv["name"] for lv in levels])
        ax.set_xlabel("level")
        ax.set_ylabel(label)
        if key == "flag_rate":
            ax.set_ylim(0.0, 1.1)
        else:
            ax.set_ylim(0.0, ax.get_ylim()[1] * 1.08)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=7)
    fig.suptitle(f"{s['episodes_per_level']} episodes per level and checkpoint (seeds "
                 f"{','.join(map(str, s['eval_seeds']))}), epsilon {s['epsilon']}"
                 + (f", max {s['max_steps']} steps" if s.get("max_steps") else "")
                 + (" -- one checkpoint: CI = point" if n == 1 else ""), fontsize=10)
    return save_figure(plt, fig, out_png)

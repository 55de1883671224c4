"""What every benchmark keeps of its run besides the printed table: `--json PATH` (the
figures, with the command that measured them) and `--plot PATH` (tf_bps against the
peer measured in the same run, as grouped bars drawn with matplotlib).

    parser = argparse.ArgumentParser(...)
    report.add_arguments(parser)
    args = parser.parse_args()
    figures = report.Report("push_pull, 2 workers", unit="GB/s", higher_is_better=True)
    figures.add("64 MB", "tf_bps", 1.93)
    figures.add("64 MB", "MultiWorkerMirroredStrategy", 0.41)
    report.save(args, figures)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import textwrap
import time


def _plot_path(path: str) -> str:
    """--plot's value, refused before the run when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise argparse.ArgumentTypeError("needs matplotlib: pip install matplotlib") from None
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    parser.add_argument("--plot", metavar="PATH", type=_plot_path,
                        help="also draw them to PATH (.png or .svg; needs matplotlib)")


class Report:
    """Figures of one kind (one unit) by case (a size, a layout) and by series (tf_bps,
    the peer); a benchmark with figures of several kinds keeps one Report per kind."""

    def __init__(self, title: str, unit: str, higher_is_better: bool = True):
        self.title, self.unit, self.higher_is_better = title, unit, higher_is_better
        self.rows: list[dict] = []

    def add(self, case: str, series: str, value: float) -> None:
        self.rows.append({"case": case, "series": series, "value": float(value)})

    def as_dict(self) -> dict:
        return {"title": self.title, "unit": self.unit,
                "higher_is_better": self.higher_is_better, "rows": self.rows}


def save(args: argparse.Namespace, *reports: Report) -> None:
    """Writes --json and draws --plot, whichever were asked for."""
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": [os.path.basename(sys.executable), *sys.argv],
                       "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
                       "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "figures": [report.as_dict() for report in reports]}, out, indent=1)
        print(f"figures written to {args.json}")
    if args.plot:
        plot(args.plot, reports)
        print(f"plot drawn to {args.plot}")


def plot(path: str, reports: tuple[Report, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(reports), figsize=(6.4 * len(reports), 4.8),
                                squeeze=False)
    for report, ax in zip(reports, axes[0], strict=True):
        cases = list(dict.fromkeys(row["case"] for row in report.rows))
        series = list(dict.fromkeys(row["series"] for row in report.rows))
        width = 0.8 / len(series)
        for index, name in enumerate(series):
            values = {row["case"]: row["value"] for row in report.rows if row["series"] == name}
            xs = [case_index + (index - (len(series) - 1) / 2) * width
                  for case_index, case in enumerate(cases) if case in values]
            bars = ax.bar(xs, [values[c] for c in cases if c in values], width, label=name)
            ax.bar_label(bars, fmt=lambda v: f"{v:.3g}" if v < 1000 else f"{v:.0f}",
                         fontsize=7)
        long_labels = max(map(len, cases)) > 12  # layouts' names: tilted, or they collide
        ax.set_xticks(range(len(cases)), cases, rotation=20 if long_labels else 0,
                      ha="right" if long_labels else "center", fontsize=8)
        better = "higher" if report.higher_is_better else "lower"
        ax.set_ylabel(f"{report.unit} ({better} is better)")
        ax.set_title(textwrap.fill(report.title, 60), fontsize=9)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14 - long_labels * 0.1),
                  ncol=min(len(series), 3))  # below the bars, never over them
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

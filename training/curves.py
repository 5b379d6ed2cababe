"""Learning curves of training runs, as a picture: the DAgger rounds (training/dagger.py) and
the checkpoint evaluations on the validation split (training/train.py), per run.

``rdtune train`` writes ``RUN_DIR/learning_curves.png`` at the end of every run; to compare
runs in one figure::

    python -m training.curves RUN_DIR [RUN_DIR ...] --out curves.png

Left: the policy's agreement with the oracle on the states each round visited (before the
round's refit), and the refit's loss. Right: the mean validation return of each evaluated
checkpoint against PPO's env steps (step 0: the warm start, when there is one).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_learning_curves(
    runs: Sequence[str | Path], path: str | Path, labels: Sequence[str] | None = None
) -> Path | None:
    """Write the figure for ``runs`` (run directories) to ``path``; None when no run has
    a DAgger round or an evaluation to show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [Path(r) for r in runs]
    labels = list(labels) if labels else [r.name for r in runs]
    data = [(_rows(r / "dagger.jsonl"), _rows(r / "evaluations.jsonl")) for r in runs]
    if not any(d or e for d, e in data):
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    loss_axis = left.twinx()
    for label, (rounds, evals) in zip(labels, data, strict=True):
        if rounds:
            x = [r["iteration"] for r in rounds]
            (line,) = left.plot(x, [100 * r["agreement"] for r in rounds], "o-", label=label)
            loss_axis.plot(x, [r["loss"] for r in rounds], "s--", color=line.get_color())
        if evals:
            right.plot(
                [e["timesteps"] for e in evals], [e["mean_return"] for e in evals], "o-",
                label=label,
            )  # fmt: skip
    left.set_xlabel("DAgger round")
    left.set_ylabel("agreement with the oracle, own states (%)  [o]")
    loss_axis.set_ylabel("imitation loss  [s, dashed]")
    left.set_title("DAgger from the safe oracle")
    right.set_xlabel("PPO env steps (0: the warm start)")
    right.set_ylabel("mean validation return")
    right.set_title("checkpoint evaluations")
    handles, names = (left if not any(e for _, e in data) else right).get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize="small")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.curves", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("runs", nargs="+", help="run directories written by 'rdtune train'")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--labels", help="comma-separated names for the runs (default: dirs)")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        parser.error(f"{len(labels)} labels for {len(args.runs)} runs")
    written = plot_learning_curves(args.runs, args.out, labels)
    if written is None:
        print("nothing to plot: no dagger.jsonl or evaluations.jsonl in those runs")
        return 1
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

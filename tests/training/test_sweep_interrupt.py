"""A sweep stopped with Ctrl+C: unfinished trials are marked interrupted (not done), Ray's
resume advice is not passed on, and ``rdtune train --sweep`` exits 130. Ray Tune's Tuner
is replaced by a stand-in: no Ray is started."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import yaml

from tests.training.tiny_runs import TINY, tiny_config

FINAL = {"best_return": 1.0, "best_violation_rate": 0.05, "final_return": 0.5,
         "violation_rate": 0.0, "done": True}  # fmt: skip
EVAL = {"timesteps": 64, "mean_return": 0.2, "best_return": 0.3, "violation_rate": 0.1}


def _result(seed: int, metrics: dict | None, error: Exception | None = None):
    return SimpleNamespace(
        config={"overrides": {"seed": seed}}, metrics=metrics, error=error, path=f"/t/{seed}"
    )


@pytest.mark.parametrize(
    ("metrics", "error", "status"),
    [
        (FINAL, None, "done"),
        (EVAL, None, "interrupted"),  # stopped after an evaluation, before the end
        ({}, None, "interrupted"),  # stopped before its first report
        (None, None, "interrupted"),  # never started
        (EVAL, RuntimeError("boom"), "error"),
    ],
    ids=["final-report", "evaluation-report", "no-report", "not-started", "error"],
)
def test_a_trial_is_done_only_after_its_final_report(metrics, error, status):
    from training.sweep import trial_row

    row = trial_row(_result(0, metrics, error))
    assert row["status"] == status
    assert row["final_return"] == (0.5 if status == "done" else None)


class _Tuner:
    """Ray Tune's Tuner, as far as run_sweep uses it; ``fit`` as set by the test."""

    fit_result: object = None

    def __init__(self, *args, **kwargs) -> None:
        pass

    def fit(self):
        logging.getLogger("ray.tune.tune").warning(
            "Experiment has been interrupted, but the most recent state was saved.\n"
            'Resume experiment with: Tuner.restore(path="/x", trainable=...)'
        )
        logging.getLogger("ray.tune.tune").warning("Trials did not complete")
        if isinstance(self.fit_result, BaseException):
            raise self.fit_result
        return self.fit_result


@pytest.mark.parametrize(
    ("fit_result", "statuses"),
    [
        ([_result(0, FINAL), _result(1, EVAL)], ["done", "interrupted"]),
        ([_result(1, None), _result(0, EVAL)], ["interrupted", "interrupted"]),
        (KeyboardInterrupt(), ["interrupted", "interrupted"]),  # a second Ctrl+C
    ],
    ids=["one-finished", "none-finished", "keyboard-interrupt"],
)
def test_an_interrupted_sweep_marks_its_trials(tmp_path, monkeypatch, fit_result, statuses):
    import ray
    from ray import tune

    from training.sweep import run_sweep

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray started or stopped
    monkeypatch.setattr(tune, "Tuner", type("T", (_Tuner,), {"fit_result": fit_result}))
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("ray.tune.tune").addHandler(handler)
    try:
        result = run_sweep(tiny_config(tmp_path / "tiny"), {"seed": [0, 1]})
    except KeyboardInterrupt:
        pytest.fail("the interruption escaped run_sweep without a sweep.json")
    finally:
        logging.getLogger("ray.tune.tune").removeHandler(handler)
    assert [t["status"] for t in result.trials] == statuses
    assert result.interrupted == [t["trial"] for t in result.trials if t["status"] != "done"]
    saved = json.loads((tmp_path / "tiny-sweep" / "sweep.json").read_text())
    assert [t["status"] for t in saved] == statuses
    assert "| seed=1 | interrupted |" in result.summary()
    # chosen on selection's episodes: the final (test split) return is not in the table
    assert "0.500" not in result.summary() and "final" not in result.summary().split("\n")[1]
    assert seen == ["Trials did not complete"]  # Ray's resume advice is not passed on


@pytest.mark.parametrize(
    ("statuses", "code"),
    [(["done", "done"], 0), (["done", "interrupted"], 130), (["error", "done"], 0)],
)
def test_rdtune_train_exits_130_when_the_sweep_was_interrupted(
    tmp_path, monkeypatch, capsys, statuses, code
):
    import training.sweep
    from training.sweep import SweepResult
    from tuner.cli import main

    rows = [{"trial": f"seed={i}", "status": s} for i, s in enumerate(statuses)]
    monkeypatch.setattr(
        training.sweep, "run_sweep", lambda *a, **k: SweepResult(tmp_path / "x-sweep", rows)
    )
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert main(["train", "--config", str(path), "--sweep", "seeds=0,1"]) == code
    out, err = capsys.readouterr()
    assert f"| seed=1 | {statuses[1]} |" in out
    assert ("1 of 2 trials did not finish" in err) is (code == 130), err
    assert "Tuner.restore" not in out + err

"""``rdtune export``: a trained run -> ``policy.onnx`` + ``model_card.json``.

What is exported is the small actor only (docs/RL.md, "Export and inference latency"):
``extract_features -> mlp_extractor.forward_actor -> action_net -> logits``, then per action
dimension the argmax, after masking the logits with the action mask when the policy was
trained with MaskablePPO (so the exported action equals ``predict(..., deterministic=True,
action_masks=mask)``). The graph takes ``obs`` (float32 ``[batch, size]``) and, for masked
policies, ``action_mask`` (bool ``[batch, sum(nvec)]``), and returns ``action`` (int64
``[batch, len(nvec)]``). Observation normalisation (VecNormalize) is not in the graph: its
statistics go into the card and :class:`models.policy.PolicyController` applies them.

The model card (models/card.py, one format for writer and readers) has the usual sections —
intended use, training data (the environment, the machines trained on: group slots, ways
range, minimum mask bits, MBA presence and modes; the training config), evaluation (the
held-out table and the ONNX parity check), limitations — and what a runtime must check
before feeding the policy: the feature encoder's version and layout, the action design, the
observation normalisation.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import pickle
import secrets
import shutil
import sys
import time
import warnings
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any

from agent.argtypes import positive_int
from agent.atomic import replace_directory
from envs import PARTITION_ID
from models.card import ModelCard, TrainedOn, standard_sections
from training.rundir import (
    CHECKPOINTS,
    NORMALISATION_OF,
    load_normalisation,
    normalisation_source,
)

log = logging.getLogger(__name__)

ONNX_OPSET = 17


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="run directory written by 'rdtune train'")
    parser.add_argument(
        "--out", required=True, help="directory for policy.onnx and model_card.json"
    )
    parser.add_argument(
        "--checkpoint",
        default="best_model.zip",
        choices=CHECKPOINTS,
        help="checkpoint in the run directory (default: best_model.zip, the one the run's "
        "eval.select chose; model.zip = the last)",
    )
    parser.add_argument(
        "--evaluate",
        type=positive_int,
        metavar="EPISODES",
        help="re-run the final evaluation (policy vs the heuristics on EPISODES >= 1 "
        "held-out episodes) with this code before writing the card",
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="skip the parity check of ONNX actions against the trained policy",
    )
    parser.add_argument(
        "--parity-observations",
        type=positive_int,
        default=512,
        metavar="N",
        help="observations the parity check compares ONNX and trained actions on (default: 512)",
    )
    parser.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="export a run that did not finish (interrupted, or still training); the card says so",
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.evaluate:
            from training.config import TrainConfig
            from training.evaluate import table
            from training.train import final_evaluation

            run_dir = Path(args.model)
            cfg = TrainConfig.parse(_read_run_file(run_dir / "config.yaml"))
            if not args.allow_incomplete and (run_dir / "run.json").exists():
                # before the evaluation writes eval.json into the run
                _refuse_unfinished(
                    run_dir, unfinished(run_dir, _read_run_file(run_dir / "run.json"))
                )
            _check_checkpoint(args.checkpoint)
            # refused before the evaluation rewrites the run's eval.json, not after it
            _export_target(Path(args.out))
            _check_loadable(run_dir, args.checkpoint, cfg)
            rows = final_evaluation(
                cfg, run_dir, episodes=args.evaluate, checkpoint=args.checkpoint
            )["rows"]
            print(table(rows))
        card = export_run(
            args.model,
            args.out,
            checkpoint=args.checkpoint,
            check=not args.no_check,
            parity_observations=args.parity_observations,
            allow_incomplete=args.allow_incomplete,
        )
    except ExportError as exc:
        print(f"rdtune export: {exc}", file=sys.stderr)
        return 2
    print(
        f"exported {card.name} ({card.algorithm}, encoder v{card.encoder_version}, "
        f"{card.actions['kind']}) to {args.out}"
    )
    if card.parity:
        print(f"parity: {card.parity['matched']}/{card.parity['observations']} actions match")
    return 0


class ExportError(ValueError):
    """A run that cannot be exported (missing files, wrong layout); the message says which."""


def _read_run_file(path: Path) -> Any:
    """A run directory's JSON or YAML file, or an ExportError naming it (a run copied in
    part, or edited by hand, must not end in a parser's message without the file)."""
    import yaml

    from agent.configfile import ConfigError, parse_problem, read_config_text

    try:
        text = read_config_text(path)
    except ConfigError as exc:
        raise ExportError(str(exc)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = path.suffix[1:].upper()
        raise ExportError(f"{path}: not valid {kind}: {parse_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a mapping at the top level")
    return data


def _check_run_meta(path: Path, meta: dict[str, Any]) -> None:
    """An ExportError naming the file and the key unless ``run.json`` has what an export
    reads, of the types the trainer writes (a file edited by hand, or of another version,
    must not end in a KeyError from deep in the export)."""

    def need(value: Any, key: str, ok: bool, what: str) -> None:
        if not ok:
            raise ExportError(f"{path}: {key} is not {what}: {json.dumps(value)[:60]}")

    def get(data: dict, key: str, at: str = "") -> Any:
        if not isinstance(data, dict) or key not in data:
            raise ExportError(f"{path}: no {at}{key} (is this a run of 'rdtune train'?)")
        return data[key]

    for key in ("name", "env_id"):
        need(get(meta, key), key, isinstance(meta[key], str), "a string")
    algorithm = get(meta, "algorithm")
    need(algorithm, "algorithm", algorithm in ("PPO", "MaskablePPO"), "PPO or MaskablePPO")
    need(get(meta, "env_kwargs"), "env_kwargs", isinstance(meta["env_kwargs"], dict), "a mapping")
    version = get(meta, "encoder_version")
    need(version, "encoder_version", type(version) is int, "an integer")
    nvec = get(get(meta, "actions"), "nvec", "actions.")
    need(nvec, "actions.nvec", isinstance(nvec, list) and bool(nvec) and all(
        type(n) is int and n > 0 for n in nvec), "a list of positive integers")  # fmt: skip
    for key in ("max_groups", "size"):
        value = get(get(meta, "features"), key, "features.")
        need(value, f"features.{key}", type(value) is int and value > 0, "a positive integer")


# the files an export directory holds (the card names the ONNX file)
EXPORT_FILES = ("policy.onnx", "model_card.json")


def unfinished(run_dir: Path, meta: dict[str, Any]) -> str | None:
    """What shows that the run in ``run_dir`` (``meta``: its run.json) did not finish, or
    None when it did. The one completion check of a run: run.json's ``finished`` must be
    the time the run finished (ISO 8601; training/rundir.py writes it last, once the run
    took its directory's place) or ``true``. A run.json without that key comes from a
    trainer before the marker: such a run finished when it holds both ``model.zip``
    (written when learning ends) and ``eval.json`` (when the final evaluation ends)."""
    if "finished" in meta:
        if _finished(meta["finished"]):
            return None
        return f"run.json: finished is {json.dumps(meta['finished'])}"
    missing = [name for name in ("model.zip", "eval.json") if not (run_dir / name).is_file()]
    return ", ".join(f"no {name}" for name in missing) or None


def _finished(value: Any) -> bool:
    if value is True:
        return True
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _refuse_unfinished(run_dir: Path, problem: str | None) -> None:
    """ExportError unless ``problem`` (:func:`unfinished`'s) is None."""
    if problem is not None:
        raise ExportError(
            f"{run_dir}: the run did not finish ({problem}: interrupted, or still training); "
            "--allow-incomplete exports it anyway, marked incomplete in the card"
        )


def _load_checkpoint(path: Path, algorithm: str):
    """The SB3 model in ``path``, or an ExportError naming the file: a checkpoint cut
    short (a copy interrupted, a full disk) fails in SB3, zipfile, pickle or torch."""
    from training.train import load_model

    try:
        return load_model(path, algorithm)
    except (
        AssertionError,
        zipfile.BadZipFile,
        EOFError,
        KeyError,
        pickle.UnpicklingError,
        RuntimeError,  # torch's errors reading a tensor archive
        ValueError,
        OSError,
    ) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ExportError(
            f"{path}: cannot load the checkpoint ({why}); is the file complete?"
        ) from None
    except TypeError as exc:  # SB3 builds another algorithm's model from the saved data
        why = " ".join(str(exc).split())
        raise ExportError(
            f"{path}: cannot load the checkpoint as {algorithm} (run.json's algorithm): {why}"
        ) from None


def actor_module(policy, nvec: list[int], masked: bool):
    """A torch module: obs (and mask) -> per-dimension argmax actions (int64)."""
    import torch
    from torch import nn

    # Runs of equal-sized dimensions are reshaped and argmaxed together (2 ops instead of
    # one per dimension: share levels, then MBA levels).
    runs: list[tuple[int, int]] = []  # (count, size)
    for n in nvec:
        if runs and runs[-1][1] == n:
            runs[-1] = (runs[-1][0] + 1, n)
        else:
            runs.append((1, n))

    class Actor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features_extractor = policy.pi_features_extractor
            self.mlp_extractor = policy.mlp_extractor
            self.action_net = policy.action_net

        def forward(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            features = self.features_extractor(obs.float())
            logits = self.action_net(self.mlp_extractor.forward_actor(features))
            if mask is not None:
                logits = torch.where(mask, logits, torch.full_like(logits, -1e8))
            out = []
            start = 0
            for count, size in runs:
                block = logits[:, start : start + count * size].reshape(-1, count, size)
                out.append(torch.argmax(block, dim=2))
                start += count * size
            return torch.cat(out, dim=1)

    actor = Actor().eval()
    if masked:
        return actor
    return _NoMask(actor)


def _NoMask(actor):
    from torch import nn

    class NoMask(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.actor = actor

        def forward(self, obs):
            return self.actor(obs)

    return NoMask().eval()


def export_onnx(model, path: Path, nvec: list[int], masked: bool) -> None:
    import torch

    module = actor_module(model.policy, nvec, masked)
    size = int(model.observation_space.shape[0])
    obs = torch.zeros(1, size, dtype=torch.float32)
    args: tuple = (obs,)
    names = ["obs"]
    if masked:
        args = (obs, torch.ones(1, int(sum(nvec)), dtype=torch.bool))
        names.append("action_mask")
    dyn = {n: {0: "batch"} for n in [*names, "action"]}
    with torch.no_grad(), warnings.catch_warnings():
        # The legacy (TorchScript-based) exporter, on purpose: a small graph that matches
        # SB3 exactly (docs/RL.md); it warns that it is no longer the default.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=names,
            output_names=["action"],
            dynamic_axes=dyn,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def trained_capabilities(env_kwargs: dict[str, Any], max_groups: int) -> TrainedOn:
    """The machines a policy saw in training: the preset, or every preset the generator or
    scenario family could use, summarised as ranges a runtime can check."""
    from agent.sim.catalog import default_catalog
    from agent.sim.scenario import get_scenario

    catalog = default_catalog()
    preset = env_kwargs.get("preset")
    source = env_kwargs.get("scenarios", "random")
    if preset is not None:
        names = [preset]
    elif isinstance(source, list | tuple):
        names = sorted({get_scenario(s, catalog).machine for s in source})
    else:
        names = sorted(catalog.machines)
    presets = [catalog.machine(n) for n in names]
    ways = [p.ways for p in presets]
    modes = sorted({p.mba_mode.value for p in presets if p.mba_mode is not None})
    return TrainedOn(
        max_groups=max_groups,
        presets=tuple(names),
        ways_min=min(ways),
        ways_max=max(ways),
        min_cbm_bits_max=max(p.min_cbm_bits for p in presets),
        requires_cat=True,  # every simulated preset has CAT; the policy never saw a node without
        mba_modes=tuple(modes),  # MBA modes seen (a node with another MBA mode is refused)
        trained_without_mba=any(p.mba_mode is None for p in presets),
    )


def _trained_on(run_dir: Path, meta: dict[str, Any]) -> TrainedOn:
    """The machines the run trained on: what ``run.json`` recorded of its traces' or its
    agent's nodes, else (a simulator run) its presets. A run on traces or an agent that
    recorded none is refused: every preset of the simulator would let the runtime drive
    machines the policy never saw."""
    where = str(run_dir / "run.json")
    if isinstance(meta.get("trained_on"), dict):
        return TrainedOn.from_dict(meta["trained_on"], where)
    if meta["env_id"] != PARTITION_ID:
        raise ExportError(
            f"{where}: no trained_on: the run trained on {meta['env_id']} and recorded no "
            "capabilities of the nodes it saw (a run before they were recorded); retrain it"
        )
    return trained_capabilities(meta["env_kwargs"], meta["features"]["max_groups"])


def _normalisation(run_dir: Path, checkpoint: str, normalized: bool) -> dict | None:
    """The observation normalisation ``checkpoint`` was trained with (None: the run did
    not normalise); an ExportError where the run saved none for it (a run from before
    the last checkpoint's statistics were kept)."""
    if not normalized:
        return None
    path = run_dir / NORMALISATION_OF[checkpoint]
    try:
        stats = load_normalisation(run_dir, checkpoint)  # a VecNormalize; our trainer's
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, OSError) as exc:
        # named as read: the checkpoint's own entry first, the pickle beside it otherwise
        where = normalisation_source(run_dir, checkpoint)
        raise ExportError(f"{where}: cannot load the normalisation statistics ({exc})") from None
    if stats is None:
        raise ExportError(
            f"{run_dir}: no {path.name}, the normalisation {checkpoint} was trained with; "
            "export best_model.zip, or retrain"
        )
    rms = stats.obs_rms
    return {
        "kind": "vecnormalize",
        "mean": rms.mean.astype(float).tolist(),
        "var": rms.var.astype(float).tolist(),
        "epsilon": float(stats.epsilon),
        "clip": float(stats.clip_obs),
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    checkpoint: str = "best_model.zip",
    check: bool = True,
    parity_observations: int = 512,
    allow_incomplete: bool = False,
) -> ModelCard:
    """Export ``run_dir`` into ``out_dir``; returns the model card (also written there).

    A run that did not finish (:func:`unfinished`) is refused unless ``allow_incomplete``;
    its card then says so. The export is written to a new directory beside ``out_dir`` and
    swapped in whole: an export that fails or is interrupted leaves ``out_dir`` as it was."""
    run_dir = Path(run_dir)
    _check_checkpoint(checkpoint)
    for name in ("run.json", "config.yaml"):
        if not (run_dir / name).exists():
            raise ExportError(f"{run_dir}: no {name} (is this a run directory of 'rdtune train'?)")
    _checkpoint_file(run_dir, checkpoint)
    out_dir = _export_target(Path(out_dir))
    meta = _read_run_file(run_dir / "run.json")
    config = _read_run_file(run_dir / "config.yaml")
    _check_run_meta(run_dir / "run.json", meta)
    incomplete = unfinished(run_dir, meta)
    if not allow_incomplete:
        _refuse_unfinished(run_dir, incomplete)
    from models.features import ENCODER_VERSIONS

    if meta["encoder_version"] not in ENCODER_VERSIONS:
        raise ExportError(
            f"{run_dir}: trained with feature encoder v{meta['encoder_version']}, this code "
            f"encodes {ENCODER_VERSIONS}: the policy's inputs no longer mean the same; retrain"
        )
    model = _load_checkpoint(run_dir / checkpoint, meta["algorithm"])
    _check_spaces(model, meta, run_dir / checkpoint)
    staging = _staging_dir(out_dir)
    try:
        card = _write_export(
            model, run_dir, staging, meta, config, checkpoint, incomplete, root=out_dir
        )
        if check:
            result = parity(model, staging / "policy.onnx", card, parity_observations, meta)
            card = dataclasses.replace(card, parity=result)
            if result["matched"] != result["observations"]:
                raise ExportError(
                    f"exported actions differ from the trained policy's on "
                    f"{result['observations'] - result['matched']} of "
                    f"{result['observations']} observations"
                )
        card.write(staging)
        _swap_in(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone once swapped in
    return card


def _check_checkpoint(checkpoint: str) -> None:
    """Only a checkpoint of the run itself: another file would be exported under this
    run's configuration, normalisation and evaluation."""
    if checkpoint not in CHECKPOINTS:
        raise ExportError(
            f"--checkpoint {checkpoint}: a checkpoint of the run directory, one of "
            f"{', '.join(CHECKPOINTS)} (the best evaluation's, the last)"
        )


def _checkpoint_file(run_dir: Path, checkpoint: str) -> Path:
    """``run_dir``'s ``checkpoint``, or ExportError where there is none or it is not a
    regular file (a FIFO: the loader would wait for ever)."""
    path = run_dir / checkpoint
    if not path.exists():
        raise ExportError(
            f"{run_dir}: no {checkpoint} (is this a run directory of 'rdtune train'?)"
        )
    if not path.is_file():
        raise ExportError(f"{path}: not a regular file (a checkpoint is a .zip)")
    return path


def _check_loadable(run_dir: Path, checkpoint: str, cfg) -> None:
    """ExportError (one line naming the file) unless ``checkpoint`` and the normalisation
    it was trained with load, as the export will load them: what the evaluation would
    otherwise meet as SB3's, zipfile's or pickle's traceback."""
    _load_checkpoint(_checkpoint_file(run_dir, checkpoint), cfg.algorithm)
    _normalisation(run_dir, checkpoint, cfg.normalize_obs)


def _check_spaces(model, meta: dict[str, Any], path: Path) -> None:
    """ExportError unless the checkpoint at ``path`` acts and observes as run.json
    (``meta``) says: else an export whose card and ONNX disagree (with --no-check)."""
    nvec = [int(n) for n in meta["actions"]["nvec"]]
    if list(model.action_space.nvec) != nvec:
        raise ExportError(f"{path.parent}: checkpoint action space differs from run.json")
    size = int(meta["features"]["size"])
    if tuple(model.observation_space.shape) != (size,):
        raise ExportError(
            f"{path}: takes observations of shape {tuple(model.observation_space.shape)}, "
            f"run.json's features have {size}"
        )


def _export_target(out_dir: Path) -> Path:
    """Where the export goes (a symlink's target: the link keeps pointing at it), refused
    when it holds other files: the directory is replaced whole."""
    if out_dir.is_symlink():
        out_dir = out_dir.resolve()
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ExportError(f"{out_dir}: not a directory")
        other = sorted(p.name for p in out_dir.iterdir() if p.name not in EXPORT_FILES)
        if other:
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            raise ExportError(
                f"{out_dir}: holds files other than an export ({shown}); an export replaces "
                "its directory whole: give a new directory or an earlier export's"
            )
    return out_dir


def _staging_dir(out_dir: Path) -> Path:
    """A new hidden directory beside ``out_dir`` to build the export in (:func:`_swap_in`
    puts it in place), or an ExportError naming --out when none can be made there."""
    staging = out_dir.with_name(f".{out_dir.name}.export-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:  # a file in the way, a read-only or virtual file system
        why = exc.strerror or str(exc)
        raise ExportError(
            f"--out {out_dir}: cannot make an export directory there ({why})"
        ) from None
    return staging


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Put the complete export ``staging`` in place of ``out_dir`` (and its earlier export,
    if any): the old one is renamed aside, the new one renamed in, the old one removed, so
    a card and an ONNX file of two different exports are never side by side."""
    aside = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    replace_directory(staging, out_dir, aside)


def _evaluation_of(run_dir: Path, checkpoint: str) -> dict | None:
    """The run's final table (``eval.json``) when it is of ``checkpoint``: a table of
    another does not describe the policy exported (before it named one, the final
    evaluation was always of the best)."""
    if not (run_dir / "eval.json").exists():
        return None
    evaluation = _read_run_file(run_dir / "eval.json")
    return evaluation if evaluation.get("checkpoint", "best_model.zip") == checkpoint else None


def _write_export(
    model,
    run_dir: Path,
    directory: Path,
    meta: dict,
    config: dict,
    checkpoint: str,
    incomplete: str | None,
    root: Path,
) -> ModelCard:
    """Write ``policy.onnx`` into ``directory``; the card for it (not yet written)."""
    nvec = [int(n) for n in meta["actions"]["nvec"]]
    masked = meta["algorithm"] == "MaskablePPO"
    onnx_path = directory / "policy.onnx"
    export_onnx(model, onnx_path, nvec, masked)
    norm = _normalisation(run_dir, checkpoint, bool(config.get("normalize_obs")))
    evaluation = _evaluation_of(run_dir, checkpoint)
    trained_on = _trained_on(run_dir, meta)
    env = {"id": meta["env_id"], "kwargs": meta["env_kwargs"]}
    # the cadence it learned, and its traces' (the tuner warns of another one)
    env |= {k: meta[k] for k in ("interval_s", "trace_interval_s") if k in meta}
    use, out_of_scope, limitations = standard_sections(trained_on, env)
    if incomplete is not None:
        limitations = (
            f"Incomplete run: training did not finish ({incomplete}); the policy is the "
            f"checkpoint {checkpoint} saved by then, trained on fewer than the config's "
            f"total_timesteps ({config.get('total_timesteps')})"
            + ("" if evaluation else " and not evaluated on the held-out episodes"),
            *limitations,
        )
    return ModelCard(
        name=meta["name"],
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        algorithm=meta["algorithm"],
        checkpoint=checkpoint,
        intended_use=use,
        out_of_scope=out_of_scope,
        env=env,
        trained_on=trained_on,
        training_config=config,
        command=meta.get("command"),
        evaluation=evaluation,
        limitations=limitations,
        onnx={
            "file": onnx_path.name,
            "sha256": _sha256(onnx_path),
            "opset": ONNX_OPSET,
            "inputs": {"obs": ["batch", meta["features"]["size"]]}
            | ({"action_mask": ["batch", int(sum(nvec))]} if masked else {}),
            "output": {"action": ["batch", len(nvec)]},
        },
        encoder_version=meta["encoder_version"],
        features=meta["features"],
        actions=meta["actions"],
        masked=masked,
        normalization=norm,
        shield=(config.get("runtime") or {}).get("shield"),
        root=root,
    )


def parity(model, onnx_path: Path, card: ModelCard, n: int, meta: dict) -> dict[str, Any]:
    """Compare ONNX actions with ``model.predict(deterministic=True)`` on observations
    from real episodes of the training env (random actions, so many states are seen)."""
    import gymnasium as gym
    import numpy as np
    import onnxruntime as ort

    import envs  # noqa: F401

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    env = gym.make(meta["env_id"], **meta["env_kwargs"])
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=12345)
    matched = ties = 0
    for i in range(n):
        mask = env.unwrapped.action_masks()
        norm = card.normalization
        o = obs
        if norm is not None:
            o = np.clip(
                (obs - np.asarray(norm["mean"]))
                / np.sqrt(np.asarray(norm["var"]) + norm["epsilon"]),
                -norm["clip"],
                norm["clip"],
            ).astype(np.float32)
        feeds = {"obs": o[None, :].astype(np.float32)}
        if card.masked:
            feeds["action_mask"] = mask[None, :]
            want, _ = model.predict(o, deterministic=True, action_masks=mask)
        else:
            want, _ = model.predict(o, deterministic=True)
        got = sess.run(["action"], feeds)[0][0]
        if np.array_equal(np.asarray(want), got):
            matched += 1
        elif _tied(model.policy, o, mask if card.masked else None, got, meta["actions"]["nvec"]):
            matched += 1
            ties += 1
        obs, _, term, trunc, _ = env.step(env.action_space.sample(mask=None) if i % 2 else want)
        if term or trunc:
            obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
    env.close()
    return {"observations": n, "matched": matched, "ties": ties}


# Float32 logits of two runtimes agree to about 1e-6 relative; an action whose logit is
# this close to the best is a tie either runtime may break its own way.
TIE_TOLERANCE = 1e-5


def _tied(policy, obs, mask, got, nvec: list[int]) -> bool:
    """Whether ONNX's action ``got`` takes, in every dimension, an action whose logit under
    the trained policy is within :data:`TIE_TOLERANCE` of that dimension's best: the two
    runtimes then differ only in how they break a tie."""
    import numpy as np
    import torch

    with torch.no_grad():
        x = torch.as_tensor(obs, dtype=torch.float32)[None, :]
        features = policy.pi_features_extractor(x)
        logits = policy.action_net(policy.mlp_extractor.forward_actor(features))[0].numpy()
    if mask is not None:
        logits = np.where(np.asarray(mask, dtype=bool), logits, -np.inf)
    start = 0
    for dim, size in enumerate(nvec):
        block = logits[start : start + size]
        best = float(block.max())
        if block[int(got[dim])] < best - TIE_TOLERANCE * max(1.0, abs(best)):
            return False
        start += size
    return True

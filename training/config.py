"""Training configuration: the YAML file ``rdtune train --config FILE`` reads (issue 7, "Trainer").

One :class:`TrainConfig` holds everything that defines a run, so the same file and seed give
the same learning curve and policy on one machine (the config is saved next to every
checkpoint and in the model card). Checkpoints are selected on the *validation* split and
the final table is played on the *test* split (envs/scenarios.py names the splits); a
config that would select checkpoints on the test split is rejected.
Unknown keys, wrong types and out-of-range values are rejected with the key's dotted path::

    name: default
    algorithm: MaskablePPO          # PPO | MaskablePPO
    seed: 0
    total_timesteps: 200000
    n_envs: 2
    subproc: false                  # SubprocVecEnv instead of DummyVecEnv
    torch_threads: 1
    normalize_obs: false            # VecNormalize (stats shipped in the model card)
    normalize_reward: false         # scale rewards by the running std of returns (training only)
    output_dir: runs/default
    env:
      id: rdtune/Partition-v0
      kwargs: {scenarios: random, split: train, episode_steps: 32, max_groups: 8}
      reward_weights: {slo: 4.0, fairness: 1.0, throughput: 1.0, change: 0.5}
    eval:
      kwargs: {split: validation}   # merged over env.kwargs: checkpoint selection's family
      freq: 20000                   # timesteps between evaluations (0: only at the end)
      episodes: 64                  # episodes per checkpoint evaluation
      seed: 1000
      final_kwargs: {split: test}   # merged over eval.kwargs: the final table's family
      final_episodes: 32
      controllers: [eq, static, copart, ubik]
    policy:
      extractor: {hidden: 64, slot_hidden: 32, pool: [mean, max]}   # or null: flat MLP
      net_arch: {pi: [64, 64], vf: [64, 64]}
      activation: tanh              # tanh | relu
      head: dense                   # dense | slots (shared per-slot head; needs pi: [])
      head_hidden: 64
    ppo: {learning_rate: 3.0e-4, n_steps: 256, batch_size: 128, n_epochs: 10, gamma: 0.9,
          gae_lambda: 0.95, ent_coef: 0.01, clip_range: 0.2, vf_coef: 0.5, max_grad_norm: 0.5}
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

ALGORITHMS = ("PPO", "MaskablePPO")
ACTIVATIONS = ("tanh", "relu")
POOLS = ("mean", "max")
PPO_KEYS = {
    "learning_rate": float,
    "n_steps": int,
    "batch_size": int,
    "n_epochs": int,
    "gamma": float,
    "gae_lambda": float,
    "ent_coef": float,
    "vf_coef": float,
    "clip_range": float,
    "max_grad_norm": float,
    "target_kl": float,
}


class ConfigError(ValueError):
    """A training config that cannot be used; the message names the key and the problem."""


def _check_keys(where: str, data: dict, allowed: set[str]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"{where or 'config'}: unknown key(s) {unknown}; allowed: {sorted(allowed)}"
        )


def _int(where: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _float(where: str, value: Any, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < low:
        raise ConfigError(f"{where}: expected a finite number >= {low}, got {value!r}")
    return float(value)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _str(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _ints(where: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of integers, got {value!r}")
    return [_int(f"{where}[{i}]", v, 1) for i, v in enumerate(value)]


@dataclass
class EnvConfig:
    id: str = "rdtune/Partition-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    reward_weights: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: dict, where: str = "env") -> EnvConfig:
        _check_keys(where, data, {f.name for f in fields(cls)})
        out = cls()
        if "id" in data:
            out.id = _str(f"{where}.id", data["id"])
        if "kwargs" in data:
            _check_keys(f"{where}.kwargs", data["kwargs"] or {}, set(data["kwargs"] or {}))
            out.kwargs = dict(data["kwargs"] or {})
        if "reward_weights" in data:
            from envs.reward import RewardWeights

            rw = data["reward_weights"] or {}
            try:
                RewardWeights.of(rw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}.reward_weights: {exc}") from None
            out.reward_weights = {k: float(v) for k, v in rw.items()}
        if "reward_weights" in out.kwargs:
            raise ConfigError(f"{where}.kwargs: put reward weights in {where}.reward_weights")
        return out


@dataclass
class EvalConfig:
    kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "validation"})
    freq: int = 20000
    episodes: int = 64
    seed: int = 1000
    controllers: list[str] = field(default_factory=lambda: ["eq", "static", "copart", "ubik"])
    heuristics_at_start: bool = True  # also evaluate them before training (TensorBoard lines)
    final_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "test"})
    final_episodes: int = 32

    @classmethod
    def parse(cls, data: dict, where: str = "eval") -> EvalConfig:
        _check_keys(where, data, {f.name for f in fields(cls)})
        out = cls()
        for key in ("kwargs", "final_kwargs"):
            if key in data:
                _check_keys(f"{where}.{key}", data[key] or {}, set(data[key] or {}))
                setattr(out, key, dict(data[key] or {}))
        if out.kwargs.get("split") == "test":
            raise ConfigError(
                f"{where}.kwargs: checkpoint selection must not see the test split (the "
                "final table is played there); use split: validation"
            )
        if "freq" in data:
            out.freq = _int(f"{where}.freq", data["freq"])
        if "episodes" in data:
            out.episodes = _int(f"{where}.episodes", data["episodes"], 1)
        if "final_episodes" in data:
            out.final_episodes = _int(f"{where}.final_episodes", data["final_episodes"], 1)
        if "seed" in data:
            out.seed = _int(f"{where}.seed", data["seed"])
        if "heuristics_at_start" in data:
            out.heuristics_at_start = _bool(
                f"{where}.heuristics_at_start", data["heuristics_at_start"]
            )
        if "controllers" in data:
            ctrls = data["controllers"] or []
            if not isinstance(ctrls, list):
                raise ConfigError(f"{where}.controllers: expected a list of controller names")
            out.controllers = [_str(f"{where}.controllers[{i}]", c) for i, c in enumerate(ctrls)]
        return out


@dataclass
class ExtractorConfig:
    hidden: int = 64
    slot_hidden: int = 32
    pool: list[str] = field(default_factory=lambda: ["mean", "max"])

    @classmethod
    def parse(cls, data: dict, where: str) -> ExtractorConfig:
        _check_keys(where, data, {f.name for f in fields(cls)})
        out = cls()
        if "hidden" in data:
            out.hidden = _int(f"{where}.hidden", data["hidden"], 1)
        if "slot_hidden" in data:
            out.slot_hidden = _int(f"{where}.slot_hidden", data["slot_hidden"], 0)
        if "pool" in data:
            pool = data["pool"]
            if not isinstance(pool, list) or not pool or any(p not in POOLS for p in pool):
                raise ConfigError(f"{where}.pool: expected a non-empty list of {POOLS}")
            out.pool = list(dict.fromkeys(pool))
        return out


HEADS = ("dense", "slots")


@dataclass
class PolicyConfig:
    extractor: ExtractorConfig | None = field(default_factory=ExtractorConfig)
    net_arch: dict[str, list[int]] = field(default_factory=lambda: {"pi": [64, 64], "vf": [64, 64]})
    activation: str = "tanh"
    head: str = "dense"  # dense: SB3's linear head; slots: one shared head per group slot
    head_hidden: int = 64

    @classmethod
    def parse(cls, data: dict, where: str = "policy") -> PolicyConfig:
        _check_keys(where, data, {f.name for f in fields(cls)})
        out = cls()
        if "extractor" in data:
            ext = data["extractor"]
            out.extractor = (
                None if ext is None else ExtractorConfig.parse(ext, f"{where}.extractor")
            )
        if "net_arch" in data:
            arch = data["net_arch"]
            _check_keys(f"{where}.net_arch", arch, {"pi", "vf"})
            out.net_arch = {
                k: [] if k == "pi" and v == [] else _ints(f"{where}.net_arch.{k}", v)
                for k, v in arch.items()
            }
            for k in ("pi", "vf"):
                out.net_arch.setdefault(k, [64, 64])
        if "activation" in data:
            if data["activation"] not in ACTIVATIONS:
                raise ConfigError(f"{where}.activation: expected one of {ACTIVATIONS}")
            out.activation = data["activation"]
        if "head" in data:
            if data["head"] not in HEADS:
                raise ConfigError(f"{where}.head: expected one of {HEADS}, got {data['head']!r}")
            out.head = data["head"]
        if "head_hidden" in data:
            out.head_hidden = _int(f"{where}.head_hidden", data["head_hidden"], 1)
        if out.head == "slots":
            if out.extractor is None or out.extractor.slot_hidden < 1:
                raise ConfigError(
                    f"{where}.head: 'slots' needs the group-set extractor with slot_hidden >= 1"
                )
            if out.net_arch["pi"]:
                raise ConfigError(
                    f"{where}.net_arch.pi: must be [] with head 'slots' (the shared per-slot "
                    f"head reads the extractor's slot blocks directly)"
                )
        return out


def _default_ppo() -> dict[str, Any]:
    return {
        "learning_rate": 3e-4,
        "n_steps": 256,
        "batch_size": 128,
        "n_epochs": 10,
        "gamma": 0.9,
        "gae_lambda": 0.95,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "clip_range": 0.2,
        "max_grad_norm": 0.5,
    }


@dataclass
class TrainConfig:
    """A whole training run (see the module docstring for the YAML form)."""

    name: str = "run"
    algorithm: str = "MaskablePPO"
    seed: int = 0
    total_timesteps: int = 100_000
    n_envs: int = 2
    subproc: bool = False
    torch_threads: int = 1
    normalize_obs: bool = False
    normalize_reward: bool = False
    output_dir: str = "runs/run"
    progress_bar: bool = True
    env: EnvConfig = field(default_factory=EnvConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    ppo: dict[str, Any] = field(default_factory=_default_ppo)

    @classmethod
    def parse(cls, data: dict | None) -> TrainConfig:
        data = {} if data is None else data
        _check_keys("", data, {f.name for f in fields(cls)})
        out = cls()
        if "name" in data:
            out.name = _str("name", data["name"])
        if "algorithm" in data:
            if data["algorithm"] not in ALGORITHMS:
                raise ConfigError(
                    f"algorithm: expected one of {ALGORITHMS}, got {data['algorithm']!r}"
                )
            out.algorithm = data["algorithm"]
        for key in ("seed", "total_timesteps", "n_envs", "torch_threads"):
            if key in data:
                low = 0 if key == "seed" else 1
                setattr(out, key, _int(key, data[key], low))
        for key in ("subproc", "normalize_obs", "normalize_reward", "progress_bar"):
            if key in data:
                setattr(out, key, _bool(key, data[key]))
        if "output_dir" in data:
            out.output_dir = _str("output_dir", data["output_dir"])
        else:
            out.output_dir = f"runs/{out.name}"
        if "env" in data:
            out.env = EnvConfig.parse(data["env"] or {})
        if "eval" in data:
            out.eval = EvalConfig.parse(data["eval"] or {})
        if "policy" in data:
            out.policy = PolicyConfig.parse(data["policy"] or {})
        if "ppo" in data:
            ppo = data["ppo"] or {}
            _check_keys("ppo", ppo, set(PPO_KEYS))
            for k, v in ppo.items():
                if PPO_KEYS[k] is int:
                    out.ppo[k] = _int(f"ppo.{k}", v, 1)
                else:
                    out.ppo[k] = _float(f"ppo.{k}", v)
        out._check_env()
        return out

    def _check_env(self) -> None:
        """Build the env once to turn bad env kwargs into a config error now, not mid-run."""
        import gymnasium as gym

        import envs  # noqa: F401  (registers the ids)

        for where, kwargs in (
            ("env.kwargs", self.env_kwargs()),
            ("eval.kwargs", self.eval_kwargs()),
            ("eval.final_kwargs", self.final_kwargs()),
        ):
            try:
                env = gym.make(self.env.id, **kwargs)
            except gym.error.Error as exc:
                raise ConfigError(f"env.id: {exc}") from None
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: {exc}") from None
            env.close()

    def env_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the training env (reward weights included)."""
        kw = dict(self.env.kwargs)
        if self.env.reward_weights:
            kw["reward_weights"] = dict(self.env.reward_weights)
        return kw

    def eval_kwargs(self) -> dict[str, Any]:
        """Checkpoint selection's env: ``env.kwargs`` overridden by ``eval.kwargs``."""
        return {**self.env_kwargs(), **self.eval.kwargs}

    def final_kwargs(self) -> dict[str, Any]:
        """The final table's env: ``eval_kwargs()`` overridden by ``eval.final_kwargs``."""
        return {**self.eval_kwargs(), **self.eval.final_kwargs}

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        """A copy with dotted-key overrides applied (``{"ppo.learning_rate": 1e-3}``),
        re-validated."""
        data = self.to_dict()
        for key, value in overrides.items():
            node = data
            parts = key.split(".")
            for p in parts[:-1]:
                if not isinstance(node.get(p), dict):
                    node[p] = {} if node.get(p) is None else node[p]
                    if not isinstance(node[p], dict):
                        raise ConfigError(f"{key}: {p} is not a section")
                node = node[p]
            node[parts[-1]] = value
        return TrainConfig.parse(data)


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML training config; errors name the file and the key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not data:
        # An empty file would silently train the defaults for 100k steps: a file with no
        # settings is a mistake (a wrong path, a truncated copy), not a request for defaults.
        raise ConfigError(f"{path}: the config is empty; start from training/configs/default.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return TrainConfig.parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None

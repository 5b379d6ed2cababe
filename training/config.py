"""Training configuration: the YAML file ``rdtune train --config FILE`` reads.

One :class:`TrainConfig` holds everything that defines a run, so the same file and seed give
the same learning curve and policy on one machine (the config is saved next to every
checkpoint and in the model card). Checkpoints are selected on the *validation* split and
the final table is played on the *test* split (envs/scenarios.py names the splits); a
config whose merged env settings would let training or selection see the test split (or
``all``), or play the final table elsewhere, is rejected. The trace env
(``rdtune/TracePartition-v0``, training/trace_env.py) has no splits: its episodes replay
trace files, so its held-out data are files. ``eval.kwargs`` defaults to ``{}`` there
(selection replays the training traces; ``{traces: [...]}`` gives it others) and
``eval.final_kwargs`` must name ``traces`` that neither training nor selection replays: not
the same file under another name or link, nor a copy of it; a ``split`` is refused::

    env:
      id: "training.trace_env:rdtune/TracePartition-v0"
      kwargs: {traces: [runs/a.parquet, runs/b.parquet], episode_steps: 32}
    eval:
      final_kwargs: {traces: [runs/c.parquet]}   # recorded apart from a and b

Whatever the env, ``eval.kwargs`` and ``eval.final_kwargs`` may change the episodes, not
the observation and action layout the policy learned (``max_groups``, ``share_levels``,
``mba_levels``, ``share_all``, ``encoder_version``): such an override is refused, naming it.

The remote env (``rdtune/RemotePartition-v0``) has no splits either: its held-out data are
another agent (``address``) or another scenario of a simulated one (``scenario``), which the
final table must use and neither training nor selection does; it trains with ``n_envs: 1``
(several envs would share the one node).

Unknown keys, wrong types (strict: ``subproc: "false"`` is not a boolean) and out-of-range
values are rejected with the file and the key's dotted path (agent/configfile.py), as is a key
given twice; so are PPO settings SB3 would start with and then fail on or warn about
(``ppo.batch_size`` at least 2 and dividing a rollout of ``n_envs * ppo.n_steps`` samples,
``ppo.gamma`` and ``ppo.gae_lambda`` in [0, 1], ``seed`` below 2**32), a
``total_timesteps`` that is not a whole number of rollouts (PPO would train up to the next
one; the error gives the two nearest totals) and a ``policy.head_hidden`` for the dense
head, which has no such layer; an empty file is refused rather than read as "all
defaults"::

    name: default
    algorithm: MaskablePPO          # PPO | MaskablePPO
    seed: 0
    total_timesteps: 163840         # whole rollouts: 10 of n_envs x ppo.n_steps
    n_envs: 64
    vec_env: auto                   # batched | dummy | subproc | auto (below)
    rollout_workers: 0              # >0: the batched envs split over Ray actors
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
      controllers: [eq, static, copart, ubik]   # specs; unknown, malformed or unloadable: refused
    policy:
      extractor: {hidden: 64, slot_hidden: 32, pool: [mean, max]}   # or null: flat MLP
      net_arch: {pi: [64, 64], vf: [64, 64]}
      activation: tanh              # tanh | relu
      head: dense                   # dense | slots (shared per-slot head; needs pi: [])
      head_hidden: 64               # the slots head's hidden layer (refused with dense)
    ppo: {learning_rate: 3.0e-4, n_steps: 256, batch_size: 128, n_epochs: 10, gamma: 0.9,
          gae_lambda: 0.95, ent_coef: 0.01, clip_range: 0.2, vf_coef: 0.5, max_grad_norm: 0.5}
    dagger:                         # optional: DAgger from the safe oracle before PPO
      iterations: 4                 # (training/dagger.py); total_timesteps: 0 stops there;
                                    # refused with normalize_obs (it fits raw features)
      episodes: 16
      beta: 0.5
      objective: null               # the oracle's (null: its default, fair_throughput)
      excess_quantum: 0.0           # the oracle's on infeasible load levels (models/oracle.py)
      seed: 0                       # + the run's seed: its episode and refit seeds
    runtime:                        # where the exported policy runs (its model card)
      shield: null                  # SLO shield options there, over env.kwargs.shield's
                                    # (null: that shield; refused without one)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from agent import configfile
from agent.configfile import ConfigError, Finite, Strict

__all__ = ["ConfigError", "TrainConfig", "load_config"]

ALGORITHMS = ("PPO", "MaskablePPO")
# How the training environments are stepped: ``batched`` (one vector env over the batched
# simulator, envs.vector_env; needs an id with a vector_entry_point), ``dummy`` / ``subproc``
# (SB3's DummyVecEnv / SubprocVecEnv of single envs), ``auto`` (batched where the id has a
# vector entry point, else dummy; ``subproc: true`` is the older spelling of subproc).
VEC_ENVS = ("auto", "batched", "dummy", "subproc")
ACTIVATIONS = ("tanh", "relu")
POOLS = ("mean", "max")
HEADS = ("dense", "slots")
PositiveInt = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]
NonNegative = Annotated[Finite, Field(ge=0)]
Fraction = Annotated[Finite, Field(ge=0, le=1)]
# numpy's legacy seeding (np.random.seed, which SB3 calls) takes seeds below 2**32
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
Name = Annotated[str, Field(min_length=1)]


class EnvConfig(Strict):
    id: Name = "rdtune/Partition-v0"
    kwargs: dict[str, Any] = {}
    reward_weights: dict[str, float] = {}

    @field_validator("kwargs")
    @classmethod
    def _no_weights(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "reward_weights" in kwargs:
            raise ValueError("put reward weights in env.reward_weights")
        if "seed" in kwargs:  # one seed for every copy would make the copies alike
            raise ValueError("the run's seed seeds the envs (copy i: seed + i); remove seed")
        return kwargs

    @field_validator("reward_weights")
    @classmethod
    def _weights(cls, weights: dict[str, float]) -> dict[str, float]:
        from envs.reward import RewardWeights

        RewardWeights.of(weights)  # its ValueError names the weight
        return weights


class RuntimeConfig(Strict):
    """Where the exported policy runs: written into its model card by ``rdtune export``."""

    # the SLO shield's options there (models/shield.py), over the training env's shield
    # (which TrainConfig requires); None: the training env's shield as it is
    shield: dict[str, Any] | None = None

    @field_validator("shield")
    @classmethod
    def _shield(cls, shield: dict[str, Any] | None) -> dict[str, Any] | None:
        from models.shield import ShieldConfig

        if shield is not None:
            ShieldConfig.of(shield)  # its ValueError names the option
        return shield


class EvalConfig(Strict):
    # both split defaults are the simulator's; the trace and remote envs' are {}
    kwargs: dict[str, Any] = {"split": "validation"}  # merged over env.kwargs
    freq: Count = 20000  # timesteps between evaluations (0: only at the end)
    episodes: PositiveInt = 64
    seed: Count = 1000
    controllers: list[Name] = ["eq", "static", "copart", "ubik"]
    heuristics_at_start: bool = True  # also evaluate them before training (TensorBoard lines)
    final_kwargs: dict[str, Any] = {"split": "test"}  # merged over kwargs
    final_episodes: PositiveInt = 32
    # which checkpoint the run keeps as best_model.zip: the best mean validation return
    # ("return"), or the last one evaluated ("last": the evaluations only log)
    select: Literal["return", "last"] = "return"

    @field_validator("controllers")
    @classmethod
    def _known(cls, controllers: list[str]) -> list[str]:
        # refused now, not when the evaluation after training meets it: a malformed spec,
        # an option the controller does not take, a policy export that cannot be loaded. A
        # controller this env's node cannot run is still only told then (it depends on
        # the node).
        from models.catalogue import check_specs

        check_specs(controllers)  # its ValueError names the spec
        return controllers


class ExtractorConfig(Strict):
    hidden: PositiveInt = 64
    slot_hidden: Count = 32
    pool: Annotated[list[Literal["mean", "max"]], Field(min_length=1)] = ["mean", "max"]

    @field_validator("pool")
    @classmethod
    def _unique(cls, pool: list[str]) -> list[str]:
        return list(dict.fromkeys(pool))


class NetArch(Strict):
    pi: list[PositiveInt] = [64, 64]  # [] with head 'slots'
    vf: Annotated[list[PositiveInt], Field(min_length=1)] = [64, 64]

    def __getitem__(self, key: str) -> list[int]:
        return getattr(self, key)


class PolicyConfig(Strict):
    extractor: ExtractorConfig | None = ExtractorConfig()  # null: a flat MLP
    net_arch: NetArch = NetArch()
    activation: Literal["tanh", "relu"] = "tanh"
    head: Literal["dense", "slots"] = "dense"  # slots: one shared head per group slot
    head_hidden: PositiveInt = 64

    @model_validator(mode="after")
    def _slots(self) -> PolicyConfig:
        default = type(self).model_fields["head_hidden"].default
        if self.head == "dense" and self.head_hidden != default:
            # only the slots head has that layer: the value would be silently ignored (the
            # default is let through: every config written by a run states it)
            raise ValueError(
                f"policy.head_hidden: {self.head_hidden} sizes the hidden layer of head "
                "'slots'; head 'dense' has none (its layers are net_arch.pi): remove it"
            )
        if self.head == "slots":
            if self.extractor is None or self.extractor.slot_hidden < 1:
                raise ValueError(
                    "policy.head: 'slots' needs the group-set extractor with slot_hidden >= 1"
                )
            if self.net_arch.pi:
                raise ValueError(
                    "policy.net_arch.pi: must be [] with head 'slots' (the shared per-slot "
                    "head reads the extractor's slot blocks directly)"
                )
        return self


class PpoConfig(Strict):
    """SB3's PPO arguments; read like a mapping (``**cfg.ppo``, ``cfg.ppo["gamma"]``)."""

    learning_rate: NonNegative = 3e-4
    n_steps: PositiveInt = 256
    # >= 2: advantages are normalised over a minibatch, and one sample has no spread
    # (the update then fails with non-finite logits); TrainConfig checks it against the
    # rollout (n_envs * n_steps)
    batch_size: Annotated[int, Field(ge=2)] = 128
    n_epochs: PositiveInt = 10
    gamma: Fraction = 0.9
    gae_lambda: Fraction = 0.95
    ent_coef: NonNegative = 0.01
    vf_coef: NonNegative = 0.5
    clip_range: NonNegative = 0.2
    max_grad_norm: NonNegative = 0.5
    target_kl: NonNegative | None = None

    def keys(self):
        return self.model_dump(exclude_none=True).keys()

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


class DaggerConfig(Strict):
    """DAgger from the safe oracle before PPO (training/dagger.py): the warm start."""

    iterations: PositiveInt = 4  # rollout + refit rounds; the first is behaviour cloning
    episodes: PositiveInt = 16  # episodes rolled out per round
    beta: Annotated[Finite, Field(ge=0, le=1)] = 0.5  # the teacher drives with beta**round
    epochs: PositiveInt = 10  # passes over the aggregated data per refit
    batch_size: PositiveInt = 256
    learning_rate: Annotated[Finite, Field(gt=0)] = 1e-3
    objective: Literal["fairness", "throughput", "fair_throughput"] | None = None  # oracle's
    # the oracle's excess_quantum on infeasible load levels (models/oracle.py; 0: the closest)
    excess_quantum: Annotated[Finite, Field(ge=0, lt=1)] = 0.0
    # added to the run's seed: the first episode seed and the refit seed (so --seed and a
    # seeds sweep reach the warm start; 0: the run's seed alone)
    seed: Count = 0


MAX_ENVS = 16384


class TrainConfig(Strict):
    """A whole training run (see the module docstring for the YAML form)."""

    name: Name = "run"
    algorithm: Literal["PPO", "MaskablePPO"] = "MaskablePPO"
    seed: Seed = 0
    # PPO's env steps, whole rollouts of n_envs x ppo.n_steps (0: the DAgger warm start
    # alone); the default is 200 rollouts of the default 2 x 256
    total_timesteps: Count = 102_400
    # bounded so a typo is refused, not a MemoryError from the envs' arrays
    n_envs: Annotated[int, Field(ge=1, le=MAX_ENVS)] = 2
    subproc: bool = False
    vec_env: Literal["auto", "batched", "dummy", "subproc"] = "auto"
    rollout_workers: Count = 0  # Ray actors holding the batched envs (0: in this process)
    torch_threads: PositiveInt = 1
    normalize_obs: bool = False
    normalize_reward: bool = False
    output_dir: Name | None = None  # default: runs/<name>
    progress_bar: bool = True
    env: EnvConfig = EnvConfig()
    eval: EvalConfig = EvalConfig()
    policy: PolicyConfig = PolicyConfig()
    ppo: PpoConfig = PpoConfig()
    dagger: DaggerConfig | None = None  # a DAgger warm start from the oracle before PPO
    runtime: RuntimeConfig = RuntimeConfig()

    @model_validator(mode="after")
    def _complete(self) -> TrainConfig:
        if self.output_dir is None:
            object.__setattr__(self, "output_dir", f"runs/{self.name}")
        if self.total_timesteps == 0 and self.dagger is None:
            raise ConfigError("total_timesteps: 0 trains nothing without a dagger section")
        _refuse_partial_rollouts(self)
        self._check_rollout()
        _refuse_contradictions(self)
        held_out = _held_out_by(self.env.id)
        if held_out is not None:
            self._no_split_defaults()
            self._check_no_splits(held_out)
            if self.dagger is not None:
                raise ConfigError(
                    f"dagger: the safe oracle DAgger imitates needs the simulator's ground "
                    f"truth, which {self.env.id} does not have ({_NO_SPLITS[held_out][0]}); "
                    "drop the dagger section, or train on rdtune/Partition-v0"
                )
        self._check_env()
        if held_out == "traces":
            self._check_held_out_traces()
        elif held_out == "node":
            self._check_held_out_node()
        else:
            self._check_splits()
        self._check_vec_env()
        return self

    @classmethod
    def parse(cls, data: Any, where: str = "config") -> TrainConfig:
        """Validate parsed YAML; errors name ``where`` and the key."""
        return configfile.validate(cls, data, where)

    def vectorization(self) -> str:
        """How the training envs are stepped: ``batched``, ``dummy`` or ``subproc``."""
        if self.vec_env != "auto":
            return self.vec_env
        if self.subproc:
            return "subproc"
        return "batched" if _has_vector_entry_point(self.env.id) else "dummy"

    def _check_splits(self) -> None:
        """Train on the train split, select checkpoints on validation, play the final table
        on test: checked on the kwargs each env gets once merged (``eval.kwargs`` over
        ``env.kwargs``, ``eval.final_kwargs`` over both), so no override lets training or
        selection see the test split (nor ``all``, which holds it) or the final table be
        played on mixes they saw."""
        seen = (
            ("env.kwargs", "training", self.env_kwargs().get("split", "train"), "train"),
            ("eval.kwargs", "checkpoint selection", self.eval_kwargs().get("split"), "validation"),
        )
        for key, what, split, use in seen:
            if split in ("test", "all"):
                raise ConfigError(
                    f"{key}: split {split!r}: {what} must not see the test split (the final "
                    f"table is played there); use split: {use}"
                )
        final = self.final_kwargs().get("split")
        if final != "test":
            raise ConfigError(
                f"eval.final_kwargs: split {final!r}: the final table is the held-out one, "
                "played on mixes neither training nor selection saw; use split: test"
            )

    def _no_split_defaults(self) -> None:
        """An env without scenario splits (the trace env, the remote one) gets nothing from
        the split defaults of ``eval``: unless given, selection runs on the training data
        (``eval.kwargs: {}``) and the final table names none (refused below: it must name
        held-out data)."""
        unset = {k: {} for k in ("kwargs", "final_kwargs") if k not in self.eval.model_fields_set}
        if unset:
            object.__setattr__(self, "eval", self.eval.model_copy(update=unset))

    def _check_no_splits(self, held_out: str) -> None:
        """A ``split`` for an env without splits: refused before the env is built (which
        would say only that the env takes no such argument), with what to write instead."""
        runs_on, instead = _NO_SPLITS[held_out]
        for key, kwargs in (
            ("env.kwargs", self.env.kwargs),
            ("eval.kwargs", self.eval.kwargs),
            ("eval.final_kwargs", self.eval.final_kwargs),
        ):
            if "split" in kwargs:
                raise ConfigError(
                    f"{key}: split {kwargs['split']!r}: {self.env.id} has no scenario splits "
                    f"({runs_on}); {instead[key]}"
                )

    def _check_held_out_node(self) -> None:
        """The remote env's final table runs on an agent or a scenario neither training nor
        selection ran on: another agent (``address``), or a simulated agent reset to a
        scenario they did not use (``scenario``; None keeps the agent's own). And training
        has one env: several would share the one agent, each resetting and stepping the
        node the others act on."""
        if self.n_envs != 1:
            raise ConfigError(
                f"n_envs: {self.n_envs} envs of {self.env.id} would share the agent of "
                "env.kwargs.address, each resetting and stepping the node the others act on; "
                "use n_envs: 1"
            )

        def node(kwargs: dict[str, Any]) -> tuple[Any, Any]:
            return kwargs.get("address"), kwargs.get("scenario")

        final = node(self.final_kwargs())
        for key, what, kwargs in (
            ("env.kwargs", "training", self.env_kwargs()),
            ("eval.kwargs", "checkpoint selection", self.eval_kwargs()),
        ):
            if node(kwargs) == final:
                raise ConfigError(
                    f"eval.final_kwargs: the final table would run on the agent {final[0]!r} "
                    f"with scenario {final[1]!r}, as {what} does ({key}); it is the held-out "
                    "one: give eval.final_kwargs: {scenario: NAME} (a simulated agent reset "
                    "to a scenario neither uses) or {address: ANOTHER_AGENT}"
                )

    def _check_held_out_traces(self) -> None:
        """The trace env's final table is played on trace files neither training nor
        selection replayed: other recordings, not the same file by another name or link,
        nor a copy of one (the same bytes). Selection may replay the training traces."""
        if "traces" not in self.eval.final_kwargs:
            raise ConfigError(
                "eval.final_kwargs: no traces: the final table is the held-out one, played on "
                "traces neither training nor selection replayed; give eval.final_kwargs: "
                "{traces: [FILE, ...]} of other recordings"
            )
        seen = [*_trace_keys("env.kwargs", self.env.kwargs)]
        seen += _trace_keys("eval.kwargs", self.eval.kwargs)
        digests: dict[str, str] = {}
        for key, path in _trace_keys("eval.final_kwargs", self.eval.final_kwargs):
            for other_key, other in seen:
                how = _same_recording(path, other, digests)
                if how:
                    raise ConfigError(
                        f"{key}: {path} is {how} {other_key} ({other}): the final table is the "
                        "held-out one, played on traces neither training nor selection "
                        "replayed; give other recordings"
                    )

    def _check_rollout(self) -> None:
        """PPO's minibatches must split one rollout (``n_envs * ppo.n_steps`` samples)."""
        rollout = self.n_envs * self.ppo.n_steps
        batch = self.ppo.batch_size
        if rollout < 2:
            raise ConfigError(
                f"ppo.n_steps: a rollout of n_envs x n_steps = {rollout} sample; PPO needs "
                "at least 2 (advantages are normalised over a minibatch)"
            )
        if batch > rollout:
            raise ConfigError(
                f"ppo.batch_size: {batch} is more than a rollout holds "
                f"(n_envs x n_steps = {self.n_envs} x {self.ppo.n_steps} = {rollout})"
            )
        if rollout % batch:
            raise ConfigError(
                f"ppo.batch_size: {batch} does not divide a rollout of n_envs x n_steps = "
                f"{rollout} (the last minibatch would be {rollout % batch} samples)"
            )

    def _check_vec_env(self) -> None:
        how = self.vectorization()
        if self.subproc and how != "subproc":
            raise ConfigError(f"subproc: true contradicts vec_env: {self.vec_env}")
        if how == "batched" and not _has_vector_entry_point(self.env.id):
            raise ConfigError(
                f"vec_env: batched needs an env with a vector_entry_point; {self.env.id} has "
                "none (use dummy or subproc)"
            )
        if self.rollout_workers:
            if how != "batched":
                raise ConfigError(
                    f"rollout_workers: Ray rollout workers hold batched envs; vec_env is {how}"
                )
            if self.rollout_workers > self.n_envs:
                raise ConfigError(
                    f"rollout_workers: {self.rollout_workers} workers for {self.n_envs} envs"
                )

    def _check_env(self) -> None:
        """Build the env once to turn bad env kwargs into a config error now, not mid-run;
        and the evaluation envs must have training's observation and action layout: the
        policy is played there, and a mismatch would fail only after training (with
        ``eval.freq: 0``, after every PPO step)."""
        import gymnasium as gym

        import envs  # noqa: F401  (registers the ids)

        trained: tuple | None = None
        for where, kwargs in (
            ("env.kwargs", self.env_kwargs()),
            ("eval.kwargs", self.eval_kwargs()),
            ("eval.final_kwargs", self.final_kwargs()),
        ):
            try:
                env = gym.make(self.env.id, **kwargs)
            except gym.error.Error as exc:
                raise ValueError(f"env.id: {exc}") from None
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{_trace_key(where, kwargs, exc)}: {exc}") from None
            try:  # a policy trained so could not control some machine its scenarios run on
                family, encoder = (getattr(env.unwrapped, a, None) for a in ("family", "encoder"))
                if family is not None and encoder is not None:
                    family.check_encoder(encoder.version)
                layout = _layout(env)
            except ValueError as exc:
                raise ValueError(f"{where}.encoder_version: {exc}") from None
            finally:
                env.close()
            if trained is None:
                trained = layout
            elif layout != trained:
                raise ConfigError(_layout_error(self, where))

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
        data = self.model_dump()
        data["ppo"] = self.ppo.model_dump(exclude_none=True)
        return data

    def with_overrides(self, overrides: dict[str, Any]) -> TrainConfig:
        """A copy with dotted-key overrides applied (``{"ppo.learning_rate": 1e-3}``),
        re-validated."""
        data = self.to_dict()
        for key, value in overrides.items():
            node = data
            parts = key.split(".")
            for p in parts[:-1]:
                if node.get(p) is None:
                    node[p] = {}
                if not isinstance(node[p], dict):
                    raise ConfigError(f"{key}: {p} is not a section")
                node = node[p]
            node[parts[-1]] = value
        return TrainConfig.parse(data, "overrides")


def _layout_error(cfg: TrainConfig, where: str) -> str:
    """The error for an evaluation env (``where``) whose layout is not training's,
    naming the layout key of that section which differs, when one does."""
    what = {"eval.kwargs": "checkpoint selection", "eval.final_kwargs": "the final table"}
    given = cfg.eval.kwargs if where == "eval.kwargs" else cfg.eval.final_kwargs
    trained = cfg.env_kwargs()
    for key in LAYOUT_KEYS:
        if key in given and given[key] != trained.get(key):
            return (
                f"{where}.{key}: {given[key]!r} gives {what[where]} another observation "
                f"or action layout than training's (env.kwargs.{key}: "
                f"{trained.get(key, 'default')!r}); a policy plays only the layout it "
                "learned: remove it"
            )
    return (
        f"{where}: {what[where]} would play another observation or action layout than "
        "training's; a policy plays only the layout it learned"
    )


def _refuse_partial_rollouts(cfg: TrainConfig) -> None:
    """PPO trains whole rollouts (``n_envs * ppo.n_steps`` steps): a total that is not a
    whole number of them would silently train up to the next one, while ``eval.json`` and
    the model card said the total asked for. Refused, with the totals nearest to it."""
    steps, rollout = cfg.total_timesteps, cfg.n_envs * cfg.ppo.n_steps
    if 0 < steps < rollout:
        raise ConfigError(
            f"total_timesteps: {steps} is less than one rollout (n_envs x ppo.n_steps = "
            f"{rollout}); PPO trains whole rollouts"
        )
    if steps % rollout:
        below = steps - steps % rollout
        raise ConfigError(
            f"total_timesteps: {steps} is not a whole number of rollouts (n_envs x "
            f"ppo.n_steps = {cfg.n_envs} x {cfg.ppo.n_steps} = {rollout}); PPO trains whole "
            f"rollouts and would train {below + rollout}: use {below} or {below + rollout}"
        )


def _refuse_contradictions(cfg: TrainConfig) -> None:
    """Sections that each validate but train a policy at odds with how it is then run."""
    if cfg.runtime.shield is not None and not cfg.env.kwargs.get("shield", False):
        # the runtime shield is the training one with options changed: a policy trained
        # without one never saw its floors (its floor features were always 0)
        raise ConfigError(
            "runtime.shield: the policy trains without a shield (env.kwargs.shield is "
            "false) and would run behind one it never saw; set env.kwargs.shield, or "
            "drop runtime.shield"
        )
    if cfg.dagger is not None and cfg.normalize_obs:
        # DAgger fits the actor on raw features (its envs have no VecNormalize); PPO, the
        # evaluations and the export feed it normalised ones
        raise ConfigError(
            "dagger: the warm start fits the actor on raw observations, and with "
            "normalize_obs: true PPO, the evaluations and the exported policy feed it "
            "normalised ones; drop the dagger section or set normalize_obs: false"
        )


# the env kwargs that set the observation and action layout (envs/partition.py)
LAYOUT_KEYS = ("max_groups", "share_levels", "mba_levels", "share_all", "encoder_version")


def _layout(env) -> tuple:
    """What a policy trained on ``env`` needs of another env to act there: the spaces and
    the encoder's and decoder's layouts (same-sized spaces can still order or mean their
    entries otherwise)."""
    u = env.unwrapped
    layouts = tuple(
        getattr(u, a).layout() if hasattr(u, a) else None for a in ("encoder", "decoder")
    )
    return (env.observation_space, env.action_space, *layouts)


def _held_out_by(env_id: str) -> str | None:
    """What holds ``env_id``'s held-out data when it has no scenario splits: ``traces``
    (the trace env: other trace files), ``node`` (the remote env: another agent or
    scenario); None: a split."""
    from envs import REMOTE_PARTITION_ID
    from training.trace_env import TRACE_PARTITION_ID

    return {TRACE_PARTITION_ID: "traces", REMOTE_PARTITION_ID: "node"}.get(
        env_id.rpartition(":")[2]  # with or without its module
    )


# per kind of held-out data: what the env's episodes run on, and what to write instead of
# a split under each key
_NO_SPLITS: dict[str, tuple[str, dict[str, str]]] = {
    "traces": (
        "its episodes replay recorded traces",
        {
            "env.kwargs": "train on the trace files of env.kwargs.traces",
            "eval.kwargs": "select checkpoints on other trace files with eval.kwargs: "
            "{traces: [FILE, ...]}, or on the training ones with {}",
            "eval.final_kwargs": "play the final table on held-out trace files with "
            "eval.final_kwargs: {traces: [FILE, ...]}",
        },
    ),
    "node": (
        "its episodes run on an agent's node",
        {
            "env.kwargs": "train on the agent of env.kwargs.address (a simulated one: "
            "env.kwargs.scenario picks its scenario)",
            "eval.kwargs": "select checkpoints on another agent or scenario with eval.kwargs: "
            "{address: ..., scenario: ...}, or on the training one with {}",
            "eval.final_kwargs": "play the final table on an agent or scenario neither "
            "training nor selection uses, with eval.final_kwargs: {address: ..., "
            "scenario: ...}",
        },
    ),
}


def _trace_keys(where: str, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, file)`` for each trace file of ``kwargs`` (``env.kwargs.traces[1]``)."""
    files = kwargs.get("traces")
    if files is None:
        return []
    if isinstance(files, str):
        return [(f"{where}.traces", files)]
    return [(f"{where}.traces[{i}]", str(f)) for i, f in enumerate(files)]


def _same_recording(a: str, b: str, digests: dict[str, str]) -> str:
    """How trace files ``a`` and ``b`` hold one recording: ``""`` (they do not), the same
    file (by any name or link) or a copy (the same bytes; hashed only when the sizes are
    equal, once per file, kept in ``digests``)."""

    def digest(path: str) -> str:
        if path not in digests:
            with open(path, "rb") as f:
                digests[path] = hashlib.file_digest(f, "sha256").hexdigest()
        return digests[path]

    if os.path.samefile(a, b):
        return "the same file as"
    if os.path.getsize(a) == os.path.getsize(b) and digest(a) == digest(b):
        return "a copy of"
    return ""


def _trace_key(where: str, kwargs: dict[str, Any], exc: Exception) -> str:
    """``where``, or the key of the trace file ``exc`` names when it is a TraceError about
    one of ``kwargs["traces"]`` (``env.kwargs.traces[1]``)."""
    from training.traces import TraceError

    if not isinstance(exc, TraceError):
        return where
    files = kwargs.get("traces")
    if isinstance(files, str):
        return f"{where}.traces"
    for i, f in enumerate(files if isinstance(files, list) else []):
        if isinstance(f, str) and Path(f) == Path(exc.path):
            return f"{where}.traces[{i}]"
    return where


def _has_vector_entry_point(env_id: str) -> bool:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)

    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return False
    return spec.vector_entry_point is not None


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML training config; errors name the file and the key."""
    data = configfile.read_config_file(path)
    if not data:
        # An empty file would silently train the defaults for 100k steps: a file with no
        # settings is a mistake (a wrong path, a truncated copy), not a request for defaults.
        raise ConfigError(f"{path}: the config is empty; start from training/configs/default.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return TrainConfig.parse(data, str(path))

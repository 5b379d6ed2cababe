"""The learned-policy runtime: an exported ONNX policy behind the ``Controller`` interface.

Loads what ``rdtune export`` writes (training/export.py): ``policy.onnx`` and its model card
(models/card.py). Before deciding anything it checks that the policy fits: the card's
feature encoder version and layout must be this code's (:mod:`models.features`), its
action design this code's decoder (:mod:`models.actions`), and the node's capabilities
within what the policy was trained on (CAT present, ways and minimum mask bits in range,
an MBA mode it has seen). A mismatch raises :class:`PolicyCompatibilityError` naming every
difference, so a policy never sees inputs it was not trained on (docs/ARCHITECTURE.md,
"Data flow"). Groups beyond the policy's slots are not a refusal: the encoder leaves them
out and the decoder leaves their allocation untouched (models/features.py), which each
decision's note says.

Each decision: encode the snapshot (the same encoder as training), apply the card's
observation normalisation, run the actor (compiled for the default design where it agrees
with ONNX Runtime on probe observations at load, models/actor.py; otherwise ONNX Runtime, 1
intra-op thread, batch 1; docs/BENCHMARKS.md has both latencies), and decode the action
into a plan that is valid by construction, above the SLO shield's floors when the policy
was trained behind the shield (models/shield.py; the card's env options say so, and its
runtime section may set the shield's options where the policy runs, e.g. the lapse of
futile floors). It starts as its training episodes started (the card's ``baseline``: the
node's current allocation, or CoPart's equal split for a policy trained before the start
state was an option).
:class:`RandomController` is the same loop with random actions. No torch here: the runtime
needs numpy and onnxruntime (and onnx and numba for the compiled forward pass).

Starting refuses a node whose exclusive group the plans would make share ways (groups
beyond the slots, or more than the cache's minimum-size slices; docs/CONTROLLERS.md), and
runs one throwaway decision there so that numba compiles the kernels before the first
interval rather than in it.

Loading refuses an ONNX file whose weights hold a NaN or an infinity (with the onnx
package, which reads them), and a decision whose logits are not finite is an error of the
controller (:class:`~models.actor.NonFiniteLogits`), never an action, on either runtime.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agent.types import (
    Allocation,
    AllocationPlan,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    NodeCapabilities,
    Snapshot,
)
from models.actions import ActionDecoder
from models.actor import (
    CompiledActor,
    NonFiniteLogits,
    check_logits,
    compile_actor,
    disagreements,
    non_finite_initializers,
    probes,
    read_model,
    with_logits,
)
from models.basic import EqualPartition, Unpartitioned
from models.card import CARD_FILE, ModelCard, PolicyCompatibilityError, PolicyError
from models.controller import ControlContext, Controller, Decision
from models.features import FeatureEncoder, group_features
from models.shield import NodeShield, ShieldConfig

log = logging.getLogger("rdtune.policy")

DEFAULT_POLICY = Path(__file__).parent / "policies" / "default"

# Probe observations the compiled forward pass must agree on with ONNX Runtime at load
# (a few milliseconds).
_PROBES = 64

# How a controller starts: ``keep`` the node's allocation, or apply an equal split or
# unpartitioned; the environments' ``baseline`` option names the same start states.
START_STATES = ("keep", "equal", "full")
_START_OF_BASELINE = {"current": "keep", "equal": "equal", "full": "full"}

__all__ = [
    "DEFAULT_POLICY",
    "START_STATES",
    "ActingController",
    "PolicyCompatibilityError",
    "PolicyController",
    "PolicyError",
    "RandomController",
    "check_export",
    "policy_available",
]


def check_export(path: str | Path, caps: NodeCapabilities, groups: int = 0) -> ModelCard:
    """The export's card when it can control a node with ``caps``, else
    :class:`PolicyCompatibilityError` naming every mismatch; groups beyond the policy's
    slots are a warning, not a refusal."""
    card = ModelCard.read(path)
    problems = card.problems(caps)
    if problems:
        raise PolicyCompatibilityError("; ".join(problems))
    if groups > card.trained_on.max_groups:
        log.warning(
            "policy %s handles %d groups; the node has %d: the rest keep their allocation",
            path,
            card.trained_on.max_groups,
            groups,
        )
    return card


def policy_available() -> bool:
    """Whether the bundled policy is there (a checkout without it still evaluates)."""
    return (DEFAULT_POLICY / CARD_FILE).is_file()


class ActingController(Controller):
    """What a learned policy does every interval, whatever computes its action: encode the
    snapshot (models/features.py), let :meth:`act` choose share and MBA levels, and decode
    them (models/actions.py) above the SLO shield's floors (models/shield.py) when it has
    one. It starts from ``baseline`` (``keep``: the node's current allocation, as training
    episodes start; ``equal``: CoPart's equal split; ``full``: unpartitioned), and the
    shield's floors start from what the groups hold then.
    """

    name = "acting"
    masked = True
    # start() runs one throwaway decision on the node (:class:`_Warming`)
    warm_up = True

    def __init__(
        self,
        encoder: FeatureEncoder,
        decoder: ActionDecoder,
        *,
        shield: ShieldConfig | bool | dict | None = None,
        baseline: str = "keep",
    ) -> None:
        if baseline not in START_STATES:
            raise ValueError(f"baseline must be one of {START_STATES}, got {baseline!r}")
        self.encoder, self.decoder = encoder, decoder
        self.shield_config = ShieldConfig.of(shield)
        self._shield = (
            NodeShield(encoder.max_groups, self.shield_config) if self.shield_config else None
        )
        self.baseline = baseline
        self._caps: NodeCapabilities | None = None
        self._slots: list[str] = []
        self._prepared = None  # (groups, caps, prepared encoder, prepared decoder)

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    def check_capabilities(self, caps: NodeCapabilities) -> None:
        """Raise when the node is not one this controller can act on (default: any)."""

    def _label(self) -> str:
        return self.name

    def start(self, ctx: ControlContext) -> Decision:
        self.check_capabilities(ctx.capabilities)
        why = self.shares_exclusive(ctx.groups, ctx.capabilities)
        if why:  # every plan would be refused: say so at start rather than each interval
            raise PolicyCompatibilityError(f"{self._label()} cannot keep groups apart: {why}")
        if self.warm_up:
            _Warming(self).start(ctx)
        self._caps = ctx.capabilities
        self._prepared = None
        plan, what = None, "the allocation held"
        if self.baseline == "equal":
            plan, what = EqualPartition().start(ctx).plan, "equal split"
        elif self.baseline == "full":
            plan, what = Unpartitioned().start(ctx).plan, "unpartitioned"
        held = ctx.allocation if plan is None else _planned(ctx.allocation, plan)
        _, _, enc, dec, _, _ = self._prepare(ctx)
        enc.reset_history()
        if self._shield is not None:
            self._shield.start(self._slots, ctx.groups, ctx.capabilities, dec.layout, held)
        return Decision(plan, note=f"{self._label()}: {what} to start")

    def shares_exclusive(self, groups: Mapping[str, GroupSpec], caps: NodeCapabilities) -> str:
        """Why this controller's plans would make an exclusive group share ways with
        another group, which the kernel refuses ("" when they cannot): groups beyond its
        slots keep their masks, which the slots' ways cover; groups that outnumber the
        minimum-size slices share the last one; share_all's all-zero levels share every
        way."""
        exclusive = sorted(g for g, s in groups.items() if s.exclusive)
        if not exclusive:
            return ""
        named = f"group(s) {', '.join(exclusive)} are exclusive"
        slots = self.encoder.max_groups
        if len(groups) > slots:
            return (
                f"{named} and the node has {len(groups)} groups, {len(groups) - slots} beyond "
                f"the {slots} it controls, which keep ways its plans give to others"
            )
        l3 = caps.l3
        least, ways = (max(1, l3.min_cbm_bits), l3.num_ways) if l3 is not None else (1, 0)
        if l3 is not None and len(groups) > ways // least:
            return (
                f"{named} and {len(groups)} groups outnumber the {ways // least} slices of "
                f"{least} way(s) of {ways}: some must share"
            )
        if self.decoder.share_all:
            return f"{named} and its action design shares every way among all groups"
        return ""

    def _prepare(self, ctx: ControlContext):
        groups, caps = ctx.groups, ctx.capabilities
        p = self._prepared
        if p is not None and p[0] == groups and p[1] == caps:
            return p
        self._slots = self.encoder.slots(groups)
        dec = self.decoder.prepare(self._slots, caps)
        p = (
            dict(groups),
            caps,
            self.encoder.prepare(groups, caps, self._slots),
            dec,
            self.decoder.action_masks(dec.layout)[0],  # fixed while the groups are
            self.shares_exclusive(groups, caps),
        )
        if p[5]:
            log.warning("%s keeps the allocation while %s", self._label(), p[5])
        if self._prepared is not None:  # the groups changed under a running controller
            p[2].reset_history()
            if self._shield is not None:
                self._shield.start(self._slots, groups, caps, p[3].layout, ctx.allocation)
        self._prepared = p
        return p

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        caps = ctx.capabilities
        if caps is not self._caps and caps != self._caps:
            self.check_capabilities(caps)
            self._caps = caps
        if not ctx.groups:  # slots are every group up to max_groups (>= 1)
            return Decision(note=f"{self.name}: no own groups")
        _, _, enc, dec, mask, apart = self._prepare(ctx)
        if apart:  # groups changed mid-run into a set its plans would make share
            return Decision(note=f"{self.name}: keeps the allocation: {apart}")
        slots = self._slots
        floors = None
        if self._shield is not None:
            self._shield.observe_snapshot(enc, snapshot, ctx.allocation)
            floors = self._shield.floors()
        obs = enc.encode(snapshot, ctx.allocation, None if floors is None else floors[0])
        levels = self.act(obs, mask if self.masked else None)
        if self._shield is not None:
            levels = self._shield.pinned(levels)
        decoded = dec.decode(levels, floors)
        ways = decoded.ways
        note = f"{self.name}: " + ", ".join([f"{g}={ways.get(g, '-')}w" for g in slots])
        held = floors[0][0].tolist() if floors is not None else ()
        if any(held):
            held = zip(slots, held, strict=False)  # slots <= the floors' S
            note += " (shield floors " + ", ".join([f"{g}>={w}w" for g, w in held if w]) + ")"
        if decoded.repairs:
            note += " (" + "; ".join(decoded.repairs) + ")"
        if len(ctx.groups) > len(slots):
            note += f"; {len(ctx.groups) - len(slots)} groups beyond the policy's slots untouched"
        return Decision(decoded.plan, note=note)


class _Warming(ActingController):
    """A throwaway controller of another's design (encoder, decoder, shield) that decides
    once on the node it starts on, from made-up counters: numba compiles the encoder's,
    the shield's and the decoder's kernels for this node's arguments then, as the run
    starts (seconds on a cold cache, e.g. a fresh container), rather than in the first
    interval's decision. Its state is its own: the controller it warms decides as before."""

    name = "warming"
    warm_up = False

    def __init__(self, of: ActingController) -> None:
        # copies: an encoder keeps the encoding it prepared last, its history included
        encoder, decoder = dataclasses.replace(of.encoder), dataclasses.replace(of.decoder)
        super().__init__(encoder, decoder, shield=of.shield_config, baseline="keep")

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        return np.zeros(len(self.decoder.nvec), dtype=np.int64)

    def start(self, ctx: ControlContext) -> Decision:
        super().start(ctx)
        # measured counters and latencies, so every kernel runs on numbers
        latency = LatencyStats(10, 1.0, 1.0, 1.0, 1.0)
        sample = GroupSample(1e9, 1e9, 1e7, 1e6, 1e6, 1e8, 1e8)
        groups = {
            g: dataclasses.replace(sample, latency=latency if s.kind is GroupKind.LC else None)
            for g, s in ctx.groups.items()
        }
        return self.decide(Snapshot(0.0, 1.0, groups), ctx)


def _same_shape(recorded: Any, graph: list[Any]) -> bool:
    """Whether a card's recorded input shape is the graph's: the same sizes, a named
    (batch) dimension matching any named one or the 1 it is fixed at here."""
    if not isinstance(recorded, list | tuple) or len(recorded) != len(graph):
        return False
    return all(
        (isinstance(r, str) and (isinstance(g, str) or g in (None, 1))) or r == g
        for r, g in zip(recorded, graph, strict=True)
    )


def _batch_name(recorded: Any, i: int, dim: Any) -> Any:
    """The graph's dimension ``i`` as the card's recorded shape names it: the batch
    dimension a card names is fixed at 1 when the policy loads."""
    named = isinstance(recorded, list | tuple) and i < len(recorded)
    return recorded[i] if named and dim == 1 and isinstance(recorded[i], str) else dim


def _planned(held: Allocation, plan: AllocationPlan) -> Allocation:
    """What the node holds once ``plan`` is applied over ``held``: each entry overlaid on
    the group's held one (a resource the plan leaves None stays as held)."""
    groups = {g: dict(v) for g, v in held.groups.items()}
    for g, per in plan.groups.items():
        mine = groups.setdefault(g, {})
        for d, change in per.items():
            mine[d] = mine[d].overlay(change) if d in mine else change
    return Allocation(groups)


class RandomController(ActingController):
    """Uniformly random share and MBA levels each interval (behind the shield when it has
    one): the floor any learned policy must beat, and the test of the shield alone.

    Args:
        shield: the SLO shield (True, a mapping of options, or False).
        baseline: start state (``keep``, ``equal``, ``full``).
        seed: the random stream's seed.
        max_groups, share_levels, mba_levels, share_all: the action design (training's
            defaults; :class:`models.actions.ActionDecoder`).
    """

    name = "random"

    def __init__(
        self,
        *,
        shield: bool | dict = True,
        baseline: str = "keep",
        seed: int = 0,
        max_groups: int = 8,
        share_levels: int = 5,
        mba_levels: int = 4,
        share_all: bool = False,
    ) -> None:
        super().__init__(
            FeatureEncoder(max_groups, 1),  # random actions read no feature: the cheapest
            ActionDecoder(max_groups, share_levels, mba_levels, share_all),
            shield=shield,
            baseline=baseline,
        )
        self._rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        return self._rng.integers(0, self.decoder.nvec)


class PolicyController(ActingController):
    """A trained policy as a controller.

    Args:
        path: the export directory (or its ``model_card.json``); default: the shipped
            ``models/policies/default``.
        threads: ONNX Runtime intra-op threads (1: a decision is tiny; more only adds
            synchronisation).
        compiled: run the forward pass compiled (models/actor.py) where the policy is of
            the default design and the compiled pass agrees with ONNX Runtime on probe
            observations; False: always ONNX Runtime.
    """

    name = "policy"

    def __init__(
        self, path: str | Path | None = None, *, threads: int = 1, compiled: bool = True
    ) -> None:
        card = ModelCard.read(path if path is not None else DEFAULT_POLICY)
        self.card = card
        self.path = card.root
        data = card.servable()
        features, actions = card.features, card.actions
        kwargs = (card.env or {}).get("kwargs") or {}
        try:
            super().__init__(
                FeatureEncoder(int(features["max_groups"]), int(card.encoder_version)),
                ActionDecoder(
                    int(actions["max_groups"]),
                    int(actions["share_levels"]),
                    int(actions["mba_levels"]),
                    bool(actions.get("share_all", False)),
                ),
                # the shield it learned behind, or the one its card runs it behind; the start
                # state of its episodes (an export from before both: no shield, equal split)
                shield=card.runtime_shield(),
                baseline=_START_OF_BASELINE.get(kwargs.get("baseline", "equal"), "equal"),
            )
        except ValueError as exc:
            raise PolicyError(f"{self.path}: {exc}") from None
        self.masked = card.masked
        norm = card.normalization
        self._norm = None
        if norm is not None:  # of the features' size, finite (the card checks both)
            mean = np.asarray(norm["mean"], dtype=np.float32)
            std = np.sqrt(np.asarray(norm["var"], dtype=np.float64) + norm["epsilon"])
            self._norm = (mean, std.astype(np.float32), float(norm["clip"]))
        # The runtime feeds one observation at a time: a batch dimension fixed at 1 lets
        # ONNX Runtime fold the graph's shape arithmetic (a fifth of a call, measured).
        batch = sorted(
            {
                dims[0]
                for dims in (card.onnx.get("inputs") or {}).values()
                if dims and isinstance(dims[0], str)
            }
        )
        onnx_path = card.onnx_path
        graph = self._checked(onnx_path, data)
        self._session = self._open(onnx_path, graph, threads, tuple(batch))
        self._check_inputs(onnx_path)
        self._open_mask = np.ones(int(self.decoder.nvec.sum()), dtype=bool)
        self._actor = self._compile(data) if compiled else None

    def _check_inputs(self, onnx_path: Path) -> None:
        """PolicyError (one line naming the card) unless the ONNX graph's inputs are the
        ones the card records and the ones this runtime feeds: ``obs`` of the feature
        layout's size, and ``action_mask`` of the action design's size when masked. A card
        edited apart from its model would otherwise feed the graph what it does not take."""
        card, onnx_name = self.path / CARD_FILE, onnx_path.name
        recorded = self.card.onnx.get("inputs") or {}
        graph = {i.name: list(i.shape) for i in self._session.get_inputs()}
        if recorded and set(recorded) != set(graph):
            raise PolicyError(
                f"{card}: the card records inputs {sorted(recorded)}, "
                f"{onnx_name} takes {sorted(graph)}"
            )
        layout = self.card.features.get("size", self.encoder.size)
        fed = {"obs": ("the feature layout", {self.encoder.size, layout})}
        if self.masked:
            fed["action_mask"] = ("the action design", {int(self.decoder.nvec.sum())})
        if set(fed) != set(graph):
            masked = "masked" if self.masked else "not masked"
            raise PolicyError(
                f"{card}: a policy {masked} is fed {sorted(fed)}, {onnx_name} takes {sorted(graph)}"
            )
        for name, dims in graph.items():
            want = recorded.get(name)
            # shown as the card names it: the batch dimension is fixed at 1 here (_open)
            shown = [_batch_name(want, i, d) for i, d in enumerate(dims)]
            if want is not None and not _same_shape(want, dims):
                raise PolicyError(
                    f"{card}: the card records input {name!r} as {want}, {onnx_name} takes {shown}"
                )
            what, sizes = fed.get(name, ("", set()))
            for size in sorted(sizes, key=str):
                if dims[-1:] != [size]:
                    raise PolicyError(
                        f"{card}: {what} has {size} values, {onnx_name} takes {name!r} as {shown}"
                    )

    @property
    def runtime(self) -> str:
        """What runs the forward pass: ``compiled`` or ``onnxruntime``."""
        return "compiled" if self._actor is not None else "onnxruntime"

    def _compile(self, data: bytes) -> CompiledActor | None:
        """The compiled forward pass when it applies and agrees with ONNX Runtime on every
        probe (models/actor.py); None otherwise (with a warning when they disagree)."""
        enc, dec = self.encoder, self.decoder
        groups = dec.max_groups
        if groups != enc.max_groups:
            return None
        names = group_features(enc.version)
        features, present_at = len(names), names.index("present")
        actor = compile_actor(
            data,
            groups=groups,
            features=features,
            present_at=present_at,
            share_levels=dec.share_levels,
            mba_levels=dec.mba_levels,
        )
        if actor is None:
            return None
        cases = probes(
            enc.size, groups, features, present_at, int(dec.nvec.sum()), n=_PROBES, seed=0
        )
        bad = disagreements(lambda o, m: self._act_compiled(actor, o, m), self._act_onnx, cases)
        if bad:
            log.warning(
                "%s: the compiled forward pass disagrees with ONNX Runtime on %d of %d "
                "probe observations; running ONNX Runtime",
                self.path,
                bad,
                len(cases),
            )
            return None
        return actor

    def _label(self) -> str:
        return f"policy {self.card.name}"

    def start(self, ctx: ControlContext) -> Decision:
        decision = super().start(ctx)
        env_id = str((self.card.env or {}).get("id", ""))
        simulated = not env_id.endswith(("TracePartition-v0", "RemotePartition-v0"))
        if simulated and not ctx.capabilities.memory_bandwidth_bps:
            # Every simulated node reports its peak: the policy never saw one that does not.
            log.warning(
                "%s was trained on simulated nodes, which report their peak memory bandwidth; "
                "this node does not (give it to the agent: memory_bandwidth_gbps, "
                "docs/DEPLOY.md), so the policy reads each group's bandwidth as a share of "
                "the node's observed total and no bandwidth utilisation, inputs it was not "
                "trained on: its decisions may differ from those it was evaluated with",
                self._label(),
                extra={"event": "policy_input_mismatch", "controller": self.name},
            )
        return decision

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> PolicyController:
        return cls(path, **kwargs)

    def check_capabilities(self, caps: NodeCapabilities) -> None:
        """Raise :class:`PolicyCompatibilityError` unless the node is one the policy fits."""
        problems = self.card.node_problems(caps)
        if problems:
            raise PolicyCompatibilityError(
                f"policy {self.card.name!r} ({self.path}): " + "; ".join(problems)
            )

    # ------------------------------------------------------------------ runtime

    @staticmethod
    def _checked(path: Path, data: bytes) -> bytes:
        """The model ONNX Runtime runs: ``data`` with its logits among the outputs, so
        each decision checks they are finite (models/actor.py); PolicyError when a weight
        is NaN or infinite. ``data`` as it is without the onnx package."""
        model = read_model(data)
        if model is None:
            return data
        bad = non_finite_initializers(model)
        if bad:
            raise PolicyError(
                f"{path}: the ONNX policy's weights are not finite (NaN or inf) in "
                f"{len(bad)} initializer(s), e.g. {bad[0]!r}"
            )
        return with_logits(model) or data

    @staticmethod
    def _open(path: Path, data: bytes, threads: int, batch_dims: tuple[str, ...] = ()):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        for dim in batch_dims:
            opts.add_free_dimension_override_by_name(dim, 1)
        try:
            return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise PolicyError(f"{path}: not a loadable ONNX model: {exc}") from None

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """The policy's action for one encoded observation (normalised here);
        :class:`~models.actor.NonFiniteLogits` naming the policy when its logits are NaN
        or infinite."""
        try:
            if self._actor is not None:
                return self._act_compiled(self._actor, obs, mask)
            return self._act_onnx(obs, mask)
        except NonFiniteLogits as exc:
            raise NonFiniteLogits(f"policy {self.card.name!r} ({self.path}): {exc}") from None

    def _act_compiled(
        self, actor: CompiledActor, obs: np.ndarray, mask: np.ndarray | None
    ) -> np.ndarray:
        # every level open where the policy takes no mask, as its ONNX graph has none
        return actor(obs, mask if mask is not None and self.masked else self._open_mask, self._norm)

    def _act_onnx(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        o = obs.astype(np.float32, copy=False)[None, :]
        if self._norm is not None:
            mean, std, clip = self._norm
            o = np.clip((o - mean) / std, -clip, clip).astype(np.float32)
        feeds = {"obs": o}
        if self.masked:
            if mask is None:
                mask = np.ones(int(self.decoder.nvec.sum()), dtype=bool)
            feeds["action_mask"] = mask[None, :]
        out = self._session.run(None, feeds)
        check_logits(*out[1:])  # the logits with_logits exposed (none without onnx)
        return out[0][0]

"""A compiled forward pass for exported policies of rdtune's own design, read from the
policy's ONNX file and checked against ONNX Runtime before it is trusted.

The ONNX file stays the artefact: its weights are read from it, and ONNX Runtime remains
the reference that runs any graph. But for one observation at a time ONNX Runtime spends
most of a call on per-node dispatch (some fifty nodes of a few dozen numbers each; docs/
BENCHMARKS.md, "Policy inference"), while the network itself is under a hundred thousand
multiply-adds. For the design training ships by default (training/policies.py: the group-set
extractor with its per-slot context layer, no actor MLP, the shared per-slot head) the
arithmetic is written once as a compiled loop (models/actor_kernel.py).

:func:`compile_actor` recognises that design in the graph (its five layers by name, their
activations, shapes that fit the model card's layout) and returns None for anything else,
and where numba (or its compiling) or the onnx package is missing: the runtime then keeps
ONNX Runtime.
:func:`disagreements` runs both on probe observations; models/policy.py uses the compiled
pass only when they agree on every probe. Both passes refuse NaN or infinite logits
(:class:`NonFiniteLogits`): the compiled one in its argmax, ONNX Runtime's through the
logits :func:`with_logits` adds to the graph's outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agent import compiled
from models import actor_kernel as ak
from models.card import PolicyError

# What a policy whose logits are NaN or infinite is refused with at decision time (the
# check training's action head has too: training/train.py).
NON_FINITE_LOGITS = (
    "the policy's action logits are not finite (NaN or inf): the observation holds a "
    "non-finite value or the weights do"
)


class NonFiniteLogits(PolicyError):
    """A decision's logits are NaN or infinite: an error of the controller, never an action."""


def check_logits(*logits: np.ndarray) -> None:
    """Raise :class:`NonFiniteLogits` unless every value of ``logits`` is finite."""
    for x in logits:
        if not np.isfinite(x).all():
            raise NonFiniteLogits(NON_FINITE_LOGITS)


# The layers of the default design, by the scope torch's exporter names their nodes with
# (module paths of training/policies.py's GroupSetExtractor and SlotHead), with the
# activation after each (None: the logits).
_LAYERS = (
    ("/features_extractor/phi/phi.0/", "Relu"),
    ("/features_extractor/phi/phi.2/", "Relu"),
    ("/features_extractor/rho/rho.0/", "Relu"),
    ("/action_net/body/body.0/", "Tanh"),
    ("/action_net/out/", None),
)


@dataclass(frozen=True)
class CompiledActor:
    """The per-slot design's weights, float32, each layer (inputs, outputs) row-major.

    Attributes:
        groups: slots in the observation; features: values per slot; present_at: the
            presence flag's index in a slot; share_levels: share logits per slot (the rest
            of a slot's logits are MBA levels).
        layers: ((w, b), ...) the five layers in :data:`_LAYERS`' order.
        mean_pool, max_pool: which pools the extractor concatenates (mean first).
    """

    groups: int
    features: int
    present_at: int
    share_levels: int
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    mean_pool: bool
    max_pool: bool
    _args: tuple = field(init=False, repr=False, compare=False)

    def __call__(
        self,
        obs: np.ndarray,
        mask: np.ndarray,
        norm: tuple[np.ndarray, np.ndarray, float] | None = None,
    ) -> np.ndarray:
        """The action (2 G,) int64 for one raw observation, normalised first by ``norm``
        (mean, std, clip) when given, under ``mask`` (bool, all share then all MBA
        logits); :class:`NonFiniteLogits` when a logit is NaN or infinite."""
        out = np.empty(2 * self.groups, dtype=np.int64)
        mean, std, clip = norm if norm is not None else (_EMPTY, _EMPTY, 0.0)
        ak.slot_actor(obs, mask, mean, std, clip, *self._args, out)
        if out.min() < 0:  # the kernel's mark of a non-finite logit
            raise NonFiniteLogits(NON_FINITE_LOGITS)
        return out

    def __post_init__(self) -> None:
        dims = (self.groups, self.features, self.present_at, self.share_levels,
                self.mean_pool, self.max_pool)  # fmt: skip
        weights = tuple(a for layer in self.layers for a in layer)
        # the kernel's arguments after the observation's, built once (frozen: set here)
        object.__setattr__(self, "_args", (np.array(dims, dtype=np.int64), *weights))


_EMPTY = np.zeros(0)


def compile_actor(
    data: bytes,
    *,
    groups: int,
    features: int,
    present_at: int,
    share_levels: int,
    mba_levels: int,
) -> CompiledActor | None:
    """The compiled forward pass of the ONNX model ``data`` when it is the default design
    with this layout (``groups`` slots of ``features`` values; ``share_levels`` +
    ``mba_levels`` logits per slot); None when it is another network, or numba or the onnx
    package is not installed."""
    if not compiled.COMPILING:
        return None  # as plain Python the loop is far slower than ONNX Runtime
    model = read_model(data)
    if model is None:
        return None
    found = _design(model.graph)
    if found is None:
        return None
    layers, mean_pool, max_pool = found
    (w1, _), (w2, _), (w3, _), (wb, _), (wo, _) = layers
    hidden, context = w2.shape[1], w3.shape[1]
    pooled = w3.shape[0] - hidden
    if (
        w1.shape[0] != features
        or w1.shape[1] != w2.shape[0]
        or pooled != hidden * (mean_pool + max_pool)
        or wb.shape[0] <= context + pooled
        or wo.shape != (wb.shape[1], share_levels + mba_levels)
    ):
        return None
    return CompiledActor(
        groups, features, present_at, share_levels, tuple(layers), mean_pool, max_pool
    )


def _design(graph) -> tuple[list, bool, bool] | None:
    """(the five layers' (weights, bias), mean pool, max pool) of an ONNX graph of the
    default design; None when the graph has other layers or activations."""
    from onnx import numpy_helper

    weights = {t.name: t for t in graph.initializer}
    ops: dict[str, list] = {}
    for node in graph.node:
        ops.setdefault(node.op_type, []).append(node)

    def tensor(name: str) -> np.ndarray | None:
        t = weights.get(name)
        return None if t is None else numpy_helper.to_array(t).astype(np.float32)

    def under(op: str, scope: str) -> list:
        # within the module ``scope`` (an unmasked export nests the actor one level down)
        return [n for n in ops.get(op, []) if scope in n.output[0]]

    layers = []
    for scope, activation in _LAYERS:
        matmul, add = under("MatMul", scope), under("Add", scope)
        if len(matmul) != 1 or len(add) != 1:
            return None
        w = tensor(matmul[0].input[1])
        b = next((tensor(i) for i in add[0].input if i in weights), None)
        if w is None or b is None or w.ndim != 2 or b.shape != (w.shape[1],):
            return None
        if activation is not None:
            module, index = scope.rstrip("/").rsplit(".", 1)
            if len(under(activation, f"{module}.{int(index) + 1}/")) != 1:
                return None
        layers.append((np.ascontiguousarray(w), b))
    if len(ops.get("MatMul", [])) + len(ops.get("Gemm", [])) != len(layers):
        return None  # more layers than the design has (an actor MLP, another head)
    mean_pool = bool(under("Div", "/features_extractor/"))
    max_pool = bool(under("ReduceMax", "/features_extractor/"))
    return layers, mean_pool, max_pool


def read_model(data: bytes):
    """The ONNX model in ``data``; None without the onnx package or when it cannot parse
    ``data`` (ONNX Runtime then says why)."""
    try:
        import onnx
    except ImportError:
        return None
    try:
        return onnx.load_from_string(data)
    except Exception:  # onnx raises protobuf's and its own errors
        return None


def non_finite_initializers(model) -> list[str]:
    """The names of ``model``'s floating-point initializers (its weights) holding a NaN or
    an infinity."""
    from onnx import numpy_helper

    bad = []
    for t in model.graph.initializer:
        w = numpy_helper.to_array(t)
        if np.issubdtype(w.dtype, np.floating) and not np.isfinite(w).all():
            bad.append(t.name)
    return bad


def with_logits(model) -> bytes | None:
    """``model`` serialised with what each of its ArgMax nodes reads (the action logits,
    masked, as training/export.py exports them) added to its outputs, after the action,
    so ONNX Runtime returns them to check (:func:`check_logits`); None when it has no
    ArgMax."""
    from onnx import TensorProto, helper

    graph = model.graph
    have = {o.name for o in graph.output}
    names = [n.input[0] for n in graph.node if n.op_type == "ArgMax" and n.input[0] not in have]
    if not names:
        return None
    for name in dict.fromkeys(names):
        graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return model.SerializeToString()


def probes(
    size: int, groups: int, features: int, present_at: int, masks: int, n: int, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` (observation, mask) pairs to compare two forward passes on: float32 values spread
    over the features' range and beyond it, a random set of present slots (none, some,
    all), and masks closing random levels (now and then every level of a dimension), the
    first all open."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        # float32, as the encoder writes them: the compiled pass is checked, and compiled,
        # for the observations it will be fed (float64 ones compiled another kernel, whose
        # first decision paid the compilation)
        obs = rng.uniform(-1.5, 1.5, size).astype(np.float32)
        flags = rng.random(groups) < rng.uniform(0.0, 1.0)
        obs[present_at : groups * features : features] = flags
        mask = np.ones(masks, dtype=bool) if i == 0 else rng.random(masks) < 0.7
        out.append((obs, mask))
    return out


def disagreements(
    a: Callable[[np.ndarray, np.ndarray], np.ndarray],
    b: Callable[[np.ndarray, np.ndarray], np.ndarray],
    cases: list[tuple[np.ndarray, np.ndarray]],
) -> int:
    """On how many of ``cases`` the actions of ``a`` and ``b`` differ."""
    return sum(not np.array_equal(a(o, m), b(o, m)) for o, m in cases)


__all__ = [
    "NON_FINITE_LOGITS",
    "CompiledActor",
    "NonFiniteLogits",
    "check_logits",
    "compile_actor",
    "disagreements",
    "non_finite_initializers",
    "probes",
    "read_model",
    "with_logits",
]

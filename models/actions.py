"""The action decoder: a MultiDiscrete policy output -> an allocation plan valid by construction.

Shared by envs/ (training) and the exported policy controller in the tuner, so a trained
policy's action means the same allocation in both places.

Design (docs/RL.md, "Action design": a priority vector decoded into a valid allocation):

- The action is ``MultiDiscrete([share_levels] * max_groups + [mba_levels] * max_groups)``:
  one cache *share level* and one MBA level per group slot (slots as in
  :mod:`models.features`: LC first, then batch, then system, by name).
- Ways: every present group first gets the minimum (``max(1, min_cbm_bits)`` ways); the
  remaining ways are split in proportion to the share levels by largest-remainder
  apportionment (ties to the earlier slot; all levels 0 = an equal split). The counts are
  packed into contiguous, disjoint masks in slot order (as
  :func:`models.allocation.pack_ways` does), so every mask is contiguous, respects
  ``min_cbm_bits`` and the total ways, and never overlaps another planned group.
- More groups than minimum-size slices (e.g. 15 groups on 11 ways, or min_cbm_bits 2):
  no disjoint split exists, so groups share: ranked by share level (ties to the earlier
  slot, so LC groups first), the ``slices - 1`` highest-ranked groups get a minimum-size
  slice alone and the rest share the last slice (which also takes the leftover ways).
  This is the one *repair*, reported in :attr:`DecodedAction.repairs`.
- ``share_all`` (a design option, off by default): the share vector of all zeros means
  the *unpartitioned* cache instead: every present group on every way (the state the safe
  oracle and the unpartitioned baseline hold, which disjoint masks cannot say), while the
  MBA levels apply as usual. The equal split stays reachable (all levels equal and
  non-zero). Behind the SLO shield it is honoured only when no LC floor asks for more than
  the group's share of a shared cache (``ways // groups``, how the shield counts shared
  ways); otherwise all zeros decode to the equal split above the floors, as without it.
- MBA: level ``j`` is the fraction ``(j + 1) / mba_levels`` of full bandwidth, mapped to
  the highest value the kernel accepts at or below it by :func:`models.allocation.mb_level`
  (so granularity and range hold, including AMD and mba_MBps modes). Without MBA the MBA
  part is ignored.
- Absent slots (and the MBA part on a node without MBA) are ignored; :meth:`action_mask`
  masks them to their first choice for MaskablePPO, so a masked policy never wastes
  probability on them. Non-zero values there are not errors (an unmasked PPO may send
  them); they are reported as ignored in ``repairs``.

One definition, on arrays: :func:`decode_arrays` decodes the actions of N nodes at once
(the vector environment), its arithmetic in the compiled loops of models/actions_kernel.py;
:meth:`PreparedDecoder.decode` is its N=1 case, wrapped into a plan for a Node.

Why this design: MaskablePPO's masks are per dimension and cannot express "masks
contiguous and disjoint, total <= ways" (docs/RL.md), whereas a share vector decodes to a valid
split for any value, lets one step move to any allocation (no +1/-1 crawling), and has a
fixed size whatever the mix, so one policy serves any number of groups up to max_groups.
CLOSIDs are not an action concern: the groups exist already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.types import AllocationPlan, GroupAllocation, NodeCapabilities, contiguous_mask
from models import actions_kernel as ak
from models.allocation import mb_level, mb_scale
from models.features import MAX_GROUP_SLOTS

_MB_TABLES: dict[tuple, tuple[int, ...]] = {}


@dataclass(frozen=True)
class DecodedAction:
    """What an action means on a node.

    Attributes:
        plan: the allocation plan for the slotted groups (every domain).
        ways: ways per group (empty without CAT).
        masks: capacity bitmask per group (empty without CAT).
        mb: MB value per group (empty without MBA).
        shared: True when groups had to share slices (more groups than slices).
        repairs: human-readable notes on anything not taken literally.
    """

    plan: AllocationPlan
    ways: dict[str, int] = field(default_factory=dict)
    masks: dict[str, int] = field(default_factory=dict)
    mb: dict[str, int] = field(default_factory=dict)
    shared: bool = False
    repairs: tuple[str, ...] = ()


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder, in
    exact integer arithmetic; ties to the earlier index; all-zero weights split equally)."""
    return _largest_remainder(total, [max(0, int(x)) for x in weights])


def _largest_remainder(total: int, w: list[int]) -> list[int]:
    """:func:`apportion` for weights that are ints >= 0 already (a checked action's levels)."""
    n = len(w)
    if n == 0:
        return []
    s = sum(w)
    if s == 0:
        w, s = [1] * n, n
    base = [total * x // s for x in w]
    left = total - sum(base)
    if left:
        rem = [total * x % s for x in w]
        # The `left` largest remainders, ties to the earlier index (list.index finds the
        # first): the same as taking sorted(key=(-rem[i], i))[:left]; left < n is small.
        for _ in range(left):
            i = rem.index(max(rem))
            base[i] += 1
            rem[i] = -1  # remainders are >= 0: never picked again
    return base


@dataclass(frozen=True)
class ActionDecoder:
    """Decodes MultiDiscrete share/MBA levels into plans (see the module docstring)."""

    max_groups: int = 8
    share_levels: int = 8
    mba_levels: int = 10
    share_all: bool = False  # all-zero share levels: the unpartitioned cache (docstring)

    def __post_init__(self) -> None:
        for name in ("max_groups", "share_levels", "mba_levels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_groups > MAX_GROUP_SLOTS:
            raise ValueError(
                f"max_groups must be an integer in [1, {MAX_GROUP_SLOTS}], got {self.max_groups}"
            )
        if not isinstance(self.share_all, bool):
            raise ValueError(f"share_all must be true or false, got {self.share_all!r}")
        bounds = (self.share_levels,) * self.max_groups + (self.mba_levels,) * self.max_groups
        object.__setattr__(self, "_bounds", bounds)

    @property
    def nvec(self) -> np.ndarray:
        return np.array(self._bounds, dtype=np.int64)

    def layout(self) -> dict:
        return {
            "kind": "multidiscrete-share-levels",
            "max_groups": self.max_groups,
            "share_levels": self.share_levels,
            "mba_levels": self.mba_levels,
            "nvec": self.nvec.tolist(),
            # only when on: a layout without the key (every export before it) means off
            **({"share_all": True} if self.share_all else {}),
        }

    def action_mask(self, n_present: int, caps: NodeCapabilities) -> np.ndarray:
        """Flat boolean mask over ``sum(nvec)`` choices (sb3-contrib's format): absent
        slots, and every choice the node cannot act on, fixed to the first choice."""
        return self.action_masks(self.decode_layout(n_present, caps))[0]

    def decode(
        self, action: Sequence[int] | np.ndarray, slots: Sequence[str], caps: NodeCapabilities
    ) -> DecodedAction:
        """The plan for ``slots`` (group names in slot order) on a node with ``caps``.

        Hot path of every env step: what depends only on ``slots`` and ``caps`` is prepared
        once per node (:class:`PreparedDecoder`); the returned dicts are fresh (callers may keep
        or change them).
        """
        return self._context(slots, caps).decode(action)

    def prepare(self, slots: Sequence[str], caps: NodeCapabilities) -> PreparedDecoder:
        """The decoder for these slots on this node: ``prepare(slots, caps).decode(action)``
        equals ``decode(action, slots, caps)``, without checking on every call that slots
        and capabilities are still those it was prepared for (an env prepares once per
        episode)."""
        return self._context(slots, caps)

    def levels(self, action: Sequence[int] | np.ndarray) -> list[int]:
        """The action as a list of levels, checked against ``nvec`` (ValueError if not)."""
        g_max = self.max_groups
        if isinstance(action, np.ndarray):
            # (a 1-D action, the usual one, needs no reshaped view: one numpy call fewer)
            raw = (action if action.ndim == 1 else action.reshape(-1)).tolist()
            exact = action.dtype.kind in "iu"  # tolist() gave Python ints already
        else:
            raw, exact = list(action), False
        if len(raw) != 2 * g_max:
            raise ValueError(
                f"action has {len(raw)} values; expected {2 * g_max} (share and MBA level per slot)"
            )
        if not exact:
            return self._checked_levels(raw)
        if (
            min(raw) < 0
            or max(raw[:g_max]) >= self.share_levels
            or (max(raw[g_max:]) >= self.mba_levels)
        ):
            raise ValueError(f"action {raw} outside MultiDiscrete{list(self._bounds)}")
        return raw

    def _checked_levels(self, raw: list) -> list[int]:
        bounds = self._bounds
        try:
            levels = [int(x) for x in raw]
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"action {raw} is not a vector of integers") from None
        if levels != raw or any(not 0 <= x < b for x, b in zip(levels, bounds, strict=True)):
            raise ValueError(f"action {raw} outside MultiDiscrete{list(bounds)}")
        return levels

    def _context(self, slots: Sequence[str], caps: NodeCapabilities) -> PreparedDecoder:
        """The per-(slots, capabilities) constants (one cached entry: an env decodes for the
        same groups on the same node step after step)."""
        key = tuple(slots)[: self.max_groups]
        ctx = self.__dict__.get("_ctx")
        if ctx is not None and ctx.slots == key:
            if ctx.caps is caps:
                return ctx
            if ctx.caps == caps:
                # Equal, new object (a SimNode's capabilities are new after every reset):
                # keep it, or every later step would compare the dataclasses field by field.
                ctx.caps = caps
                return ctx
        ctx = PreparedDecoder(
            self, key, caps, self._mb_table(caps) if caps.mba is not None else None
        )
        object.__setattr__(self, "_ctx", ctx)  # a cache, not state: frozen otherwise
        return ctx

    def _mb_table(self, caps: NodeCapabilities) -> tuple[int, ...]:
        """MB value of each MBA level on this node (cached: it only depends on the MBA
        capabilities and the peak bandwidth)."""
        key = (caps.mba, caps.memory_bandwidth_bps, self.mba_levels)
        table = _MB_TABLES.get(key)
        if table is None:
            table = tuple(mb_level(caps, (j + 1) / self.mba_levels) for j in range(self.mba_levels))
            if len(_MB_TABLES) > 64:
                _MB_TABLES.clear()
            _MB_TABLES[key] = table
        return table

    def decode_layout(self, n_present: int, caps: NodeCapabilities) -> DecodeLayout:
        """One node's :class:`DecodeLayout` (N = 1)."""
        l3 = caps.l3
        table = np.full((1, self.mba_levels), np.nan)
        if caps.mba is not None:
            table[0] = self._mb_table(caps)
        return DecodeLayout(
            n_present=np.array([min(n_present, self.max_groups)], dtype=np.int64),
            has_l3=np.array([l3 is not None]),
            least=np.array([max(1, l3.min_cbm_bits) if l3 is not None else 1], dtype=np.int64),
            total=np.array([l3.num_ways if l3 is not None else 0], dtype=np.int64),
            offset=np.array(
                [(l3.cbm_mask & -l3.cbm_mask).bit_length() - 1 if l3 is not None else 0],
                dtype=np.int64,
            ),
            mb_table=table,
            mb_held=np.minimum(table, mb_scale(caps)) if caps.mba is not None else table,
        )

    def _shared_masks_of(
        self, slots: Sequence[str], share: Sequence[int], layout: DecodeLayout, b: int
    ) -> dict[str, int]:
        """Masks when more groups than minimum-size slices: ranked by share level (ties to
        the earlier slot), the first ``slices - 1`` get a slice alone, the rest share the
        last one (which takes the leftover ways too); node ``b`` of ``layout``."""
        least, total, low = int(layout.least[b]), int(layout.total[b]), int(layout.offset[b])
        slices = total // least
        ranked = sorted(range(len(slots)), key=lambda i: (-share[i], i))
        masks = {}
        for k, i in enumerate(ranked):
            s = min(k, slices - 1)
            width = least + (total - slices * least if s == slices - 1 else 0)
            masks[slots[i]] = contiguous_mask(width, low + s * least)
        return masks

    def action_masks(self, layout: DecodeLayout) -> np.ndarray:
        """:meth:`action_mask` of N nodes (N, sum(nvec))."""
        N, S = len(layout.n_present), self.max_groups
        present = np.arange(S) < layout.n_present[:, None]
        share = np.zeros((N, S, self.share_levels), dtype=bool)
        share[..., 0] = True
        share |= (present & layout.has_l3[:, None])[..., None]
        has_mba = ~np.isnan(layout.mb_table[:, 0])
        mba = np.zeros((N, S, self.mba_levels), dtype=bool)
        mba[..., 0] = True
        mba |= (present & has_mba[:, None])[..., None]
        return np.concatenate([share.reshape(N, -1), mba.reshape(N, -1)], axis=1)


@dataclass
class DecodeLayout:
    """What decoding needs from N nodes' slots and capabilities (arrays (N,))."""

    n_present: np.ndarray  # slots holding a group
    has_l3: np.ndarray  # bool
    least: np.ndarray  # smallest slice: max(1, min_cbm_bits)
    total: np.ndarray  # ways
    offset: np.ndarray  # lowest bit of the capacity mask
    mb_table: np.ndarray  # (N, mba_levels) MB value of each level (NaN: no MBA)
    # (N, mba_levels) the levels as held MB values are read back: each value at most the
    # node's full bandwidth (models.allocation.mb_scale). On AMD the top level writes 2048,
    # unlimited, and a value between the peak and it holds the whole of the bandwidth too.
    mb_held: np.ndarray

    @classmethod
    def stack(cls, layouts: Sequence[DecodeLayout]) -> DecodeLayout:
        return cls(*(np.concatenate([getattr(x, f) for x in layouts]) for f in _DL_FIELDS))

    def put(self, rows: np.ndarray, other: DecodeLayout) -> None:
        for f in _DL_FIELDS:
            getattr(self, f)[rows] = getattr(other, f)


_DL_FIELDS = tuple(DecodeLayout.__dataclass_fields__)


@dataclass
class Decoded:
    """The allocation N actions mean, per slot (N, max_groups)."""

    ways: np.ndarray  # int, 0 for absent slots and without CAT
    masks: np.ndarray  # int64 capacity bitmasks (0: none)
    mb: np.ndarray  # MB values (NaN: none)
    shared: np.ndarray  # (N,) groups had to share slices


def check_levels(decoder: ActionDecoder, actions) -> np.ndarray:
    """N actions as an (N, 2 * max_groups) int64 array, checked against ``nvec``."""
    a = np.asarray(actions)
    if a.ndim != 2 or a.shape[1] != 2 * decoder.max_groups:
        raise ValueError(
            f"actions of shape {a.shape}; expected (envs, {2 * decoder.max_groups}) "
            "(a share and an MBA level per slot)"
        )
    if a.dtype.kind not in "iub" and (  # bools are MultiDiscrete's too (its contains)
        a.dtype.kind != "f" or not np.all(np.isfinite(a)) or np.any(a != np.round(a))
    ):
        raise ValueError("actions must be integers")
    # checked in the given dtype: a uint64 beyond int64's range would wrap when cast
    outside = (a < 0) | (a >= decoder.nvec) if a.size else np.zeros(a.shape, dtype=bool)
    if outside.any():
        bad = np.flatnonzero(outside.any(axis=1))[0]
        raise ValueError(f"action {a[bad].tolist()} outside MultiDiscrete{decoder.nvec.tolist()}")
    return a.astype(np.int64)


def decode_arrays(
    decoder: ActionDecoder,
    layout: DecodeLayout,
    levels: np.ndarray,
    floor: np.ndarray | None = None,
    mb_floor: np.ndarray | None = None,
) -> Decoded:
    """What checked ``levels`` (N, 2 * max_groups) mean on N nodes (module docstring):
    ways by largest-remainder apportionment over the present slots, packed into
    contiguous masks in slot order; MB values from each node's level table.

    ``floor`` / ``mb_floor`` (N, max_groups), the SLO shield's (models/shield.py): the
    fewest ways and the lowest MBA level each slot gets whatever its levels say (0: the
    minimum slice, the lowest level); only the ways above the floors are apportioned by
    the share levels. Floors must fit the cache (the shield fits them); they are not used
    where groups have to share slices. With ``decoder.share_all``, all-zero share levels
    give every present slot the whole cache where ``floor`` allows it (module docstring)."""
    N, S = levels.shape[0], decoder.max_groups
    n = layout.n_present
    shared = must_share(layout)
    whole = np.zeros(N, dtype=bool)
    if decoder.share_all:
        present = np.arange(S) < n[:, None]
        whole = _unpartitioned(decoder, layout, np.where(present, levels[:, :S], 0), present, floor)
        shared &= ~whole
    ways = np.empty((N, S), dtype=np.int64)
    masks = np.empty((N, S), dtype=np.int64)
    mb = np.empty((N, S))
    _decode_into(np.asarray(levels, dtype=np.int64), layout, shared, whole, floor, mb_floor,
            (ways, masks, mb))  # fmt: skip
    for b in np.flatnonzero(shared):  # more groups than slices: they share (rare)
        k = int(n[b])
        slots = [str(i) for i in range(k)]
        got = decoder._shared_masks_of(slots, levels[b, :k].tolist(), layout, b)
        masks[b, :k] = [got[g] for g in slots]
        ways[b, :k] = [m.bit_count() for m in masks[b, :k].tolist()]
    return Decoded(ways, masks, mb, shared)


def must_share(layout: DecodeLayout) -> np.ndarray:
    """(N,) nodes with more groups than minimum-size slices: their groups share slices,
    which :func:`decode_arrays` decides in Python (models/actions_kernel.py does not)."""
    return layout.has_l3 & (
        layout.n_present * layout.least > np.where(layout.has_l3, layout.total, 0)
    )


def _decode_into(levels, layout, shared, whole, floor, mb_floor, out) -> None:
    """models/actions_kernel.py's decode of ``levels`` (N, 2S) int64 into ``out`` (ways,
    masks, MB values), ``shared`` and ``whole`` (N,) as :func:`decode_arrays` decides them."""
    ak.decode(
        levels,
        layout.n_present,
        layout.has_l3,
        layout.least,
        layout.total,
        layout.offset,
        layout.mb_table,
        shared,
        whole,
        _NO_FLOOR if floor is None else np.asarray(floor, dtype=np.int64),
        floor is not None,
        _NO_FLOOR if mb_floor is None else np.asarray(mb_floor, dtype=np.int64),
        mb_floor is not None,
        *out,
    )


_NO_FLOOR = np.zeros((1, 1), dtype=np.int64)
_NO_ROW = np.zeros(1, dtype=bool)  # (1,) False: a node's shared or whole flag, not set
_NO_ROW.flags.writeable = False


def _unpartitioned(decoder, layout, share, present, floor) -> np.ndarray:
    """(N,) rows whose all-zero share levels mean the unpartitioned cache: ``share_all``
    on, a cache to share, and no LC floor above the group's share of it."""
    if not decoder.share_all:
        return np.zeros(len(share), dtype=bool)
    whole = layout.has_l3 & (layout.n_present > 0) & ~share.any(axis=1)
    if floor is not None:
        part = np.where(layout.has_l3, layout.total, 0) // np.maximum(layout.n_present, 1)
        whole &= ~(present & (floor > part[:, None])).any(axis=1)
    return whole


def nearest_levels(
    decoder: ActionDecoder,
    layout: DecodeLayout,
    ways: Sequence[int],
    mb: Sequence[float] | None = None,
    floors: tuple[np.ndarray, np.ndarray] | None = None,
    passes: int = 8,
) -> np.ndarray:
    """The decoder's inverse: levels (2 * max_groups,) whose decoding on one node
    (``layout``, one row) under the shield's ``floors`` is closest to ``ways`` and ``mb``
    per present slot (what a teacher's allocation becomes as a label for the policy).
    A target of every way for every slot is the unpartitioned cache: with ``share_all``
    all-zero share levels where the floors allow it, else each slot's share of the cache
    (``ways // slots``, as the shield counts shared ways).

    Ways come first. With few slots every share vector is tried in one array pass
    (:data:`EXHAUSTIVE_LEVELS`); else, from shares proportional to each slot's ways above
    its minimum, the best single-slot change is taken (every slot, every level, one array
    pass), or the best two-slot change when no single one helps, until none lowers the
    total way error. Ties go to the levels tried first. Each MBA level is chosen alone:
    the one whose MB value is nearest the target (NaN or no target: the top level).
    Absent slots stay 0, as the action mask asks."""
    S = decoder.max_groups
    n = int(layout.n_present[0])
    levels = np.zeros(2 * S, dtype=np.int64)
    if n == 0:
        return levels
    if mb is not None and np.isfinite(layout.mb_table[0]).any():
        levels[S : S + n] = _nearest_mb_levels(layout.mb_held[0], np.asarray(mb, float)[:n])
    if not layout.has_l3[0]:
        return levels
    want_ways = _way_target(decoder, layout, np.asarray(ways, dtype=np.int64)[:n], floors)
    if want_ways is None:
        return levels  # share levels all 0: the unpartitioned cache
    least = np.full(n, layout.least[0])
    if floors is not None:
        least = np.maximum(least, floors[0][0, :n])
    extra = np.maximum(want_ways - least, 0)
    top = decoder.share_levels - 1
    if extra.max() > 0:
        levels[:n] = np.round(extra / extra.max() * top).astype(np.int64)
    if (top + 1) ** n <= EXHAUSTIVE_LEVELS:  # few slots: try every share vector at once
        every = np.stack(np.meshgrid(*[np.arange(top + 1)] * n, indexing="ij"), -1)
        moves = np.concatenate([levels[None, :n], every.reshape(-1, n)])
        err = _way_error(decoder, layout, levels, want_ways, floors, moves, whole=True)
        levels[:n] = moves[int(np.argmin(err))]
        return levels
    singles, pairs = _level_moves(n, top + 1)
    for _ in range(passes):
        err = _way_error(decoder, layout, levels, want_ways, floors, singles)
        if err[0] > 0 and err.min() >= err[0]:  # stuck: move two slots' levels at once
            err = _way_error(decoder, layout, levels, want_ways, floors, pairs)
            moves = pairs
        else:
            moves = singles
        best = int(np.argmin(err))  # the first minimum: row 0 (no move) when none is better
        if err[best] >= err[0]:
            break
        levels = _moved(levels, moves[best])
    return levels


def _nearest_mb_levels(table: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per slot, the MBA level whose MB value in ``table`` is nearest ``want`` (NaN: the
    top level)."""
    gap = np.abs(table[None, :] - np.where(np.isfinite(want), want, np.inf)[:, None])
    return np.where(np.isfinite(want), np.nanargmin(gap, axis=1), len(table) - 1)


def _way_target(decoder, layout, want_ways, floors) -> np.ndarray | None:
    """The ways :func:`nearest_levels` aims at: ``want_ways`` itself, unless it is every
    way for every slot (the unpartitioned cache): then None where all-zero share levels
    say that (``share_all``, the floors allowing), else each slot's share of the cache."""
    n, total = len(want_ways), int(layout.total[0])
    if n < 2 or (want_ways < total).any():
        return want_ways
    S = decoder.max_groups
    share = np.zeros((1, S), dtype=np.int64)
    fl = None if floors is None else floors[0]
    if _unpartitioned(decoder, layout, share, np.arange(S) < n, fl)[0]:
        return None
    return np.full(n, total // n)


def _level_moves(n: int, values: int) -> tuple[np.ndarray, np.ndarray]:
    """Moves of :func:`nearest_levels` as (slot a, value a, slot b, value b) rows (b = -1:
    one slot), row 0 no move: every single-slot change, and every change of two slots."""
    v = np.arange(values)
    single = np.array([(i, x, -1, 0) for i in range(n) for x in v], dtype=np.int64)
    pair = np.array(
        [(i, x, j, y) for i in range(n) for j in range(i + 1, n) for x in v for y in v],
        dtype=np.int64,
    ).reshape(-1, 4)
    none = np.array([[-1, 0, -1, 0]], dtype=np.int64)
    return np.concatenate([none, single]), np.concatenate([none, pair])


def _moved(levels: np.ndarray, move: np.ndarray) -> np.ndarray:
    out = levels.copy()
    for slot, value in ((move[0], move[1]), (move[2], move[3])):
        if slot >= 0:
            out[slot] = value
    return out


def _way_error(decoder, layout, levels, want_ways, floors, moves, whole=False) -> np.ndarray:
    """Total |ways - wanted| over the present slots after each move (one array pass);
    ``whole``: each move is the present slots' share levels entire."""
    k, n = len(moves), len(want_ways)
    cand = np.repeat(levels[None, :], k, axis=0)
    if whole:
        cand[:, :n] = moves
    else:
        for a, b in ((0, 1), (2, 3)):
            rows = np.flatnonzero(moves[:, a] >= 0)
            cand[rows, moves[rows, a]] = moves[rows, b]
    fl = None if floors is None else tuple(np.repeat(f, k, axis=0) for f in floors)
    got = decode_arrays(decoder, DecodeLayout.stack([layout] * k), cand, *(fl or ()))
    return np.abs(got.ways[:, :n] - want_ways).sum(axis=1)


# nearest_levels searches every share vector up to this many (5 levels: 5 slots), else
# descends by one- and two-slot moves.
EXHAUSTIVE_LEVELS = 4096

# Memoised per-domain allocations per context (cleared when full). Its keys are the node's
# (contiguous mask, MB value) pairs, not actions: 66 masks x 10 levels on 11 ways, 2,100 on
# 20 ways, so the memo stops growing early in training whatever the policy sends. At 256
# entries random actions on 11 ways (about 500 pairs in 1,200 steps) kept clearing it.
_CACHE_LIMIT = 4096


class PreparedDecoder:
    """What decoding needs from the slots and capabilities alone, plus a small memo of
    immutable per-domain allocations per (mask, MB)."""

    def __init__(
        self, decoder: ActionDecoder, slots: tuple[str, ...], caps: NodeCapabilities, mb_table
    ) -> None:
        self.decoder = decoder
        self.slots, self.caps, self.n = slots, caps, len(slots)
        self.mb_table: tuple[int, ...] | None = mb_table
        self.domains = caps.domains
        l3 = caps.l3
        self.l3 = l3 is not None
        if l3 is not None:
            self.least = max(1, l3.min_cbm_bits)
            self.total = l3.num_ways
            self.min_cbm_bits = l3.min_cbm_bits
        self.layout = layout = decoder.decode_layout(self.n, caps)
        # decode_arrays decides in Python only where groups must share slices or all-zero
        # shares may mean the whole cache; elsewhere a decode is one compiled call into
        # these buffers (levels, ways, masks, MB values), read out at once.
        self._python_rows = decoder.share_all or bool(must_share(layout)[0])
        S = decoder.max_groups
        self._buffers = (
            np.empty((1, 2 * S), dtype=np.int64),
            np.empty((1, S), dtype=np.int64),
            np.empty((1, S), dtype=np.int64),
            np.empty((1, S)),
        )
        self._inner: dict[tuple, Mapping] = {}
        self._wrap = None  # the plans' read-only mapping type; None: not checked yet (plan)
        # (levels, the decoded action) of the last decode, its dicts private: a policy
        # often sends the same action again, and then only fresh copies are needed.
        self._last: tuple[list[int], tuple] | None = None

    def decode(
        self,
        action: Sequence[int] | np.ndarray,
        floors: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> DecodedAction:
        """:meth:`ActionDecoder.decode` for this context's slots and capabilities;
        ``floors``: the SLO shield's (ways, MBA level) floors per slot, (1, max_groups)
        each (:func:`decode_arrays`)."""
        levels = self.decoder.levels(action)
        key = levels if floors is None else (levels, floors[0].tolist(), floors[1].tolist())
        last = self._last
        if last is not None and last[0] == key:
            parts = last[1]
        else:
            parts = self._parts(levels, floors)
            self._last = (key, parts)
        plan, ways, masks, mb, shared, repairs = parts
        # the caller's dicts are copies: callers may keep or change them, not the memo's
        return DecodedAction(plan, dict(ways), dict(masks), dict(mb), shared, repairs)

    def _parts(self, levels: list[int], floors: tuple | None = None) -> tuple:
        """(plan, ways, masks, mb, shared, repairs): the fields of the DecodedAction."""
        g_max, slots, n = self.decoder.max_groups, self.slots, self.n
        share, mba_lv = levels[:n], levels[g_max : g_max + n]
        repairs: list[str] = []
        if any(levels[n:g_max]) or any(levels[g_max + n :]):
            repairs.append(f"ignored levels of {g_max - n} empty slots")
        ways: dict[str, int] = {}
        masks: dict[str, int] = {}
        shared = False
        rows = self._decode_one(levels, floors)
        if self.l3 and n:
            ways, masks, shared, note = self._split(rows[0], rows[1], rows[3])
            if note:
                repairs.append(note)
        elif not self.l3 and n and any(share):
            repairs.append("ignored share levels: the node has no cache allocation")
        mb: dict[str, int] = {}
        if self.mb_table is not None:
            mb = dict(zip(slots, rows[2][:n].astype(np.int64).tolist(), strict=True))
        elif n and any(mba_lv):
            repairs.append("ignored MBA levels: the node has no MBA")
        plan = self.plan(slots if (masks or mb) else (), masks, mb)
        return plan, ways, masks, mb, shared, tuple(repairs)

    def split(self, share: Sequence[int]) -> tuple[dict, dict, bool, str | None]:
        """(ways, masks, shared, repair note) for the share levels of the present slots."""
        levels = [0] * (2 * self.decoder.max_groups)
        levels[: self.n] = share
        ways, masks, _, shared = self._decode_one(levels)
        return self._split(ways, masks, shared)

    def _decode_one(
        self, levels: list[int], floors: tuple | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """:func:`decode_arrays` of this node's ``levels``: its (ways, masks, MB values)
        rows (S,) and whether its groups share slices. The rows may be this decoder's
        buffers: read them before the next decode."""
        if self._python_rows:
            d = decode_arrays(
                self.decoder, self.layout, np.array([levels], dtype=np.int64), *(floors or ())
            )
            return d.ways[0], d.masks[0], d.mb[0], bool(d.shared[0])
        lv, ways, masks, mb = self._buffers
        lv[0] = levels
        floor, mb_floor = floors or (None, None)
        _decode_into(lv, self.layout, _NO_ROW, _NO_ROW, floor, mb_floor, (ways, masks, mb))
        return ways[0], masks[0], mb[0], False

    def _split(
        self, ways_row: np.ndarray, masks_row: np.ndarray, shared: bool
    ) -> tuple[dict, dict, bool, str | None]:
        slots, n = self.slots, self.n
        ways = dict(zip(slots, ways_row[:n].tolist(), strict=True))
        masks = dict(zip(slots, masks_row[:n].tolist(), strict=True))
        if not shared:
            return ways, masks, False, None
        note = (
            f"{n} groups share {self.total // self.least} slices of {self.least} ways "
            f"({self.total} ways, min_cbm_bits {self.min_cbm_bits})"
        )
        return ways, masks, True, note

    def plan(self, groups: Sequence[str], masks: dict, mb: dict) -> AllocationPlan:
        """The plan giving each group its (mask, MB) in every domain.

        AllocationPlan's constructor copies every level into its read-only mapping type on
        every step. Here each (mask, MB) pair's read-only per-domain mapping is built once
        and the plan wraps them directly, in the same type. The first plan of a context
        is built by the constructor and the direct form checked against it (type of every
        level, content, order); if they ever differ, the constructor is used throughout.
        """
        wrap = self._wrap
        if not wrap:
            per_group = {
                g: dict.fromkeys(self.domains, GroupAllocation(l3_mask=masks.get(g), mb=mb.get(g)))
                for g in groups
            }
            plan = AllocationPlan(per_group)
            if wrap is None and per_group:
                self._wrap = _direct_form(plan)
            return plan
        inner = self._inner
        adopt = getattr(wrap, "_adopt", wrap)  # FrozenMap wraps a fresh dict without a copy
        per_group = {}
        get_mask, get_mb = masks.get, mb.get
        for g in groups:
            key = (get_mask(g), get_mb(g))
            got = inner.get(key)
            if got is None:
                if len(inner) >= _CACHE_LIMIT:
                    inner.clear()
                a = GroupAllocation(l3_mask=key[0], mb=key[1])
                got = inner[key] = adopt(dict.fromkeys(self.domains, a))
            per_group[g] = got
        plan = object.__new__(AllocationPlan)
        object.__setattr__(plan, "groups", adopt(per_group))
        return plan


def _direct_form(plan: AllocationPlan):
    """The read-only mapping type the constructor gave ``plan`` at both levels, if
    wrapping the same content in it directly gives an identical plan; else False."""
    wrap = type(plan.groups)
    direct = object.__new__(AllocationPlan)
    object.__setattr__(direct, "groups", wrap({g: wrap(dict(v)) for g, v in plan.groups.items()}))
    return wrap if _same_form(plan, direct) else False


def _same_form(a: AllocationPlan, b: AllocationPlan) -> bool:
    """Equal content, in the same order, in the same types at every level."""
    ga, gb = a.groups, b.groups
    return (
        type(ga) is type(gb)
        and ga == gb
        and list(ga) == list(gb)
        and all(
            type(ga[g]) is type(gb[g]) is type(ga)
            and list(ga[g].items()) == list(gb[g].items())
            and all(type(d) is int and type(x) is GroupAllocation for d, x in ga[g].items())
            for g in ga
        )
    )

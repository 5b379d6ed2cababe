"""The exported per-slot actor's forward pass, compiled: one observation in, the argmax
share and MBA level of every slot out.

models/actor.py owns the weights (read from the policy's ONNX file) and decides when this
path may run; this module owns the arithmetic of the network training/policies.py defines:
the shared per-slot embedding (Deep Sets, Zaheer et al., NeurIPS'17), the masked mean and
max pools, the per-slot context layer, and the shared per-slot action head, then the masked
argmax of each action dimension as training/export.py exports it. As ONNX Runtime runs it,
a decision's forward pass is some fifty graph nodes at a microsecond or more each on a
handful of numbers: the largest part of a decision in the tuner. Compiled with numba where
it is installed (agent/compiled.py); models/actor.py does not use it without numba (as
plain Python it is far slower than ONNX Runtime). Sums run in float32 as ONNX Runtime's
do, in another order, so the two differ only where two logits tie to within rounding;
tests/models/test_actor.py compares them.
"""

from __future__ import annotations

import numpy as np

from agent.compiled import jit

# What a masked-out logit becomes before the argmax (training/export.py's value).
MASKED_LOGIT = -1e8


@jit
def _dense(x, w, b, out):
    """``out = x @ w + b`` for one row: ``w`` (I, O) row-major, so the inner loop runs
    along a row of ``w`` and its sums are independent (vectorisable, no sum reordered)."""
    width = w.shape[1]
    for j in range(width):
        out[j] = 0.0
    for i in range(w.shape[0]):
        xi = x[i]
        if xi != 0.0:
            for j in range(width):
                out[j] += xi * w[i, j]
    for j in range(width):
        out[j] += b[j]


@jit
def _dense_from(x, w, start, out):
    """``out += x @ w[start : start + len(x)]``: a block of a layer's input rows."""
    width = w.shape[1]
    for i in range(x.shape[0]):
        xi = x[i]
        if xi != 0.0:
            for j in range(width):
                out[j] += xi * w[start + i, j]


@jit
def _normalised(obs, mean, std, clip):
    """``obs`` as float32, normalised by ``mean``/``std`` and clipped to ``clip`` where
    the model card has statistics (``mean`` empty: none)."""
    x = np.empty(obs.shape[0], dtype=np.float32)
    for k in range(obs.shape[0]):
        v = obs[k]
        if mean.shape[0]:
            v = min(max((v - mean[k]) / std[k], -clip), clip)
        x[k] = v
    return x


@jit
def _embeddings(x, groups, features, present_at, w1, b1, w2, b2):
    """(embeddings (G, H), present (G,)): the shared two-layer ReLU network on each
    present slot's features; an absent slot's embedding is exactly 0."""
    emb = np.zeros((groups, w2.shape[1]), dtype=np.float32)
    present = np.zeros(groups, dtype=np.bool_)
    hidden = np.empty(w1.shape[1], dtype=np.float32)
    for s in range(groups):
        row = x[s * features : (s + 1) * features]
        if not row[present_at] > 0.5:
            continue
        present[s] = True
        _dense(row, w1, b1, hidden)
        for j in range(hidden.shape[0]):
            hidden[j] = max(hidden[j], 0.0)
        _dense(hidden, w2, b2, emb[s])
        for j in range(emb.shape[1]):
            emb[s, j] = max(emb[s, j], 0.0)
    return emb, present


@jit
def _pools(emb, present, mean_pool, max_pool):
    """The mean over present slots (sum / max(count, 1)) and the max over all slots of
    the embeddings, concatenated in that order (each where the extractor has it)."""
    G, H = emb.shape
    pooled = np.zeros(H * (int(mean_pool) + int(max_pool)), dtype=np.float32)
    at = 0
    if mean_pool:
        count = 0
        for s in range(G):
            count += present[s]
            for j in range(H):
                pooled[j] += emb[s, j]
        for j in range(H):
            pooled[j] /= max(count, 1)
        at = H
    if max_pool:
        for s in range(G):  # embeddings are >= 0 and absent ones 0, as in the extractor
            for j in range(H):
                pooled[at + j] = max(pooled[at + j], emb[s, j])
    return pooled


@jit
def _masked_argmax(logits, start, count, mask, base):
    """The first index of the largest of ``logits[start : start + count]``, a logit
    whose ``mask[base + k]`` is False counting as :data:`MASKED_LOGIT`; -1 when one of
    them (masked or not) is NaN or infinite, as no level is then the policy's."""
    best, arg = -np.inf, 0
    for k in range(count):
        v = logits[start + k]
        if not abs(v) < np.inf:  # NaN compares false
            return -1
        if not mask[base + k]:
            v = MASKED_LOGIT
        if v > best:
            best, arg = v, k
    return arg


@jit
def _tanh(x):
    """tanh as ONNX Runtime's MLAS computes it (and Eigen, whose coefficients these are):
    a 13/6 rational function on [-9, 9], within a few float32 ulps of tanh; vectorisable,
    where libm's tanh is a call per value (a third of the forward pass)."""
    x = min(max(x, -9.0), 9.0)
    x2 = x * x
    p = x2 * -2.76076847742355e-16 + 2.00018790482477e-13
    p = x2 * p + -8.60467152213735e-11
    p = x2 * p + 5.12229709037114e-08
    p = x2 * p + 1.48572235717979e-05
    p = x2 * p + 6.37261928875436e-04
    p = x2 * p + 4.89352455891786e-03
    q = x2 * 1.19825839466702e-06 + 1.18534705686654e-04
    q = x2 * q + 2.26843463243900e-03
    q = x2 * q + 4.89352518554385e-03
    return min(max(x * p / q, -1.0), 1.0)


@jit
def _head(context, shared_body, wb, wo, bo, logits):
    """Into ``logits``: the shared head on one slot's ``context`` block, the pools' and
    the node's part of its body (``shared_body``, the same for every slot) given."""
    body = shared_body.copy()
    _dense_from(context, wb, 0, body)
    for j in range(body.shape[0]):
        body[j] = _tanh(body[j])
    _dense(body, wo, bo, logits)


@jit
def slot_actor(obs, mask, norm_mean, norm_std, clip, dims, w1, b1, w2, b2, w3, b3, wb, bb,
               wo, bo, out):  # fmt: skip
    """Into ``out`` (2 G,): each slot's share level, then each slot's MBA level (-1 where a
    logit is not finite), for one observation ``obs`` under ``mask`` (the share logits' mask by
    slot, then the MBA ones'; all True when the policy has none). ``dims``: (G slots, values per
    slot, the presence flag's index in a slot, share levels, mean pool, max pool); ``obs`` is
    the G slots' values, then the node's. ``norm_mean``/``norm_std`` (empty: none) with ``clip``
    normalise ``obs`` first, as the model card says. Layers: ``w1, b1`` and ``w2, b2`` the
    per-slot embedding (ReLU), ``w3, b3`` the per-slot context layer (ReLU) over [embedding,
    pools], ``wb, bb`` the head's body (tanh) over [context, pools, node], ``wo, bo`` its output
    (share then MBA logits)."""
    G, F, present_at, share = dims[0], dims[1], dims[2], dims[3]
    mba = wo.shape[1] - share
    x = _normalised(obs, norm_mean, norm_std, clip)
    emb, present = _embeddings(x, G, F, present_at, w1, b1, w2, b2)
    pooled = _pools(emb, present, dims[4] != 0, dims[5] != 0)

    # the pools' and the node's part of a layer is the same for every slot: once
    H, C, P = emb.shape[1], w3.shape[1], pooled.shape[0]
    shared_context = np.empty(C, dtype=np.float32)
    _dense(pooled, w3[H:], b3, shared_context)
    shared_body = np.empty(wb.shape[1], dtype=np.float32)
    _dense(pooled, wb[C : C + P], bb, shared_body)
    _dense_from(x[G * F :], wb, C + P, shared_body)

    context = np.zeros(C, dtype=np.float32)
    logits = np.empty(wo.shape[1], dtype=np.float32)
    absent = np.empty(wo.shape[1], dtype=np.float32)  # an absent slot's context block is 0,
    _head(context, shared_body, wb, wo, bo, absent)  # so every absent slot's logits are these
    for s in range(G):
        lg = absent
        if present[s]:
            for j in range(C):
                context[j] = shared_context[j]
            _dense_from(emb[s], w3, 0, context)
            for j in range(C):
                context[j] = max(context[j], 0.0)
            _head(context, shared_body, wb, wo, bo, logits)
            lg = logits
        out[s] = _masked_argmax(lg, 0, share, mask, s * share)
        out[G + s] = _masked_argmax(lg, share, mba, mask, G * share + s * mba)

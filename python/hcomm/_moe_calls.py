"""Mixture-of-experts routing's C calls (include/hcomm/moe.h): the Routing handle of one dispatch,
dispatch and combine and their backward passes, one C call each. hcomm.moe exposes them and
adds all_to_all; hcomm.torch builds its autograd Functions on them."""
import ctypes

import numpy as np

from . import _lib, _tensor, _world
from ._lib import Tensor, call, lib
from .context import default_group

_DROP = {"position": 0, "probs": 1}
_PATH = {"auto": 0, "flat": 1, "hier": 2}


def _ids(ids, n, name):
    """Expert ids as a contiguous int32 numpy array (a small copy when they are not)."""
    a = ids.detach().cpu().numpy() if _tensor.is_torch(ids) else np.asarray(ids)
    if a.dtype.kind not in "iu":
        raise TypeError(f"hcomm.moe: {name} must hold integers, not {a.dtype}")
    if a.shape[:1] != (n,) or a.ndim not in (1, 2):
        raise ValueError(f"hcomm.moe: {name} has shape {a.shape}; expected [{n}] or [{n}, k] "
                         f"for {n} tokens")
    return np.ascontiguousarray(a, dtype=np.int32)


class Routing:
    """Where every token went in one dispatch: owns the C handle (freed by free(), when
    garbage, or before its group goes away). `tokens_per_expert`: rows received per local
    expert (int64 numpy), `expert_offsets` their starts, `k` slots per token."""

    def __init__(self, handle, group, num_experts, k, n, kind):
        self._h, self.group, self.num_experts, self.k, self.n = handle, group, num_experts, k, n
        self.kind = kind
        local = num_experts // group.size
        self.tokens_per_expert = np.zeros(local, dtype=np.int64)
        d = Tensor()
        call(lib.hcomm_moe_received, handle, ctypes.byref(d),
             self.tokens_per_expert.ctypes.data)
        self.received_desc = d
        self.expert_offsets = np.zeros(local + 1, dtype=np.int64)
        call(lib.hcomm_moe_expert_offsets, handle, self.expert_offsets.ctypes.data)
        routings = getattr(_world._state, "routings", None)
        if routings is not None:
            routings.add(self)

    @property
    def handle(self):
        if self._h is None:
            raise _world.dead("hcomm.moe", "this MoE routing", "routing.free(), or its "
                              "group's context was destroyed")
        return self._h

    def received(self):
        """The received rows [R, H] (a copy, of the dispatched tokens' kind)."""
        return _tensor.from_c(self.received_desc, self.kind)

    def free(self):
        if self._h is not None:
            lib.hcomm_moe_handle_free(self._h)
            self._h = None

    def __del__(self):
        self.free()


def dispatch(tokens, expert_ids, num_experts, weights=None, capacity_factor=0.0,
             drop_policy="position", group=None, etp_group=None, path="auto"):
    """Sends each token [N, H] to the ranks of its experts. expert_ids [N] is top-1
    (hcomm_moe_dispatch); [N, k] is top-k (hcomm_moe_dispatch_topk; -1 = empty slot) with
    optional f32 weights [N, k] and capacity. etp_group: the expert-TP group across which the
    tokens are sequence-parallel shards (rows gathered after the EP exchange, outputs
    reduce-scattered before the reverse one); path: "auto", "flat" or "hier" (per-node
    dispatch on several nodes). Returns (rows received [R, H] expert-major, Routing).
    Collective over the EP group (and etp_group)."""
    g = default_group("ep", group)
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"hcomm.moe: num_experts must be a positive int, not {num_experts!r}")
    n = tokens.shape[0] if tokens.ndim else -1
    ids = _ids(expert_ids, n, "expert_ids")
    dt, h = _tensor.desc(tokens, "tokens"), ctypes.c_void_p()
    kind = "torch" if _tensor.is_torch(tokens) else "numpy"
    if path not in _PATH:
        raise ValueError(f"hcomm.moe: path must be 'auto', 'flat' or 'hier', not {path!r}")
    top1 = (ids.ndim == 1 and weights is None and not capacity_factor and etp_group is None
            and path == "auto")
    if top1:
        call(lib.hcomm_moe_dispatch, g._ptr, ctypes.byref(dt), ids.ctypes.data, num_experts,
             ctypes.byref(h))
        k = 1
    else:
        k = ids.shape[1] if ids.ndim == 2 else 1
        w = None
        if weights is not None:
            w = weights.detach().numpy() if _tensor.is_torch(weights) else np.asarray(weights)
            w = np.ascontiguousarray(w, dtype=np.float32)
            if w.shape != (n, k):
                raise ValueError(f"hcomm.moe: weights has shape {w.shape}; expected {(n, k)}")
        if drop_policy not in _DROP:
            raise ValueError(f"hcomm.moe: drop_policy must be 'position' or 'probs', not "
                             f"{drop_policy!r}")
        opts = _lib.MoeOptions(float(capacity_factor), _DROP[drop_policy],
                               None if etp_group is None else etp_group._ptr, _PATH[path])
        call(lib.hcomm_moe_dispatch_topk, g._ptr, ctypes.byref(dt), ids.ctypes.data,
             None if w is None else w.ctypes.data, k, num_experts, ctypes.byref(opts),
             ctypes.byref(h))
    r = Routing(h, g, num_experts, k, n, kind)
    r.topk = not top1
    return r.received(), r


def _pass(fn, x, routing, rows, name):
    """out [rows, x.shape[1]] = fn(handle, x) for one of the routing's C passes."""
    if x.ndim != 2:
        raise ValueError(f"hcomm.moe: {name} must be 2-D [rows, H], not {tuple(x.shape)}")
    out = _tensor.empty(x, (rows, x.shape[1]))
    call(fn, routing.handle, ctypes.byref(_tensor.desc(x, name)),
         ctypes.byref(_tensor.desc(out, "out")))
    return out


def _rows(routing):
    return routing.received_desc.shape[0]


def combine(expert_out, routing):
    """Sends expert outputs [R, H'] back; returns [N, H'] in the original token order (top-k:
    the weighted sum over a token's slots, in slot order). Collective."""
    fn = lib.hcomm_moe_combine_topk if routing.topk else lib.hcomm_moe_combine
    return _pass(fn, expert_out, routing, routing.n, "expert_out")


def combine_bwd(grad_out, routing):
    """Backward of combine: [N, H'] routed like the dispatch -> [R, H']. Collective."""
    if routing.topk:
        out = _tensor.empty(grad_out, (_rows(routing), grad_out.shape[1]))
        call(lib.hcomm_moe_combine_topk_bwd, routing.handle,
             ctypes.byref(_tensor.desc(grad_out, "grad_out")),
             ctypes.byref(_tensor.desc(out, "out")), None)
        return out
    return _pass(lib.hcomm_moe_combine_bwd, grad_out, routing, _rows(routing), "grad_out")


def dispatch_bwd(grad_recv, routing):
    """Backward of dispatch: [R, H] -> [N, H] (top-k: summed over a token's slots)."""
    fn = lib.hcomm_moe_dispatch_topk_bwd if routing.topk else lib.hcomm_moe_dispatch_bwd
    return _pass(fn, grad_recv, routing, routing.n, "grad_recv")

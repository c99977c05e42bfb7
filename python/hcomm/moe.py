"""Mixture-of-experts token routing over the expert-parallel group (include/hcomm/moe.h).
Experts are contiguous: with E experts on P ranks, rank p owns experts [p*E/P, (p+1)*E/P).
`group` defaults to the current context's EP group, else the world."""
import weakref

import numpy as np

from . import _tensor
from ._lib import Tensor, call, lib  # noqa: F401  (hcomm.moe's names before the calls moved)
from .context import default_group  # noqa: F401  (likewise)
from ._moe_calls import Routing, combine, combine_bwd, dispatch, dispatch_bwd  # noqa: F401


_REVERSE = {}  # id(reverse ids) -> (weak reference to them, their Routing)


def reverse_ids(routing):
    """The ids a forward all_to_all hands back for the reverse call (its second result, the
    Routing itself, works the same): int64 [R], the local expert of each received row, of the
    tokens' kind. Passing them (the same object) as the reverse call's ids selects this
    routing; other ids start a new dispatch."""
    ids = np.repeat(np.arange(len(routing.tokens_per_expert), dtype=np.int64),
                    routing.tokens_per_expert)
    if routing.kind == "torch":
        import torch
        ids = torch.from_numpy(ids)
    key = id(ids)
    _REVERSE[key] = (weakref.ref(ids, lambda _, k=key: _REVERSE.pop(k, None)), routing)
    return ids


def _routing_of(ids):
    if isinstance(ids, Routing):
        return ids
    hit = _REVERSE.get(id(ids))
    return hit[1] if hit is not None and hit[0]() is ids else None


def _counts(tokens_per_expert, local, what):
    """tokens_per_expert as a list of `local` ints (an int: the same for every local expert),
    or None for a writable tensor/array (an output) or None."""
    t = tokens_per_expert
    if t is None or ((_tensor.is_torch(t) or isinstance(t, np.ndarray)) and
                     getattr(t, "ndim", 0) == 1 and t.shape[0] == local):
        return None
    if getattr(t, "ndim", None) == 0:  # a 0-d tensor: an int
        t = int(t)
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        return [int(t)] * local
    if isinstance(t, (list, tuple)) and len(t) == local and \
            all(isinstance(v, (int, np.integer)) for v in t):
        return [int(v) for v in t]
    shape = tuple(t.shape) if hasattr(t, "shape") else ((len(t),) if isinstance(t, (list, tuple))
                                                        else type(t).__name__)
    raise ValueError(f"{what}: tokens_per_expert has shape {shape}; expected ({local},) (one "
                     f"count per local expert), an int, or a list of {local} ints")


def _reverse(x, routing, num_experts, tokens_per_expert):
    """The reverse call: checks before any communication, then combine."""
    what = "hcomm.moe.all_to_all (reverse)"
    routing.handle  # noqa: B018 -- StateError first when the routing was freed
    if num_experts is not None and num_experts != routing.num_experts:
        raise ValueError(f"{what}: num_experts={num_experts} but the forward call routed to "
                         f"{routing.num_experts} experts")
    rows = int(routing.tokens_per_expert.sum())
    if getattr(x, "ndim", 0) != 2 or x.shape[0] != rows:
        raise ValueError(f"{what}: expert_output has shape {tuple(getattr(x, 'shape', ()))}; "
                         f"expected ({rows}, H): the {rows} rows the forward call delivered")
    local = len(routing.tokens_per_expert)
    want = [int(v) for v in routing.tokens_per_expert]
    given = _counts(tokens_per_expert, local, what)
    if given is None and tokens_per_expert is not None:
        given = [int(v) for v in np.asarray(tokens_per_expert.tolist()).reshape(-1)]
    if given is not None and given != want:
        raise ValueError(f"{what}: tokens_per_expert={given} but the forward call delivered "
                         f"{want} rows to the local experts")
    if _tensor.is_torch(x) and x.requires_grad:
        from . import torch as ht
        return ht.moe_combine(x, routing)
    return combine(x, routing)


def _check_forward(x, ids, num_experts, tokens_per_expert, group, kw):
    """Shape checks of the forward call, before any communication; returns the group and
    the expected counts (None: none given)."""
    what = "hcomm.moe.all_to_all"
    g = default_group("ep", group)
    if not isinstance(num_experts, int) or num_experts < 1 or num_experts % g.size:
        raise ValueError(f"{what}: num_experts={num_experts!r} must be a positive multiple of "
                         f"the EP group's size {g.size}")
    xs = tuple(getattr(x, "shape", ()))
    if len(xs) != 2:
        raise ValueError(f"{what}: tokens has shape {xs}; expected (N, H)")
    ids_shape = tuple(ids.shape) if hasattr(ids, "shape") else np.shape(ids)
    if ids_shape[:1] != xs[:1] or len(ids_shape) not in (1, 2):
        raise ValueError(f"{what}: expert_ids has shape {ids_shape}; expected ({xs[0]},) or "
                         f"({xs[0]}, k) for tokens of shape {xs}")
    w = kw.get("weights")
    if w is not None and tuple(np.shape(w)) != (xs[0], ids_shape[-1] if len(ids_shape) == 2
                                                 else 1):
        raise ValueError(f"{what}: weights has shape {tuple(np.shape(w))}; expected the shape "
                         f"of expert_ids {ids_shape}")
    return g, _counts(tokens_per_expert, num_experts // g.size, what)


def all_to_all(x, expert_ids_or_routing, num_experts=None, tokens_per_expert=None,
               group=None, **kw):
    """The brief's call in both directions.

    Forward: all_to_all(tokens [N, H], expert_ids [N] (or [N, k]), num_experts,
    tokens_per_expert=None) -> (routed rows [R, H] expert-major, routing). tokens_per_expert:
    a 1-D tensor/array of one entry per local expert receives the rows each got (as today);
    an int (the same for every local expert) or a list states the counts expected, checked
    once the counts are known (ValueError naming both). The second result is the routing:
    pass it, or reverse_ids(routing), as the reverse call's ids.

    Reverse: all_to_all(expert_output [R, H'], routing or the forward's reverse ids,
    num_experts=..., tokens_per_expert=...) -> [N, H'] in the original token order (top-k:
    the weighted sum over a token's slots). num_experts and tokens_per_expert, when given,
    must match the forward call's. Ids that did not come from a forward call start a new
    dispatch (forward), never a silent reverse.

    Every shape error names the argument and both shapes, before any communication. With
    torch tensors that require grad both directions are autograd Functions (hcomm.torch:
    dispatch's backward is a combine, combine's a dispatch)."""
    routing = _routing_of(expert_ids_or_routing)
    if routing is not None:
        return _reverse(x, routing, num_experts, tokens_per_expert)
    if num_experts is None:
        raise TypeError("hcomm.moe.all_to_all: num_experts is required with expert ids")
    g, expect = _check_forward(x, expert_ids_or_routing, num_experts, tokens_per_expert, group,
                               kw)
    if _tensor.is_torch(x) and x.requires_grad:
        from . import torch as ht
        routed, routing = ht.moe_dispatch(x, expert_ids_or_routing, num_experts, group=g, **kw)
    else:
        routed, routing = dispatch(x, expert_ids_or_routing, num_experts, group=g, **kw)
    got = [int(v) for v in routing.tokens_per_expert]
    if expect is not None and expect != got:
        raise ValueError(f"hcomm.moe.all_to_all: tokens_per_expert={expect} but the local "
                         f"experts received {got} rows")
    if expect is None and tokens_per_expert is not None:
        if _tensor.is_torch(tokens_per_expert):
            import torch
            tokens_per_expert.copy_(torch.from_numpy(routing.tokens_per_expert))
        else:
            tokens_per_expert[...] = routing.tokens_per_expert
    return routed, routing

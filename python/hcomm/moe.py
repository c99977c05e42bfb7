"""Mixture-of-experts token routing over the expert-parallel group (include/hcomm/moe.h).
Experts are contiguous: with E experts on P ranks, rank p owns experts [p*E/P, (p+1)*E/P).
`group` defaults to the current context's EP group, else the world."""
from . import _tensor
from ._lib import Tensor, call, lib  # noqa: F401  (hcomm.moe's names before the calls moved)
from .context import default_group  # noqa: F401  (likewise)
from ._moe_calls import Routing, combine, combine_bwd, dispatch, dispatch_bwd  # noqa: F401


def all_to_all(x, expert_ids_or_routing, num_experts=None, tokens_per_expert=None, **kw):
    """The brief's call in both directions. Forward: all_to_all(tokens, expert_ids,
    num_experts, tokens_per_expert=None) -> (routed tokens, routing); tokens_per_expert, when
    given, is an int64 array that receives the rows per local expert. Reverse:
    all_to_all(expert_output, routing) -> outputs in the original token order. With torch
    tensors that require grad both directions are autograd Functions (hcomm.torch)."""
    if isinstance(expert_ids_or_routing, Routing):
        if _tensor.is_torch(x) and x.requires_grad:
            from . import torch as ht
            return ht.moe_combine(x, expert_ids_or_routing)
        return combine(x, expert_ids_or_routing)
    if num_experts is None:
        raise TypeError("hcomm.moe.all_to_all: num_experts is required with expert ids")
    if _tensor.is_torch(x) and x.requires_grad:
        from . import torch as ht
        routed, routing = ht.moe_dispatch(x, expert_ids_or_routing, num_experts, **kw)
    else:
        routed, routing = dispatch(x, expert_ids_or_routing, num_experts, **kw)
    if tokens_per_expert is not None:
        tpe = routing.tokens_per_expert
        if _tensor.is_torch(tokens_per_expert):
            import torch
            tpe = torch.from_numpy(tpe)
        tokens_per_expert[...] = tpe
    return routed, routing

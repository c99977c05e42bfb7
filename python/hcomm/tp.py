"""Tensor parallelism (Megatron-LM): each call fills hcomm_tensor_t descriptors over the
caller's arrays and makes one C call from include/hcomm/tp.h. Results are new arrays of the
input's kind (numpy or torch) and dtype. `group` defaults to the current context's TP group
(the world without a context).

Autograd: every call on a torch tensor that requires grad records its backward, with the
semantics of the role it plays in Megatron-LM: all_reduce is the reduce-from region (backward
identity), all_gather(dim) gather-from (backward: this rank's slice), reduce_scatter(dim) its
transpose (backward all_gather), split scatter-to (backward all_gather); copy_to, reduce_from,
scatter_to and gather_from are the four regions by name. async_op=True (all_reduce,
all_gather, reduce_scatter) returns an hcomm.Work whose wait() gives the result.
Contiguity: a strided input is copied first; an out= tensor must be contiguous and must not
require grad (hcomm._tensor)."""
from . import _tensor
from ._world import Group  # noqa: F401  (hcomm.tp.Group, as before the calls moved)
from .context import default_group  # noqa: F401  (likewise)
from ._tp_calls import (all_gather, all_reduce, copy_to_bwd, copy_to_fwd,  # noqa: F401
                        gather_from_bwd, gather_from_fwd, reduce_from_bwd, reduce_from_fwd,
                        reduce_scatter, scatter_to_bwd, scatter_to_fwd, split)


def _autograd(name, x, *args):
    """torch tensors go through the autograd Function (hcomm.torch), which calls the C
    forward and, in backward, the C backward; numpy arrays take the forward only."""
    if _tensor.is_torch(x):
        from . import torch as ht
        return getattr(ht, name)(x, *args)
    return globals()[name + "_fwd"](x, *args)


def copy_to(x, group=None):
    """Megatron's copy_to_tensor_model_parallel_region: identity; backward all_reduce."""
    return _autograd("copy_to", x, group)


def reduce_from(x, group=None):
    """reduce_from_tensor_model_parallel_region: all_reduce(sum); backward identity."""
    return _autograd("reduce_from", x, group)


def scatter_to(x, dim=-1, group=None):
    """scatter_to_tensor_model_parallel_region: split along dim; backward all_gather."""
    return _autograd("scatter_to", x, dim, group)


def gather_from(x, dim=-1, group=None):
    """gather_from_tensor_model_parallel_region: all_gather along dim; backward split."""
    return _autograd("gather_from", x, dim, group)

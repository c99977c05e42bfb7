"""Tensor parallelism (Megatron-LM): each call fills hcomm_tensor_t descriptors over the
caller's arrays and makes one C call from include/hcomm/tp.h. Results are new arrays of the
input's kind (numpy or torch) and dtype. `group` defaults to the current context's TP group
(the world without a context)."""
import ctypes

from . import _lib, _tensor
from ._lib import call, lib
from .context import default_group


def _op(op):
    try:
        return _lib.OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"hcomm: op must be one of {', '.join(_lib.OPS)}, not {op!r}") from None


def _dim(x, dim):
    _tensor.check(x)
    if x.ndim == 0 or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"hcomm: dim={dim!r} out of range for a tensor of {x.ndim} dims")
    return dim % x.ndim


def _run(fn, g, x, shape, *extra, out=None):
    """fn(group, &in, &out, *extra); out: a new array of `shape` unless the caller gave one
    (reusing it avoids a fresh allocation, and its page faults, per call for large tensors)."""
    if out is None:
        out = _tensor.empty(x, shape)
    din, dout = _tensor.desc(x, "x"), _tensor.desc(out, "out")
    call(fn, g._ptr, ctypes.byref(din), ctypes.byref(dout), *extra)
    return out


def _scaled(x, dim, factor):
    shape = list(x.shape)
    shape[dim] = shape[dim] * factor if factor > 0 else shape[dim] // -factor
    return shape


def all_reduce(x, op="sum", group=None, out=None):
    """op ('sum', 'prod', 'max', 'min', 'avg') over the group's ranks of x. Collective.
    out: where to write (x itself for in place), else a new array."""
    g = default_group("tp", group)
    return _run(lib.hcomm_tp_all_reduce, g, _tensor.check(x), x.shape, _op(op), out=out)


def all_gather(x, dim=-1, group=None, out=None):
    """Every rank's x concatenated along dim in rank order. Collective."""
    g = default_group("tp", group)
    d = _dim(x, dim)
    return _run(lib.hcomm_tp_all_gather, g, x, _scaled(x, d, g.size), d, out=out)


def reduce_scatter(x, dim=-1, op="sum", group=None, out=None):
    """x reduced over ranks, and this rank's 1/size slice along dim kept. Collective."""
    g = default_group("tp", group)
    d = _dim(x, dim)
    return _run(lib.hcomm_tp_reduce_scatter, g, x, _scaled(x, d, -g.size), d, _op(op),
                out=out)


def split(x, dim=-1, group=None):
    """This rank's 1/size slice of x along dim (a copy). Local."""
    g = default_group("tp", group)
    d = _dim(x, dim)
    return _run(lib.hcomm_tp_split, g, x, _scaled(x, d, -g.size), d)


# --- the four Megatron regions: forward and backward, each one C call -------------------
def copy_to_fwd(x, group=None):
    return _run(lib.hcomm_tp_copy_to_fwd, default_group("tp", group), _tensor.check(x), x.shape)


def copy_to_bwd(grad, group=None):
    return _run(lib.hcomm_tp_copy_to_bwd, default_group("tp", group), _tensor.check(grad), grad.shape)


def reduce_from_fwd(x, group=None):
    return _run(lib.hcomm_tp_reduce_from_fwd, default_group("tp", group), _tensor.check(x), x.shape)


def reduce_from_bwd(grad, group=None):
    return _run(lib.hcomm_tp_reduce_from_bwd, default_group("tp", group), _tensor.check(grad), grad.shape)


def scatter_to_fwd(x, dim=-1, group=None):
    g = default_group("tp", group)
    d = _dim(x, dim)
    return _run(lib.hcomm_tp_scatter_to_fwd, g, x, _scaled(x, d, -g.size), d)


def scatter_to_bwd(grad, dim=-1, group=None):
    g = default_group("tp", group)
    d = _dim(grad, dim)
    return _run(lib.hcomm_tp_scatter_to_bwd, g, grad, _scaled(grad, d, g.size), d)


def gather_from_fwd(x, dim=-1, group=None):
    g = default_group("tp", group)
    d = _dim(x, dim)
    return _run(lib.hcomm_tp_gather_from_fwd, g, x, _scaled(x, d, g.size), d)


def gather_from_bwd(grad, dim=-1, group=None):
    g = default_group("tp", group)
    d = _dim(grad, dim)
    return _run(lib.hcomm_tp_gather_from_bwd, g, grad, _scaled(grad, d, -g.size), d)


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

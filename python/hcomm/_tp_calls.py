"""Tensor parallelism's C calls (include/hcomm/tp.h), one each, on numpy arrays and torch
tensors alike: the collectives and the four Megatron regions' forward and backward. hcomm.tp
exposes them and adds the autograd-aware regions; hcomm.torch builds its Functions on them."""
import types

from . import _lib, _tensor
from ._world import Group
from .context import default_group

_OPS = _lib.OPS
# The tp.h calls without ctypes' argument conversion (see _lib.raw); their extra arguments
# (dim, op) are C ints.
_C = types.SimpleNamespace(**{n: _lib.raw(n) for n in _lib.PROTOS if n.startswith("hcomm_tp_")})
_ALL_REDUCE = _C.hcomm_tp_all_reduce
_pack, _pack_like, _empty_like = _tensor.pack, _tensor.pack_like, _tensor.empty_like


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


def _group(group):
    return group if type(group) is Group else default_group("tp", group)


def _run(fn, g, x, shape, *extra, out=None):
    """fn(group, &in, &out, *extra) with the descriptors in this thread's slots (fn from
    _lib.raw: extra must be ints that are C ints); shape None is
    x's. out: a new array of `shape` unless the caller gave one (reusing it avoids a fresh
    allocation, and its page faults, per call for large tensors). This is the whole Python
    cost of a TP call, so it stays lean: see examples/python/overhead.py."""
    d_in, d_out, p_in, p_out = _tensor.slots()
    _pack(x, d_in, "x")
    if out is not None:
        _pack(out, d_out, "out", True)
    elif shape is None:  # x's shape and dtype
        out = _empty_like(x)
        _pack_like(out)
    else:
        out = _tensor.empty(x, shape)
        _pack(out, d_out, "out", True)
    r = fn(g._vp, p_in, p_out, *extra)
    if r:
        raise _lib.error(r)
    return out


def _scaled(x, dim, factor):
    shape = list(x.shape)
    shape[dim] = shape[dim] * factor if factor > 0 else shape[dim] // -factor
    return shape


def all_reduce(x, op="sum", group=None, out=None):
    """op ('sum', 'prod', 'max', 'min', 'avg') over the group's ranks of x. Collective.
    out: where to write (x itself for in place), else a new array."""
    # _run inlined: this is the call whose overhead examples/python/overhead.py measures.
    g = group if type(group) is Group else default_group("tp", group)
    code = _OPS.get(op) if type(op) is str else None
    if code is None:
        code = _op(op)
    d_in, d_out, p_in, p_out = _tensor.slots()
    _pack(x, d_in, "x")
    if out is None:
        out = _empty_like(x)
        _pack_like(out)
    else:
        _pack(out, d_out, "out", True)
    r = _ALL_REDUCE(g._vp, p_in, p_out, code)
    if r:
        raise _lib.error(r)
    return out


def all_gather(x, dim=-1, group=None, out=None):
    """Every rank's x concatenated along dim in rank order. Collective."""
    g = _group(group)
    d = _dim(x, dim)
    return _run(_C.hcomm_tp_all_gather, g, x, _scaled(x, d, g.size), d, out=out)


def reduce_scatter(x, dim=-1, op="sum", group=None, out=None):
    """x reduced over ranks, and this rank's 1/size slice along dim kept. Collective."""
    g = _group(group)
    d = _dim(x, dim)
    return _run(_C.hcomm_tp_reduce_scatter, g, x, _scaled(x, d, -g.size), d, _op(op),
                out=out)


def split(x, dim=-1, group=None):
    """This rank's 1/size slice of x along dim (a copy). Local."""
    g = _group(group)
    d = _dim(x, dim)
    return _run(_C.hcomm_tp_split, g, x, _scaled(x, d, -g.size), d)


# --- the four Megatron regions: forward and backward, each one C call -------------------
def copy_to_fwd(x, group=None):
    return _run(_C.hcomm_tp_copy_to_fwd, _group(group), x, None)


def copy_to_bwd(grad, group=None):
    return _run(_C.hcomm_tp_copy_to_bwd, _group(group), grad, None)


def reduce_from_fwd(x, group=None):
    return _run(_C.hcomm_tp_reduce_from_fwd, _group(group), x, None)


def reduce_from_bwd(grad, group=None):
    return _run(_C.hcomm_tp_reduce_from_bwd, _group(group), grad, None)


def scatter_to_fwd(x, dim=-1, group=None):
    g = _group(group)
    d = _dim(x, dim)
    return _run(_C.hcomm_tp_scatter_to_fwd, g, x, _scaled(x, d, -g.size), d)


def scatter_to_bwd(grad, dim=-1, group=None):
    g = _group(group)
    d = _dim(grad, dim)
    return _run(_C.hcomm_tp_scatter_to_bwd, g, grad, _scaled(grad, d, g.size), d)


def gather_from_fwd(x, dim=-1, group=None):
    g = _group(group)
    d = _dim(x, dim)
    return _run(_C.hcomm_tp_gather_from_fwd, g, x, _scaled(x, d, g.size), d)


def gather_from_bwd(grad, dim=-1, group=None):
    g = _group(group)
    d = _dim(grad, dim)
    return _run(_C.hcomm_tp_gather_from_bwd, g, grad, _scaled(grad, d, -g.size), d)

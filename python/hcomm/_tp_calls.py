"""Tensor parallelism's C calls (include/hcomm/tp.h), one each, on numpy arrays and torch
tensors alike: the collectives and the four Megatron regions' forward and backward. hcomm.tp
exposes them and adds the autograd-aware regions; hcomm.torch builds its Functions on them."""
import ctypes
import types

import numpy as np

from . import _grad, _lib, _tensor, _work
from ._world import Group
from .context import default_group

_OPS = _lib.OPS
# The tp.h calls without ctypes' argument conversion (see _lib.raw); their extra arguments
# (dim, op) are C ints.
_C = types.SimpleNamespace(**{n: _lib.raw(n) for n in _lib.PROTOS if n.startswith("hcomm_tp_")})
_ALL_REDUCE = _C.hcomm_tp_all_reduce
_pack, _pack_like, _empty_like = _tensor.pack, _tensor.pack_like, _tensor.empty_like
_np = np.ndarray


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
    c = _pack(x, d_in, "x")
    if c is not None:  # a strided x, copied: outputs shaped like the copy
        x = c
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
        raise g.fail("hcomm.tp." + fn.__name__[len("hcomm_tp_"):], r)
    return out


def _scaled(x, dim, factor):
    shape = list(x.shape)
    shape[dim] = shape[dim] * factor if factor > 0 else shape[dim] // -factor
    return shape


def _async(fn, what, g, x, out, *extra):
    """Issues tp.h's nonblocking form of a call: a Work whose result is `out`."""
    d_in, d_out = _tensor.desc(x, "x"), _tensor.desc(out, "out", True)
    g.ptr(what)
    req = _work.issue(fn, (g._vp, ctypes.byref(d_in), ctypes.byref(d_out)) + extra, g, what)
    return _work.Work(g, what, [req], (x, out, d_in, d_out), result=out)


def _reduce_bwd(op, g):
    if op == "sum":
        return lambda grad: grad
    return lambda grad: grad / g.size


def _grad_op(what, op):
    if op not in ("sum", "avg"):
        raise ValueError(f"{what}: op={op!r} has no gradient here; autograd is defined for "
                         f"'sum' and 'avg' (detach the input for other ops)")
    return op


def _all_reduce_special(x, op, code, g, out, async_op):
    """all_reduce off its hot path: autograd, a torch out=, or async_op."""
    what = "hcomm.tp.all_reduce"
    if _grad.needed(x):
        _grad_op(what, op)
        return _grad.attach(what, x, out, lambda v: all_reduce(v, op, g, None, async_op),
                            _reduce_bwd(op, g))
    if out is not None:
        _tensor.check_out(out)
    x = _tensor.contiguous(_tensor.check(x))
    out = _tensor.empty_like(x) if out is None else out
    if not async_op:
        return _blocking_all_reduce(x, code, g, out)
    return _async(_C.hcomm_tp_iall_reduce, what, g, x, out, ctypes.c_int(code))


def _blocking_all_reduce(x, code, g, out):
    d_in, d_out, p_in, p_out = _tensor.slots()
    _pack(x, d_in, "x")
    _pack(out, d_out, "out", True)
    r = _ALL_REDUCE(g._vp, p_in, p_out, code)
    if r:
        raise g.fail("hcomm.tp.all_reduce", r)
    return out


def all_reduce(x, op="sum", group=None, out=None, async_op=False):
    """op ('sum', 'prod', 'max', 'min', 'avg') over the group's ranks of x. Collective.
    out: where to write (x itself for in place), else a new array. async_op=True returns an
    hcomm.Work whose wait() returns that result (hcomm_tp_iall_reduce).

    Autograd (a torch x that requires grad): Megatron's reduce-from region, the forward an
    all_reduce and the backward the identity ('avg': grad / size); out= is then refused, and
    ops other than sum and avg are refused. An out= tensor that requires grad is refused as
    torch refuses in-place writes into it. bool and int16 are refused (DtypeError): they cannot
    be reduced. A non-contiguous x is copied first (hcomm._tensor's contiguity rule)."""
    # _run inlined: this is the call whose overhead examples/python/overhead.py measures.
    g = group if type(group) is Group else default_group("tp", group)
    code = _OPS.get(op) if type(op) is str else None
    if code is None:
        code = _op(op)
    if async_op or (type(x) is not _np and (out is not None or
                                            getattr(x, "requires_grad", False))):
        return _all_reduce_special(x, op, code, g, out, async_op)
    d_in, d_out, p_in, p_out = _tensor.slots()
    c = _pack(x, d_in, "x")
    if c is not None:  # a strided x, copied: outputs shaped like the copy
        x = c
    if out is None:
        out = _empty_like(x)
        _pack_like(out)
    else:
        _pack(out, d_out, "out", True)
    r = _ALL_REDUCE(g._vp, p_in, p_out, code)
    if r:
        raise g.fail("hcomm.tp.all_reduce", r)
    return out


def _moved(what, fn, g, x, shape, d, out, async_op, *extra):
    """A call that moves bytes (all_gather): bool/int16 as uint8 views, blocking or async."""
    x8, back = _tensor.as_bytes(x)
    if back is not None:
        if x8.ndim != x.ndim:  # a 0-d tensor became [bytes]
            raise ValueError(f"{what}: a 0-d tensor has no dim to gather along")
        shape = list(shape)  # in elements of x: the last dim in bytes
        shape[-1] *= x.itemsize if isinstance(x, np.ndarray) else x.element_size()
        o8 = None if out is None else _tensor.as_bytes(out)[0]
        res = _moved(what, fn, g, x8, shape, d, o8, async_op, *extra)
        if async_op:
            res._result = back(res._result)
            return res
        return back(res)
    if async_op:
        out = _tensor.empty(x, shape) if out is None else out
        return _async(getattr(_C, fn.replace("_tp_", "_tp_i")), what, g,
                      _tensor.contiguous(x), out, *map(ctypes.c_int, extra))
    return _run(getattr(_C, fn), g, x, shape, *extra, out=out)


def all_gather(x, dim=-1, group=None, out=None, async_op=False):
    """Every rank's x concatenated along dim in rank order. Collective. async_op=True: an
    hcomm.Work (hcomm_tp_iall_gather). bool and int16 move as raw bytes.

    Autograd: Megatron's gather-from region: the backward keeps this rank's slice of the
    gradient along dim (out= then refused)."""
    g = _group(group)
    d = _dim(x, dim)
    what = "hcomm.tp.all_gather"
    if _grad.needed(x):
        return _grad.attach(what, x, out, lambda v: all_gather(v, d, g, None, async_op),
                            lambda grad: split(grad, d, g))
    if out is not None:
        _tensor.check_out(out)
    return _moved(what, "hcomm_tp_all_gather", g, x, _scaled(x, d, g.size), d, out, async_op, d)


def reduce_scatter(x, dim=-1, op="sum", group=None, out=None, async_op=False):
    """x reduced over ranks, and this rank's 1/size slice along dim kept. Collective.
    async_op=True: an hcomm.Work (hcomm_tp_ireduce_scatter).

    Autograd: the transpose of all_gather: the backward all_gathers the gradient along dim
    ('avg': divided by size); ops other than sum and avg and out= are then refused."""
    g = _group(group)
    d = _dim(x, dim)
    code = _op(op)
    what = "hcomm.tp.reduce_scatter"
    if _grad.needed(x):
        _grad_op(what, op)
        bwd = _reduce_bwd(op, g)
        return _grad.attach(what, x, out, lambda v: reduce_scatter(v, d, op, g, None, async_op),
                            lambda grad: bwd(all_gather(grad, d, g)))
    if out is not None:
        _tensor.check_out(out)
    shape = _scaled(x, d, -g.size)
    if async_op:
        out = _tensor.empty(x, shape) if out is None else out
        return _async(_C.hcomm_tp_ireduce_scatter, what, g, _tensor.contiguous(x), out,
                      ctypes.c_int(d), ctypes.c_int(code))
    return _run(_C.hcomm_tp_reduce_scatter, g, x, shape, d, code, out=out)


def split(x, dim=-1, group=None):
    """This rank's 1/size slice of x along dim (a copy). Local. Autograd: the backward
    all_gathers the gradient along dim (Megatron's scatter-to region)."""
    g = _group(group)
    d = _dim(x, dim)
    if _grad.needed(x):
        return _grad.attach("hcomm.tp.split", x, None, lambda v: split(v, d, g),
                            lambda grad: all_gather(grad, d, g))
    return _moved("hcomm.tp.split", "hcomm_tp_split", g, x, _scaled(x, d, -g.size), d, None,
                  False, d)


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

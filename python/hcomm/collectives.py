"""torch.distributed's calls by their names and signatures, on hcomm groups: broadcast,
barrier, all_to_all_single, all_to_all, reduce, all_reduce, all_gather_into_tensor and
reduce_scatter_tensor (hcomm.broadcast and so on). `group` None is the world.
They write into the tensors they are given (torch.distributed's in-place style) and have no
autograd, as torch.distributed's have none: a tensor written that requires grad is refused
(hcomm._tensor.check_out). bool and int16 move as raw bytes in broadcast and
all_to_all_single; reduce refuses them (DtypeError naming the dtype). async_op=True returns an
hcomm.Work built on the C nonblocking forms (hcomm_ibroadcast, hcomm_ireduce,
hcomm_iall_to_allv; barrier: a one-element hcomm_iall_reduce, which completes once every rank
has entered): the tensors must stay untouched until wait()."""
import ctypes

import numpy as np

from . import _lib, _tensor, _work, _world
from . import _tp_calls as _tp
from ._lib import lib


def _group(group, what):
    g = _world.world() if group is None else group
    if not isinstance(g, _world.Group):
        raise TypeError(f"{what}: group must be an hcomm.Group, not {type(g).__name__}")
    g.ptr(what)
    return g


def _nbytes(x):
    return int(np.prod(x.shape)) * (x.itemsize if isinstance(x, np.ndarray) else
                                     x.element_size())


def _call(g, what, name, args, keep, result, async_op):
    """C call `name`(*args) blocking, or its nonblocking form as a Work returning result."""
    if async_op:
        req = _work.issue(getattr(lib, "hcomm_i" + name), args, g, what)
        return _work.Work(g, what, [req], keep, result=result)
    r = getattr(lib, "hcomm_" + name)(*args)
    if r:
        raise g.fail(what, r)
    return None


def _root(g, what, name, v):
    if not isinstance(v, int) or not 0 <= v < g.size:
        raise ValueError(f"{what}: {name}={v!r} outside 0..{g.size - 1} (a rank of the group)")


def broadcast(tensor, src, group=None, async_op=False):
    """Copies `tensor` of rank `src` (its rank in `group`) into `tensor` on every rank, in
    place; returns None (a Work with async_op=True, whose wait() returns the tensor).
    Collective: every rank passes the same shape, dtype and src."""
    what = "hcomm.broadcast"
    g = _group(group, what)
    _root(g, what, "src", src)
    _tensor.check_out(_tensor.check(tensor, "tensor"), "tensor")
    t8, _ = _tensor.as_bytes(tensor)
    d = _tensor.desc(t8, "tensor", writable=True)
    return _call(g, what, "broadcast", (g._ptr, d.data, _nbytes(t8), src), (tensor, t8),
                 tensor, async_op)


def barrier(group=None, async_op=False):
    """Blocks until every rank of `group` (default: the world) has called it."""
    what = "hcomm.barrier"
    g = _group(group, what)
    if not async_op:
        return _call(g, what, "barrier", (g._ptr,), None, None, False)
    one = ctypes.c_int32(0)  # an all_reduce completes once every rank has entered it
    args = (g._ptr, ctypes.byref(one), ctypes.byref(one), 1, _lib.I32, _lib.OPS["sum"])
    return _call(g, what, "all_reduce", args, one, None, True)


def reduce(tensor, dst, op="sum", group=None, async_op=False):
    """`op` over the ranks of `tensor`, written into `tensor` on rank `dst` (in place; the
    other ranks' tensors are left as they were). Collective."""
    what = "hcomm.reduce"
    g = _group(group, what)
    _root(g, what, "dst", dst)
    if op not in _lib.OPS:
        raise ValueError(f"{what}: op must be one of {', '.join(_lib.OPS)}, not {op!r}")
    _tensor.check_out(_tensor.check(tensor, "tensor"), "tensor")
    d = _tensor.desc(tensor, "tensor", writable=True)
    n = int(np.prod(tensor.shape))
    args = (g._ptr, d.data, d.data, n, d.dtype, _lib.OPS[op], dst)
    return _call(g, what, "reduce", args, (tensor, d), tensor, async_op)


def _splits(name, sizes, rows, n, what):
    """Row counts per rank: sizes, or rows/n each (which must divide)."""
    if sizes is None:
        if rows % n:
            raise ValueError(f"{what}: {name} is None, so dim 0 ({rows}) must divide by the "
                             f"group size {n}")
        return [rows // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or min(sizes) < 0 or sum(sizes) != rows:
        raise ValueError(f"{what}: {name}={sizes} must have {n} non-negative entries summing "
                         f"to dim 0 of its tensor ({rows})")
    return sizes


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    """Splits `input` along dim 0 (input_split_sizes rows per rank, default equal) and sends
    block p to rank p; `output` receives rank p's block at its place in dim 0
    (output_split_sizes). Every rank's input_split_sizes[p] must equal output_split_sizes of
    rank p at this rank (hcomm.MismatchError naming the pair otherwise). Collective
    (hcomm_all_to_allv). Shape errors name the argument and both shapes before any
    communication."""
    what = "hcomm.all_to_all_single"
    g = _group(group, what)
    _tensor.check(input, "input")
    _tensor.check_out(_tensor.check(output, "output"), "output")
    if input.dtype != output.dtype or tuple(input.shape[1:]) != tuple(output.shape[1:]):
        raise ValueError(f"{what}: output {tuple(output.shape)} {output.dtype} and input "
                         f"{tuple(input.shape)} {input.dtype} differ beyond dim 0")
    ins = _splits("input_split_sizes", input_split_sizes, input.shape[0], g.size, what)
    outs = _splits("output_split_sizes", output_split_sizes, output.shape[0], g.size, what)
    i8, _ = _tensor.as_bytes(input)
    o8, _ = _tensor.as_bytes(output)
    row = _nbytes(i8) // max(input.shape[0], 1) if input.shape[0] else 0
    row = row or (_nbytes(o8) // max(output.shape[0], 1) if output.shape[0] else 0)
    arr = ctypes.c_size_t * g.size
    sc, rc = arr(*[s * row for s in ins]), arr(*[s * row for s in outs])
    sd = arr(*[int(v) * row for v in np.cumsum([0] + ins[:-1])])
    rd = arr(*[int(v) * row for v in np.cumsum([0] + outs[:-1])])
    di, do = _tensor.desc(i8, "input"), _tensor.desc(o8, "output", writable=True)
    args = (g._ptr, di.data, sc, sd, do.data, rc, rd)
    return _call(g, what, "all_to_allv", args, (input, output, di, do), output, async_op)


def all_reduce(tensor, op="sum", group=None, async_op=False):
    """torch.distributed.all_reduce: `op` over the ranks, in place into `tensor`
    (hcomm_tp_all_reduce, or hcomm_tp_iall_reduce with async_op). Collective."""
    g = _group(group, "hcomm.all_reduce")
    res = _tp.all_reduce(_tensor.check_out(tensor, "tensor"), op, g, out=tensor,
                         async_op=async_op)
    return res if async_op else None


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """torch.distributed.all_gather_into_tensor: every rank's input concatenated along dim 0
    into output_tensor (size x input's dim 0 rows). Collective."""
    g = _group(group, "hcomm.all_gather_into_tensor")
    res = _tp.all_gather(_plain(input_tensor), 0, g,
                         out=_tensor.check_out(output_tensor, "output_tensor"), async_op=async_op)
    return res if async_op else None


def reduce_scatter_tensor(output, input, op="sum", group=None, async_op=False):
    """torch.distributed.reduce_scatter_tensor: input reduced over the ranks, this rank's
    1/size of dim 0 written into output. Collective."""
    g = _group(group, "hcomm.reduce_scatter_tensor")
    res = _tp.reduce_scatter(_plain(input), 0, op, g, out=_tensor.check_out(output, "output"),
                             async_op=async_op)
    return res if async_op else None


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """torch.distributed.all_to_all: input_tensor_list[p] goes to rank p, which writes it into
    its output_tensor_list[this rank]; tensors of any dim 0, the same trailing shape and dtype
    (one all_to_all_single over their concatenation, then copies out). Collective."""
    what = "hcomm.all_to_all"
    g = _group(group, what)
    for name, lst in (("output_tensor_list", output_tensor_list),
                      ("input_tensor_list", input_tensor_list)):
        if len(lst) != g.size:
            raise ValueError(f"{what}: {name} has {len(lst)} tensors; expected one per rank "
                             f"({g.size})")
    cat = _cat(input_tensor_list)
    out = _tensor.empty(cat, (sum(t.shape[0] for t in output_tensor_list),) +
                        tuple(cat.shape[1:]))
    w = all_to_all_single(out, cat, [t.shape[0] for t in output_tensor_list],
                          [t.shape[0] for t in input_tensor_list], g, async_op)

    def scatter_out():
        at = 0
        for t in output_tensor_list:
            t[...] = out[at:at + t.shape[0]]
            at += t.shape[0]
        return output_tensor_list

    if async_op:
        w._finish = scatter_out
        return w
    scatter_out()
    return None


def _plain(x):
    """x outside autograd (these calls record none, as torch.distributed's)."""
    return x.detach() if _tensor.is_torch(x) else x


def _cat(tensors):
    if _tensor.is_torch(tensors[0]):
        import torch
        return torch.cat([t.detach() for t in tensors])
    return np.concatenate(tensors)

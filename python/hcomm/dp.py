"""Data parallelism: bucketed gradient all_reduce in place (hcomm_dp_all_reduce_grads), and the
DDP-style reducer that overlaps it with the backward pass (hcomm_dp_reducer_*)."""
import contextlib
import ctypes
import sys

import numpy as np

from . import _lib, _tensor, _work, _world
from ._lib import Tensor, call, lib
from .context import default_group


def _items(grads):
    if isinstance(grads, (list, tuple)):
        return list(grads)
    if hasattr(grads, "shape"):
        return [grads]
    return list(grads)  # an iterable such as model.parameters()


def _is_param(t):
    return _tensor.is_torch(t) and t.requires_grad and t.is_leaf


def _grads(grads):
    """The tensors to reduce, and (index, parameter, zeros) for each parameter without a
    .grad: zeros take its place so that every rank reduces the same list."""
    out, missing = [], []
    for i, g in enumerate(_items(grads)):
        if _is_param(g):  # a parameter: its .grad
            if g.grad is None:
                import torch
                missing.append((i, g, torch.zeros_like(g)))
                out.append(missing[-1][2])
            else:
                out.append(g.grad)
        else:
            out.append(g)
    return out, missing


def _report_missing(missing, find_unused, group, what):
    """After the reduction: the missing gradients get the reduced zeros (find_unused), or
    StateError naming the first one."""
    if find_unused:
        for _, p, z in missing:
            p.grad = z
    elif missing:
        i, p, _ = missing[0]
        raise _lib.StateError(
            f"{what}: parameter {i} (shape {list(p.shape)}) has no gradient on rank "
            f"{group.rank} of the DP group ({len(missing)} such: {[m[0] for m in missing][:8]}):"
            f" it was not used in the forward. Zeros were reduced in its place; pass "
            f"find_unused_parameters=True to accept that, as DDP does")


def _checked(op, bucket_bytes):
    if op not in ("avg", "sum"):
        raise ValueError(f"hcomm.dp: op must be 'avg' or 'sum', not {op!r}")
    if not isinstance(bucket_bytes, int) or bucket_bytes < 0:
        raise ValueError(f"hcomm.dp: bucket_bytes must be an int >= 0, not {bucket_bytes!r}")
    return _lib.OPS[op]


def _descs(items):
    arr = (Tensor * max(len(items), 1))()
    for i, t in enumerate(items):
        arr[i] = _tensor.desc(t, f"grads[{i}]", writable=True)
    return arr


def all_reduce_grads(grads, op="avg", bucket_bytes=0, group=None, async_op=False,
                     find_unused_parameters=False):
    """Reduces the gradients in place over the DP group (default: the current context's) and
    returns them. op 'avg' or 'sum'; bucket_bytes 0 = 25 MiB. Every rank passes the same list
    of shapes and dtypes. Collective. No autograd: DP reduces gradients, which are not part
    of a graph. async_op=True: an hcomm.Work whose wait() returns `grads` (one
    hcomm_iall_reduce per tensor, unbucketed). A torch parameter without a .grad (unused in
    the forward on this rank) is reduced as zeros, so no rank waits; then StateError names it
    (index and shape), or, with find_unused_parameters=True, its .grad is the result."""
    what = "hcomm.dp.all_reduce"
    g = default_group("dp", group)
    code = _checked(op, bucket_bytes)
    items, missing = _grads(grads)
    for i, t in enumerate(items):
        _tensor.check_out(t, f"grads[{i}]")
    if async_op:
        w = _iall_reduce(g, items, code, grads)
        if missing:
            w._finish = lambda: (_report_missing(missing, find_unused_parameters, g, what),
                                 grads)[1]
        return w
    call(lib.hcomm_dp_all_reduce_grads, g.ptr(what), _descs(items), len(items), code,
         bucket_bytes)
    _report_missing(missing, find_unused_parameters, g, what)
    return grads


def _iall_reduce(g, items, code, result):
    """Each tensor reduced in place by its own hcomm_iall_reduce, as one Work."""
    what = "hcomm.dp.all_reduce"
    descs = [_tensor.desc(t, f"grads[{i}]", writable=True) for i, t in enumerate(items)]
    reqs = []
    for t, d in zip(items, descs):
        n = int(np.prod(t.shape))
        reqs.append(_work.issue(lib.hcomm_iall_reduce,
                                (g.ptr(what), d.data, d.data, n, d.dtype, code), g, what))
    return _work.Work(g, what, reqs, (items, descs), result=result)


all_reduce = all_reduce_grads


class Reducer:
    """PyTorch DDP's gradient reducer over hcomm (Li et al. 2020, section 3.2): the gradient
    tensors are registered once and packed into buckets (reverse order, bucket_bytes each,
    0 = 25 MiB); mark_ready(i) says gradient i is final for this step, and a bucket's
    nonblocking all_reduce starts as soon as all of its gradients are; wait() finishes the
    step (the remaining buckets, the results written back into the gradients) and returns the
    seconds it waited. Collective over the group: every member registers the same shapes and
    dtypes with the same op and bucket_bytes.

    `grads`: tensors (numpy or torch), or torch parameters, whose .grad is registered (it is
    allocated as zeros when missing). hook_params() marks a parameter ready when backward has
    accumulated its gradient: a gradient backward made anew (after
    optimizer.zero_grad(set_to_none=True), torch 2's default) is copied into the registered
    tensor there, and .grad set back to it. Inside `with reducer.no_sync():` (micro-batches
    before the last) nothing is marked.

    A parameter that got no gradient in a step (not used in the forward on this rank): with
    find_unused_parameters=True (DDP's option) it contributes zeros and .grad holds the
    reduced value; with False wait() still joins its peers (zeros contributed), then raises
    hcomm.StateError naming the parameter's index and shape. No autograd: the reducer
    reduces gradients, which are not part of a graph."""

    def __init__(self, grads, op="avg", bucket_bytes=0, group=None, find_unused_parameters=False):
        self.group = default_group("dp", group)
        code = _checked(op, bucket_bytes)
        items = _items(grads)
        self.params = [p if _is_param(p) else None for p in items]
        for p in items:
            if _is_param(p) and p.grad is None:
                import torch
                p.grad = torch.zeros_like(p)
        self.grads = [p.grad if _is_param(p) else p for p in items]
        self._ptrs = [_tensor.desc(t, writable=True).data for t in self.grads]
        self._h = ctypes.c_void_p()
        call(lib.hcomm_dp_reducer_create, self.group.ptr("hcomm.dp.Reducer"),
             _descs(self.grads), len(self.grads), code, bucket_bytes, ctypes.byref(self._h))
        self._sync, self._hooks, self._marked = True, [], set()
        self.find_unused_parameters = find_unused_parameters
        handles = getattr(_world._state, "routings", None)
        if handles is not None:  # freed before its group goes away (Context.destroy)
            handles.add(self)

    def __len__(self):
        return len(self.grads)

    @property
    def handle(self):
        if self._h is None:
            raise _world.dead("hcomm.dp.Reducer", "this reducer", "reducer.free(), or its "
                              "group's context was destroyed")
        return self._h

    def mark_ready(self, index):
        """Gradient `index` (registration order) is final for this step. Local; may start a
        bucket's all_reduce."""
        if not isinstance(index, int) or not 0 <= index < len(self.grads):
            raise ValueError(f"hcomm.dp.Reducer.mark_ready: index={index!r} outside "
                             f"0..{len(self.grads) - 1}")
        call(lib.hcomm_dp_reducer_mark_ready, self.handle, index)
        self._marked.add(index)

    def _unused(self):
        """Marks the parameters that got no gradient this step, with zeros; returns them."""
        missing = [i for i, p in enumerate(self.params)
                   if p is not None and i not in self._marked]
        for i in missing:
            self.grads[i].zero_()
            self.mark_ready(i)
        return missing

    def wait(self):
        """Ends the step: every bucket reduced and written back. Collective. Returns the
        seconds spent waiting (the reduction the backward pass did not hide)."""
        for i, (p, ptr) in enumerate(zip(self.params, self._ptrs)):
            if p is not None and i in self._marked and p.grad is not None and \
                    p.grad.data_ptr() != ptr:
                raise RuntimeError(f"hcomm.dp.Reducer: the .grad of parameter {i} is no longer "
                                   f"the registered tensor (zero it instead of replacing it)")
        missing = self._unused()
        waited = ctypes.c_double()
        try:
            call(lib.hcomm_dp_reducer_finish, self.handle, ctypes.byref(waited))
        finally:
            self._marked = set()
        for i in missing:
            self.params[i].grad = self.grads[i]
        if missing and not self.find_unused_parameters:
            i = missing[0]
            raise _lib.StateError(
                f"hcomm.dp.Reducer.wait: parameter {i} (shape {list(self.grads[i].shape)}) got "
                f"no gradient this step on rank {self.group.rank} of the DP group "
                f"({len(missing)} such: {missing[:8]}); it was not used in the forward. Pass "
                f"find_unused_parameters=True to reduce zeros for it, as DDP does")
        return waited.value

    finish = wait

    def hook_params(self):
        """Marks each registered parameter ready once backward has accumulated its .grad (a
        hook on its AccumulateGrad node, as DDP has). Returns self."""
        import torch
        for i, p in enumerate(self.params):
            if p is None:
                raise TypeError(f"hcomm.dp.Reducer.hook_params: grads[{i}] is not a torch "
                                f"parameter (a leaf that requires grad)")
            with torch.enable_grad():  # a graph node, even when called under no_grad
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook(i))
            self._hooks.append(acc)  # the node must live for its hook to stay
        return self

    def _hook(self, index):
        def hook(*_):
            if self._sync:
                p, buf = self.params[index], self.grads[index]
                if p.grad is not buf:  # made anew after zero_grad(set_to_none=True)
                    with sys.modules["torch"].no_grad():
                        buf.copy_(p.grad)
                    p.grad = buf
                self.mark_ready(index)
        return hook

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without marking them (DDP's no_sync)."""
        old, self._sync = self._sync, False
        try:
            yield self
        finally:
            self._sync = old

    def free(self):
        if getattr(self, "_h", None) is not None:
            lib.hcomm_dp_reducer_destroy(self._h)
            self._h = None

    def __del__(self):
        self.free()


def reducer(grads, op="avg", bucket_bytes=0, group=None, find_unused_parameters=False):
    """A Reducer over the DP group (default: the current context's)."""
    return Reducer(grads, op=op, bucket_bytes=bucket_bytes, group=group,
                   find_unused_parameters=find_unused_parameters)


# Group.all_reduce and Group.reducer (hcomm._world, below this module) forward to this module.
_world.register_dp(sys.modules[__name__])

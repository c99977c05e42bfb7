"""Pipeline parallelism: point-to-point sends and receives of whole tensors between stages
(include/hcomm/pp.h). `group` defaults to the current context's PP group (rank i = stage i),
else the world. A receive without a shape takes whatever dtype and shape arrives
(hcomm_pp_recv_any); it returns a torch tensor when `kind='torch'`, `dtype` is a torch dtype,
or (neither given) the program has imported torch, else a numpy array.

Autograd: none inside these calls, by design (as Megatron's p2p_communication): a send takes
x.detach()'s bytes and a receive returns a new leaf. Gradients come back through the calls
the user makes: the next stage marks what it received requires_grad_(), runs its backward and
sends act.grad back with PP_TAG_BACKWARD; this stage calls out.backward(grad) on what it sent.
A receive buffer (out=) that requires grad is refused (autograd would not see the write)."""
import ctypes

from . import _tensor, _world
from ._lib import Tensor, call, lib
from .context import default_group

PP_TAG_FORWARD = 1   # HCOMM_PP_TAG_FORWARD: activations to the next stage
PP_TAG_BACKWARD = 2  # HCOMM_PP_TAG_BACKWARD: gradients to the previous stage
RING = 1             # HCOMM_PP_RING: the first and last stages are neighbours
_ANY_SHAPE = 2       # HCOMM_PP_ANY_SHAPE


def _recv_buffer(shape, dtype, out, kind):
    if out is not None:
        return _tensor.check_out(out)
    import numpy as np
    if _tensor.default_kind(kind, dtype) == "torch":
        import torch
        return torch.empty(tuple(shape), dtype=dtype or torch.float32)
    return np.empty(tuple(shape), dtype=dtype or np.float32)


def _took(d, kind):
    """The tensor hcomm allocated into descriptor `d`, copied out; its C memory freed."""
    try:
        return _tensor.from_c(d, kind)
    finally:
        lib.hcomm_mem_free(d.data)


def send(x, dst, tag=0, group=None):
    """Sends x to rank dst of the group. Returns once x may be reused."""
    g = default_group("pp", group)
    call(lib.hcomm_pp_send, g._ptr, ctypes.byref(_tensor.desc(x, "x")), dst, tag)


def recv(src, tag=0, shape=None, dtype=None, group=None, out=None, kind=None):
    """Receives from rank src: into `out`, or a new tensor of shape/dtype (which must match
    what was sent), or, with neither, whatever was sent."""
    g = default_group("pp", group)
    if shape is None and out is None:
        d = Tensor()
        call(lib.hcomm_pp_recv_any, g._ptr, src, tag, ctypes.byref(d))
        return _took(d, _tensor.default_kind(kind, dtype))
    buf = _recv_buffer(shape, dtype, out, kind)
    call(lib.hcomm_pp_recv, g._ptr, ctypes.byref(_tensor.desc(buf, "out", True)), src, tag)
    return buf


class Request:
    """A pending isend/irecv; wait() completes it and returns the received tensor (None for a
    send). The arrays and descriptors stay referenced here until then."""

    def __init__(self, ptr, keep, result=None, kind=None, group=None):
        self._ptr, self._keep, self._result, self._kind = ptr, keep, result, kind
        self.group = group
        handles = getattr(_world._state, "routings", None)
        if handles is not None:  # completed before its group goes away (Context.destroy)
            handles.add(self)

    def free(self):
        """Completes a pending request (its context is being destroyed)."""
        if self._ptr is not None:
            try:
                self.wait()
            except Exception:  # noqa: BLE001 -- the context goes away either way
                pass

    def wait(self):
        if self._ptr is None:
            raise _world.dead("hcomm.pp.Request.wait", "this request",
                              "already waited; a request completes once")
        ptr, self._ptr = self._ptr, None
        call(lib.hcomm_pp_wait, ptr)
        if self._kind is not None:  # receive by envelope: copy out of hcomm's memory
            return _took(self._keep, self._kind)
        return self._result


def isend(x, dst, tag=0, group=None):
    g = default_group("pp", group)
    d, req = _tensor.desc(x, "x"), ctypes.c_void_p()
    call(lib.hcomm_pp_isend, g._ptr, ctypes.byref(d), dst, tag, ctypes.byref(req))
    return Request(req, (x, d), group=g)


def irecv(src, tag=0, shape=None, dtype=None, group=None, out=None, kind=None):
    g = default_group("pp", group)
    req = ctypes.c_void_p()
    if shape is None and out is None:
        d = Tensor()
        call(lib.hcomm_pp_irecv_any, g._ptr, src, tag, ctypes.byref(d), ctypes.byref(req))
        return Request(req, d, kind=_tensor.default_kind(kind, dtype), group=g)
    buf = _recv_buffer(shape, dtype, out, kind)
    d = _tensor.desc(buf, "out", True)
    call(lib.hcomm_pp_irecv, g._ptr, ctypes.byref(d), src, tag, ctypes.byref(req))
    return Request(req, (buf, d), result=buf, group=g)


def send_recv(x, dst, src, send_tag=PP_TAG_FORWARD, recv_tag=PP_TAG_BACKWARD, shape=None,
              dtype=None, group=None, out=None, kind=None):
    """Sends x to dst with send_tag and receives from src with recv_tag at once (cannot
    deadlock). Without shape/out the receive takes any shape (a batched isend + irecv_any)."""
    g = default_group("pp", group)
    ds = _tensor.desc(x, "x")
    if shape is None and out is None:
        dr = Tensor()
        call(lib.hcomm_pp_group_start, g._ptr)
        try:  # inside a batch the calls only record; group_end posts and completes them
            unused = ctypes.c_void_p()  # a batch's requests stay NULL: group_end completes them
            call(lib.hcomm_pp_irecv_any, g._ptr, src, recv_tag, ctypes.byref(dr),
                 ctypes.byref(unused))
            call(lib.hcomm_pp_isend, g._ptr, ctypes.byref(ds), dst, send_tag,
                 ctypes.byref(unused))
        finally:
            call(lib.hcomm_pp_group_end, g._ptr)
        return _took(dr, _tensor.default_kind(kind, dtype))
    buf = _recv_buffer(shape, dtype, out, kind)
    call(lib.hcomm_pp_send_recv, g._ptr, ctypes.byref(ds), dst, send_tag,
         ctypes.byref(_tensor.desc(buf, "out", True)), src, recv_tag)
    return buf


# --- pipeline helpers (Megatron-LM's p2p_communication): forward = to the next stage with
# PP_TAG_FORWARD, backward = to the previous one with PP_TAG_BACKWARD. On the first stage
# there is no previous and on the last no next (unless ring=True): that side is a no-op and a
# receive from it returns None.
def _has(g, side, ring):
    return (ring and g.size > 1) or (g.rank > 0 if side == "prev" else g.rank < g.size - 1)


def _flags(ring, any_shape):
    return (RING if ring else 0) | (_ANY_SHAPE if any_shape else 0)


def _helper(name, x, recv_side, shape, dtype, out, ring, kind, group):
    """One C helper call: send x (if not None), receive from recv_side (if not None)."""
    g = default_group("pp", group)
    any_shape = recv_side is not None and shape is None and out is None
    args = [g._ptr]
    if x is not None:
        args.append(ctypes.byref(_tensor.desc(x, "x")))
    buf = dr = None
    if recv_side is not None:
        if any_shape:
            dr = Tensor()
        else:
            buf = _recv_buffer(shape, dtype, out, kind)
            dr = _tensor.desc(buf, "out", True)
        args.append(ctypes.byref(dr))
    call(getattr(lib, "hcomm_pp_" + name), *args, _flags(ring, any_shape))
    if recv_side is None or not _has(g, recv_side, ring):
        return None
    return _took(dr, _tensor.default_kind(kind, dtype)) if any_shape else buf


def send_forward(x, ring=False, group=None):
    _helper("send_forward", x, None, None, None, None, ring, None, group)


def send_backward(grad, ring=False, group=None):
    _helper("send_backward", grad, None, None, None, None, ring, None, group)


def recv_forward(shape=None, dtype=None, out=None, ring=False, kind=None, group=None):
    return _helper("recv_forward", None, "prev", shape, dtype, out, ring, kind, group)


def recv_backward(shape=None, dtype=None, out=None, ring=False, kind=None, group=None):
    return _helper("recv_backward", None, "next", shape, dtype, out, ring, kind, group)


def send_forward_recv_backward(x, shape=None, dtype=None, out=None, ring=False, kind=None,
                               group=None):
    return _helper("send_forward_recv_backward", x, "next", shape, dtype, out, ring, kind, group)


def send_backward_recv_forward(grad, shape=None, dtype=None, out=None, ring=False, kind=None,
                               group=None):
    return _helper("send_backward_recv_forward", grad, "prev", shape, dtype, out, ring, kind,
                   group)


def send_forward_recv_forward(x, shape=None, dtype=None, out=None, ring=False, kind=None,
                              group=None):
    return _helper("send_forward_recv_forward", x, "prev", shape, dtype, out, ring, kind, group)


def send_backward_recv_backward(grad, shape=None, dtype=None, out=None, ring=False, kind=None,
                                group=None):
    return _helper("send_backward_recv_backward", grad, "next", shape, dtype, out, ring, kind,
                   group)

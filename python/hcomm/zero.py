"""Sharded data parallel over the C shard plan (hcomm/zero.h): `shard(module)` in the style of
FSDP2's `fully_shard`. The plan holds the parameters: a forward pre-hook gathers them and points
the module's parameters at the gathered buffer; once backward has produced every gradient, a
callback adds them into the plan's full gradients, reduce_scatters them into this rank's shard and
(ZeRO-3) frees the gathered parameters. The optimizer steps `Sharded.parameters()`: torch
Parameters over this rank's shards, whose `.grad` are the reduced gradient shards.
`no_sync()` keeps gradients local for accumulation steps. f32 and f64 parameters."""
import contextlib
import ctypes

import numpy as np

from . import _lib, _tensor
from ._lib import Tensor, call, lib
from .context import default_group

_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
PARAM_DTYPE = -1  # HCOMM_ZERO_PARAM_DTYPE
ALL = -1  # HCOMM_ZERO_ALL


class Config(ctypes.Structure):
    """hcomm_zero_config_t."""
    _fields_ = [("stage", _I), ("bucket_bytes", _SZ), ("op", _I), ("reduce_dtype", _I),
                ("accumulate", _I), ("spares", _I)]


class Shard(ctypes.Structure):
    """hcomm_zero_shard_t."""
    _fields_ = [("params", _P), ("grads", _P), ("count", _SZ), ("valid", _SZ),
                ("offset", _SZ), ("param_dtype", _I), ("reduce_dtype", _I)]


_PROTOS = {
    "hcomm_zero_create": [_P, _P, ctypes.POINTER(Tensor), _I, ctypes.POINTER(Config),
                          ctypes.POINTER(_P)],
    "hcomm_zero_destroy": [ctypes.POINTER(_P)],
    "hcomm_zero_num_buckets": [_P, ctypes.POINTER(_I)],
    "hcomm_zero_shard": [_P, _I, ctypes.POINTER(Shard)],
    "hcomm_zero_param": [_P, _I, ctypes.POINTER(_P)],
    "hcomm_zero_grad": [_P, _I, ctypes.POINTER(_P)],
    "hcomm_zero_all_gather_params": [_P, _I, _P, _SZ],
    "hcomm_zero_release": [_P, _I],
    "hcomm_zero_reduce_scatter_grads": [_P, _I],
    "hcomm_zero_clear_grads": [_P],
    "hcomm_zero_set_no_sync": [_P, _I],
}
for _name, _args in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _I, _args

_CT = {_lib.F32: (ctypes.c_float, np.float32), _lib.F64: (ctypes.c_double, np.float64)}


def _view(ptr, count, code):
    """A torch tensor over count elements of dtype code at ptr (no copy)."""
    import torch
    ct, _ = _CT[code]
    return torch.from_numpy(np.ctypeslib.as_array((ct * count).from_address(ptr)))


class Sharded:
    """One module's shard plan and hooks (see the module docstring). `group`: the shard group
    (default: the world); `replicate_group`: HSDP replicas, or None."""

    def __init__(self, module, group=None, replicate_group=None, stage=3, bucket_bytes=0,
                 op="sum"):
        import torch
        if op not in ("sum", "avg"):
            raise ValueError(f"hcomm.zero: op must be 'sum' or 'avg', not {op!r}")
        self.module, self.stage = module, stage
        self.group = default_group("dp", group)
        self.params = [p for p in module.parameters()]
        for i, p in enumerate(self.params):
            if p.dtype not in (torch.float32, torch.float64):
                raise TypeError(f"hcomm.zero: parameter {i} has dtype {p.dtype} (f32 or f64)")
        # Shapes and dtypes as created: ZeRO-3 empties the parameters between uses.
        self._shapes = [(p.shape, p.numel(), _tensor.desc(p.detach()).dtype) for p in self.params]
        descs = (Tensor * max(len(self.params), 1))()
        for i, p in enumerate(self.params):
            descs[i] = _tensor.desc(p.detach(), f"params[{i}]")
        cfg = Config(stage, bucket_bytes, _lib.OPS[op], PARAM_DTYPE, 0, 2)
        self._ptr = _P()
        rep = replicate_group._ptr if replicate_group is not None else None
        call(lib.hcomm_zero_create, self.group._ptr, rep, descs, len(self.params),
             ctypes.byref(cfg), ctypes.byref(self._ptr))
        nb = _I()
        call(lib.hcomm_zero_num_buckets, self._ptr, ctypes.byref(nb))
        self._shards = [self._shard(k) for k in range(nb.value)]
        self._masters = [torch.nn.Parameter(_view(s.params, s.valid, s.param_dtype))
                         for s in self._shards]
        self._queued = False
        self._hooks = [module.register_forward_pre_hook(self._pre_forward)]
        self._hooks += [p.register_hook(self._grad_hook) for p in self.params]

    def _shard(self, k):
        s = Shard()
        call(lib.hcomm_zero_shard, self._ptr, k, ctypes.byref(s))
        return s

    def parameters(self):
        """This rank's shards as torch Parameters (for the optimizer)."""
        return list(self._masters)

    def _pre_forward(self, module, args):
        call(lib.hcomm_zero_all_gather_params, self._ptr, ALL, None, 0)
        for i, p in enumerate(self.params):
            ptr = _P()
            call(lib.hcomm_zero_param, self._ptr, i, ctypes.byref(ptr))
            shape, numel, code = self._shapes[i]
            if ptr.value:
                p.data = _view(ptr.value, numel, code).view(shape)

    def _grad_hook(self, grad):
        # As FSDP and DDP do: one callback when the whole backward pass has ended.
        if not self._queued:
            import torch
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._post_backward)
        return grad

    def _post_backward(self):
        self._queued = False
        for i, q in enumerate(self.params):
            ptr = _P()
            call(lib.hcomm_zero_grad, self._ptr, i, ctypes.byref(ptr))
            _, numel, code = self._shapes[i]
            if ptr.value and q.grad is not None:
                _view(ptr.value, numel, code).add_(q.grad.reshape(-1))
            q.grad = None
        call(lib.hcomm_zero_reduce_scatter_grads, self._ptr, ALL)
        if self.stage == 3:  # freed until the next forward gathers them again
            call(lib.hcomm_zero_release, self._ptr, ALL)
            for q in self.params:
                q.data = q.data.new_empty(0)
        for k, master in enumerate(self._masters):
            s = self._shard(k)
            master.grad = _view(s.grads, s.valid, s.reduce_dtype) if s.grads else None

    def zero_grad(self):
        """Frees the gradient shards (set_to_none)."""
        call(lib.hcomm_zero_clear_grads, self._ptr)
        for master in self._masters:
            master.grad = None

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside keep their gradients local; the first one after it reduces
        everything accumulated."""
        call(lib.hcomm_zero_set_no_sync, self._ptr, 1)
        try:
            yield
        finally:
            call(lib.hcomm_zero_set_no_sync, self._ptr, 0)

    def close(self):
        """Removes the hooks and frees the plan (the module's parameters then hold no data)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._ptr:
            lib.hcomm_zero_destroy(ctypes.byref(self._ptr))


def shard(module, group=None, replicate_group=None, stage=3, bucket_bytes=0, op="sum"):
    """Shards `module`'s parameters over `group` (FSDP2's fully_shard); returns the Sharded."""
    return Sharded(module, group, replicate_group, stage, bucket_bytes, op)

"""Data parallelism: bucketed gradient all_reduce in place (hcomm_dp_all_reduce_grads)."""
from . import _lib, _tensor
from ._lib import Tensor, call, lib
from .context import default_group


def _grads(grads):
    if isinstance(grads, (list, tuple)):
        items = list(grads)
    elif hasattr(grads, "shape"):
        items = [grads]
    else:  # an iterable such as model.parameters()
        items = list(grads)
    out = []
    for g in items:
        if _tensor.is_torch(g) and g.requires_grad and g.is_leaf:  # a parameter: its .grad
            if g.grad is not None:
                out.append(g.grad)
        else:
            out.append(g)
    return out


def all_reduce_grads(grads, op="avg", bucket_bytes=0, group=None):
    """Reduces the gradients in place over the DP group (default: the current context's) and
    returns them. op 'avg' or 'sum'; bucket_bytes 0 = 25 MiB. Every rank passes the same list
    of shapes and dtypes. Collective."""
    g = default_group("dp", group)
    if op not in ("avg", "sum"):
        raise ValueError(f"hcomm.dp: op must be 'avg' or 'sum', not {op!r}")
    if not isinstance(bucket_bytes, int) or bucket_bytes < 0:
        raise ValueError(f"hcomm.dp: bucket_bytes must be an int >= 0, not {bucket_bytes!r}")
    items = _grads(grads)
    arr = (Tensor * max(len(items), 1))()
    for i, t in enumerate(items):
        arr[i] = _tensor.desc(t, f"grads[{i}]", writable=True)
    call(lib.hcomm_dp_all_reduce_grads, g._ptr, arr, len(items), _lib.OPS[op], bucket_bytes)
    return grads


all_reduce = all_reduce_grads

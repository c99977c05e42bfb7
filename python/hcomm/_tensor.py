"""numpy arrays and torch CPU tensors as hcomm_tensor_t descriptors, zero-copy: the
descriptor points at the array's own memory, so the C call reads and writes it in place."""
import ctypes
import sys

import numpy as np

from . import _lib
from ._lib import Tensor

_NP = {np.dtype(np.float32): _lib.F32, np.dtype(np.float64): _lib.F64,
       np.dtype(np.float16): _lib.F16, np.dtype(np.int8): _lib.I8,
       np.dtype(np.uint8): _lib.U8, np.dtype(np.int32): _lib.I32,
       np.dtype(np.int64): _lib.I64}
_NP_OF = {v: k for k, v in _NP.items()}
_TORCH = None  # torch dtype -> hcomm dtype, filled on first use so torch stays optional


def _torch_map():
    global _TORCH
    if _TORCH is None:
        import torch
        _TORCH = {torch.float32: _lib.F32, torch.float64: _lib.F64, torch.float16: _lib.F16,
                  torch.bfloat16: _lib.BF16, torch.int8: _lib.I8, torch.uint8: _lib.U8,
                  torch.int32: _lib.I32, torch.int64: _lib.I64}
    return _TORCH


def is_torch(x):
    # Checking sys.modules first keeps numpy-only programs from importing torch.
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def check(x, name="x"):
    """Raises TypeError unless x is a numpy array or a torch tensor; returns x."""
    if not isinstance(x, np.ndarray) and not is_torch(x):
        raise TypeError(f"hcomm: {name} must be a numpy array or a torch CPU tensor, "
                        f"not {type(x).__name__}")
    return x


def desc(x, name="tensor", writable=False):
    """The descriptor of `x` (numpy array or torch CPU tensor). Raises TypeError/ValueError
    before any communication when x cannot be passed without a copy."""
    d = Tensor()
    if isinstance(x, np.ndarray):
        code = _NP.get(x.dtype)
        if code is None:
            raise TypeError(f"hcomm: {name} has dtype {x.dtype}, which hcomm does not support "
                            f"(f32, f64, f16, i8, u8, i32, i64; bf16 through torch)")
        if not x.flags.c_contiguous:
            raise ValueError(f"hcomm: {name} is not contiguous (strides {x.strides}); "
                             f"pass np.ascontiguousarray({name})")
        if writable and not x.flags.writeable:
            raise ValueError(f"hcomm: {name} is read-only but is written in place")
        try:  # 3x faster than x.ctypes.data, which matters for small messages
            d.data = ctypes.addressof(ctypes.c_char.from_buffer(x))
        except (TypeError, ValueError):  # read-only or empty: the generic route
            d.data = x.ctypes.data
    elif is_torch(x):
        code = _torch_map().get(x.dtype)
        if code is None:
            raise TypeError(f"hcomm: {name} has dtype {x.dtype}, which hcomm does not support")
        if x.device.type != "cpu":
            raise ValueError(f"hcomm: {name} is on {x.device}; hcomm takes CPU tensors")
        if not x.is_contiguous():
            raise ValueError(f"hcomm: {name} is not contiguous (stride {x.stride()}); "
                             f"pass {name}.contiguous()")
        d.data = x.data_ptr()
    else:
        raise TypeError(f"hcomm: {name} must be a numpy array or a torch CPU tensor, "
                        f"not {type(x).__name__}")
    if x.ndim > _lib.MAX_DIMS:
        raise ValueError(f"hcomm: {name} has {x.ndim} dims; hcomm takes at most 8")
    d.dtype = code
    d.ndim = x.ndim
    d.shape[:x.ndim] = x.shape
    return d


def empty(like, shape, dtype=None):
    """A new array of `shape`, of like's kind (numpy or torch) and dtype unless given."""
    if is_torch(like):
        import torch
        return torch.empty(tuple(shape), dtype=dtype or like.dtype)
    return np.empty(tuple(shape), dtype=dtype or like.dtype)


def dtype_of(code, kind):
    """The numpy or torch dtype of hcomm dtype `code`."""
    if kind == "torch":
        return {v: k for k, v in _torch_map().items()}[code]
    if code == _lib.BF16:
        raise TypeError("hcomm: received bf16, which numpy cannot hold; receive with "
                        "kind='torch'")
    return _NP_OF[code]


def from_c(d, kind):
    """A new array (numpy or torch) holding a copy of the tensor that C allocated in `d`."""
    shape = tuple(d.shape[i] for i in range(d.ndim))
    dt = dtype_of(d.dtype, kind)
    if kind == "torch":
        import torch
        out = torch.empty(shape, dtype=dt)
        ptr, nbytes = out.data_ptr(), out.numel() * out.element_size()
    else:
        out = np.empty(shape, dtype=dt)
        ptr, nbytes = out.ctypes.data, out.nbytes
    if nbytes:
        ctypes.memmove(ptr, d.data, nbytes)
    return out


def kind_of(dtype):
    """'torch' for a torch dtype, 'numpy' for anything numpy accepts, None for None."""
    if dtype is None:
        return None
    t = sys.modules.get("torch")
    return "torch" if t is not None and isinstance(dtype, t.dtype) else "numpy"


def default_kind(kind=None, dtype=None):
    """Receives without an input tensor: the kind asked for, else that of `dtype`, else torch
    when the program uses torch, else numpy."""
    return kind or kind_of(dtype) or ("torch" if "torch" in sys.modules else "numpy")

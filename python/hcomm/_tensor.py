"""numpy arrays and torch CPU tensors as hcomm_tensor_t descriptors, zero-copy: the
descriptor points at the array's own memory, so the C call reads and writes it in place.

The contiguity rule, the same for every call of the package: an input that is not contiguous
(x.t(), a strided slice) is copied into a contiguous one first (one extra read and write of
its bytes, as x.contiguous() costs); a tensor written in place (out=, broadcast's tensor, a
receive buffer, DP gradients) must be contiguous, else ValueError before any communication.
bool and int16 tensors, which C has no dtype for, move as raw bytes in the calls that do not
reduce (as_bytes); a reduction of them is a DtypeError naming the dtype."""
import ctypes
import struct
import sys
import threading

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


_BYTES_ONLY = ("bool", "int16")


def _unsupported(x, name):
    dt = str(x.dtype).replace("torch.", "")
    if dt in _BYTES_ONLY:
        return _lib.DtypeError(f"hcomm: {name} has dtype {x.dtype}, which hcomm moves as raw "
                               f"bytes (gather, broadcast, all-to-all, pp) but cannot reduce")
    return _lib.DtypeError(f"hcomm: {name} has dtype {x.dtype}, which hcomm does not support "
                           f"(f32, f64, f16, bf16, i8, u8, i32, i64; bool and int16 moved only)")


def contiguous(x):
    """x, or a contiguous copy of it (the package's contiguity rule for inputs)."""
    if isinstance(x, np.ndarray):
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)
    return x if x.is_contiguous() else x.contiguous()


def as_bytes(x):
    """x as a uint8 view when its dtype is bool or int16 (int16: the last dim doubled, 0-d as
    [2]), else x; and the function that turns a result of that view back into x's dtype."""
    dt = str(x.dtype).replace("torch.", "")
    if dt not in _BYTES_ONLY:
        return x, None
    x = contiguous(x)
    if x.ndim == 0:
        x = x.reshape(1)
    if is_torch(x):
        import torch
        back = x.dtype
        return x.view(torch.uint8), lambda y: y.view(back)
    back = x.dtype
    return x.view(np.uint8), lambda y: y.view(back)


def check_out(out, name="out"):
    """A tensor hcomm writes in place: torch's rule for in-place writes into autograd's
    tensors (refused where autograd cannot see the write), and contiguous."""
    if is_torch(out) and out.requires_grad:
        kind = ("a leaf Variable that requires grad" if out.is_leaf else
                "a tensor that requires grad")
        raise RuntimeError(f"hcomm: {name} is {kind}; hcomm cannot write into it in place "
                           f"(autograd would not see the write). Pass a tensor that does "
                           f"not require grad, or {name}.detach()")
    return out


def desc(x, name="tensor", writable=False):
    """The descriptor of `x` (numpy array or torch CPU tensor). Raises TypeError/ValueError
    before any communication when x cannot be passed. An input (writable False) that is not
    contiguous is copied; the copy lives as the descriptor's `keep`."""
    d = Tensor()
    if not writable and hasattr(x, "ndim"):
        c = contiguous(x) if (is_torch(x) or isinstance(x, np.ndarray)) else x
        if c is not x:
            d = desc(c, name)
            d.keep = c
            return d
    if isinstance(x, np.ndarray):
        code = _NP.get(x.dtype)
        if code is None:
            raise _unsupported(x, name)
        if not x.flags.c_contiguous:
            raise ValueError(f"hcomm: {name} is not contiguous (strides {x.strides}) but is "
                             f"written in place; pass a contiguous array")
        if writable and not x.flags.writeable:
            raise ValueError(f"hcomm: {name} is read-only but is written in place")
        try:  # 3x faster than x.ctypes.data, which matters for small messages
            d.data = ctypes.addressof(ctypes.c_char.from_buffer(x))
        except (TypeError, ValueError):  # read-only or empty: the generic route
            d.data = x.ctypes.data
    elif is_torch(x):
        code = _torch_map().get(x.dtype)
        if code is None:
            raise _unsupported(x, name)
        if x.device.type != "cpu":
            raise ValueError(f"hcomm: {name} is on {x.device}; hcomm takes CPU tensors")
        if not x.is_contiguous():
            raise ValueError(f"hcomm: {name} is not contiguous (stride {x.stride()}) but is "
                             f"written in place; pass a contiguous tensor")
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


# --- the fast path of blocking calls: descriptors packed into per-thread slots --------------
# hcomm_tensor_t's bytes: void *data, int dtype, int ndim, int64_t shape[8], native sizes and
# alignment as the C compiler lays it out; one format per ndim, whose pad bytes zero the
# unused dims (fewer arguments to pack_into is most of its cost).
_DESC = [struct.Struct(f"@Pii{n}q{8 * (_lib.MAX_DIMS - n)}x") for n in range(_lib.MAX_DIMS + 1)]
SIZE = ctypes.sizeof(Tensor)
assert all(d.size == SIZE for d in _DESC), "hcomm_tensor_t layout changed"
_tls = threading.local()
_from_buffer, _addressof = ctypes.c_char.from_buffer, ctypes.addressof


def slots():
    """This thread's two descriptors for a blocking call and their byref() objects: (in, out,
    &in, &out). Per thread because ranks are threads; a blocking call is done with them when
    it returns, so every call reuses them instead of allocating."""
    try:
        return _tls.slots
    except AttributeError:
        d_in, d_out = Tensor(), Tensor()
        _tls.slots = (d_in, d_out, ctypes.byref(d_in), ctypes.byref(d_out))
        # For pack_like: the two descriptors as bytes, and out's data pointer.
        _tls.like = (memoryview(d_in).cast("B"), memoryview(d_out).cast("B"),
                     ctypes.c_void_p.from_buffer(d_out))
        return _tls.slots


def pack_like(out):
    """Fills this thread's out descriptor for `out`, a new array that empty() made with the
    shape and dtype of the input just packed into the in descriptor: its bytes, with out's
    data pointer (half the cost of pack)."""
    b_in, b_out, data = _tls.like
    b_out[:] = b_in
    if type(out) is np.ndarray:
        try:
            data.value = _addressof(_from_buffer(out))
        except ValueError:  # no elements: no buffer to point at
            data.value = out.ctypes.data
    else:
        data.value = out.data_ptr()


def pack(x, d, name="tensor", writable=False):
    """Writes x's descriptor into Tensor `d` (see slots()): what desc() does, with
    one struct.pack_into instead of ctypes field stores. Contiguous writable numpy arrays and
    plain torch CPU tensors take the fast path; everything else goes through desc(), which
    copies its descriptor in or raises the same TypeError/ValueError. Returns the contiguous
    copy it made of a strided input (else None), for outputs shaped like it."""
    ptr = None
    t = type(x)
    if t is np.ndarray:
        try:  # 3x faster than x.ctypes.data; numpy refuses (BufferError) a buffer that is not
            # C-contiguous, and ctypes one that is read-only or empty: those take desc()
            ptr = _addressof(_from_buffer(x))
        except (TypeError, ValueError, BufferError):
            pass
        code = _NP.get(x.dtype)
    elif _TORCH is not None and t is sys.modules["torch"].Tensor:
        code = _TORCH.get(x.dtype)
        if x.is_cpu and x.is_contiguous():
            ptr = x.data_ptr()
    if ptr is None or code is None or len(x.shape) > _lib.MAX_DIMS:
        slow = desc(x, name, writable)
        ctypes.memmove(_addressof(d), _addressof(slow), SIZE)
        # An input's contiguous copy must outlive the blocking call that reads it: kept per
        # thread and per slot until the next call replaces it.
        setattr(_tls, "keep_out" if writable else "keep_in", slow)
        return getattr(slow, "keep", None)
    shape = x.shape
    _DESC[len(shape)].pack_into(d, 0, ptr, code, len(shape), *shape)


def empty_like(x):
    """A new array of x's kind, shape and dtype, contiguous when x is (pass the copy pack()
    returns for a strided x); np.empty and torch.empty_like are the fastest ways to it."""
    if type(x) is np.ndarray:
        return np.empty(x.shape, x.dtype)
    return sys.modules["torch"].empty_like(x)


def empty(like, shape, dtype=None):
    """A new array of `shape`, of like's kind (numpy or torch) and dtype unless given."""
    if type(like) is np.ndarray:
        return np.empty(shape, dtype=dtype or like.dtype)
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

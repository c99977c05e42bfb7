"""Loads libhcomm-c through ctypes, declares the C prototypes and maps result codes to
exceptions. Everything else in the package calls C through `call()` below."""
import ctypes
import os
import pathlib

# --- the C types (include/hcomm/core.h) -------------------------------------------------
MAX_DIMS = 8
F32, F64, F16, BF16, I8, U8, I32, I64 = range(8)
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


class Tensor(ctypes.Structure):
    """hcomm_tensor_t: a contiguous row-major host tensor; hcomm never owns `data`."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS)]


class ParallelConfig(ctypes.Structure):
    """hcomm_parallel_config_t (domain.h); 0 means "default" for every size."""
    _fields_ = [("tp", ctypes.c_int), ("pp", ctypes.c_int), ("dp", ctypes.c_int),
                ("cp", ctypes.c_int), ("ep", ctypes.c_int), ("etp", ctypes.c_int),
                ("num_experts", ctypes.c_int), ("order", ctypes.c_char_p),
                ("dp_shard", ctypes.c_int)]


class GroupList(ctypes.Structure):
    _fields_ = [("num_groups", ctypes.c_int), ("group_size", ctypes.c_int),
                ("ranks", ctypes.POINTER(ctypes.c_int))]


class MoeOptions(ctypes.Structure):
    _fields_ = [("capacity_factor", ctypes.c_double), ("drop_policy", ctypes.c_int),
                ("etp_group", ctypes.c_void_p), ("path", ctypes.c_int),
                ("no_weight_grads", ctypes.c_int)]


RANK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

# --- errors: one class per result code (core.h's HCOMM_RESULT_TABLE) --------------------


class HcommError(RuntimeError):
    """A failed hcomm C call. `code` is the result code, `name` its C name, and the message is
    hcomm_last_error() of the failing thread, unchanged."""
    code = 14

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def name(self):
        return lib.hcomm_result_name(self.code).decode()


def _err(name, code, *bases):
    return type(name, bases or (HcommError,), {"code": code, "__module__": "hcomm"})


NullError = _err("NullError", 1)
InvalidArgError = _err("InvalidArgError", 2, HcommError, ValueError)
DtypeError = _err("DtypeError", 3, HcommError, TypeError)
ShapeError = _err("ShapeError", 4, HcommError, ValueError)
GroupError = _err("GroupError", 5)
MismatchError = _err("MismatchError", 6)
StateError = _err("StateError", 7)
NoMemError = _err("NoMemError", 8, HcommError, MemoryError)
BackendError = _err("BackendError", 9)
HcommTimeout = _err("HcommTimeout", 10, HcommError, TimeoutError)
AbortedError = _err("AbortedError", 11)
UnsupportedError = _err("UnsupportedError", 12)
IOError_ = _err("HcommIOError", 13, HcommError, OSError)
InternalError = _err("InternalError", 14)
PeerError = _err("PeerError", 15)
PeerLostError = _err("PeerLostError", 16)
RevokedError = _err("RevokedError", 17)
ERRORS = {c.code: c for c in (NullError, InvalidArgError, DtypeError, ShapeError, GroupError,
                              MismatchError, StateError, NoMemError, BackendError, HcommTimeout,
                              AbortedError, UnsupportedError, IOError_, InternalError,
                              PeerError, PeerLostError, RevokedError)}


def error(code, message=None):
    """The exception for result `code`; the message defaults to this thread's last C error."""
    if message is None:
        message = lib.hcomm_last_error().decode(errors="replace") or \
            lib.hcomm_strerror(code).decode()
    return ERRORS.get(code, HcommError)(message, code)


def call(fn, *args):
    """Calls C function `fn`; raises the mapped error on failure. The message is read at once,
    on this thread, because hcomm_last_error() is per thread and the next failing call
    overwrites it."""
    r = fn(*args)
    if r != 0:
        raise error(r)


# --- loading ------------------------------------------------------------------------------
_NAME = "libhcomm-c.so"


def _candidates():
    env = os.environ.get("HCOMM_LIBRARY")
    if env:  # a file, or the build directory that holds it
        p = pathlib.Path(env)
        return [p / _NAME if p.is_dir() else p]
    here = pathlib.Path(__file__).resolve().parent
    # Next to the package, the libdir cmake --install recorded, <prefix>/lib* above the
    # package, then the source tree's build/.
    out = [here / _NAME]
    try:  # cmake --install writes where it put the library
        from ._libdir import LIBDIR
        out.append(pathlib.Path(LIBDIR) / _NAME)
    except ImportError:
        pass
    for up in here.parents[:4]:
        out += [up / "lib" / _NAME, up / "lib64" / _NAME]
    out += [here.parents[1] / "build" / _NAME]
    return out


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.exists():
            return ctypes.CDLL(str(path))  # CDLL releases the GIL around every call
    try:  # the dynamic loader's own search (ld.so.cache: /usr/local/lib after ldconfig)
        return ctypes.CDLL(_NAME + ".0")
    except OSError:
        tried.append(_NAME + ".0 through the dynamic loader")
    raise ImportError("hcomm: cannot find libhcomm-c.so; looked in: " + ", ".join(tried) +
                      ". Build it (cmake --build build) and set HCOMM_LIBRARY to the build "
                      "directory or the .so, install with cmake --install, or pip install "
                      "./python with HCOMM_LIBRARY set so that it is bundled.")


lib = _load()

_P = ctypes.c_void_p
_I = ctypes.c_int
_T = ctypes.POINTER(Tensor)
_SZ = ctypes.c_size_t
PROTOS = {
    "hcomm_strerror": (ctypes.c_char_p, [_I]),
    "hcomm_result_name": (ctypes.c_char_p, [_I]),
    "hcomm_last_error": (ctypes.c_char_p, []),
    "hcomm_comm_rank": (_I, [_P, ctypes.POINTER(_I)]),
    "hcomm_comm_size": (_I, [_P, ctypes.POINTER(_I)]),
    "hcomm_comm_members": (_I, [_P, ctypes.POINTER(_I), _I]),
    "hcomm_comm_backend": (_I, [_P, ctypes.POINTER(ctypes.c_char_p)]),
    "hcomm_comm_abort": (_I, [_P]),
    "hcomm_comm_set_timeout": (_I, [_P, ctypes.c_double]),
    "hcomm_mem_free": (_I, [_P]),
    "hcomm_barrier": (_I, [_P]),
    "hcomm_all_reduce": (_I, [_P, _P, _P, _SZ, _I, _I]),
    "hcomm_broadcast": (_I, [_P, _P, _SZ, _I]),
    "hcomm_launch": (_I, [ctypes.c_char_p, _I, RANK_FN, _P]),
    "hcomm_ctx_create": (_I, [_P, ctypes.POINTER(ParallelConfig), ctypes.POINTER(_P)]),
    "hcomm_ctx_destroy": (_I, [_P]),
    "hcomm_ctx_group": (_I, [_P, _I, ctypes.POINTER(_P)]),
    "hcomm_ctx_config": (_I, [_P, ctypes.POINTER(ParallelConfig)]),
    "hcomm_plan_groups": (_I, [ctypes.POINTER(ParallelConfig), _I, _I,
                               ctypes.POINTER(GroupList)]),
    "hcomm_parallel_config_resolve": (_I, [ctypes.POINTER(ParallelConfig), _I,
                                       ctypes.POINTER(ParallelConfig)]),
    "hcomm_group_list_free": (_I, [ctypes.POINTER(GroupList)]),
    "hcomm_group_kind_name": (_I, [_I, ctypes.POINTER(ctypes.c_char_p)]),
    "hcomm_tp_all_reduce": (_I, [_P, _T, _T, _I]),
    "hcomm_tp_all_gather": (_I, [_P, _T, _T, _I]),
    "hcomm_tp_reduce_scatter": (_I, [_P, _T, _T, _I, _I]),
    "hcomm_tp_split": (_I, [_P, _T, _T, _I]),
    "hcomm_pp_send": (_I, [_P, _T, _I, _I]),
    "hcomm_pp_recv": (_I, [_P, _T, _I, _I]),
    "hcomm_pp_recv_any": (_I, [_P, _I, _I, _T]),
    "hcomm_pp_send_recv": (_I, [_P, _T, _I, _I, _T, _I, _I]),
    "hcomm_pp_isend": (_I, [_P, _T, _I, _I, ctypes.POINTER(_P)]),
    "hcomm_pp_irecv": (_I, [_P, _T, _I, _I, ctypes.POINTER(_P)]),
    "hcomm_pp_irecv_any": (_I, [_P, _I, _I, _T, ctypes.POINTER(_P)]),
    "hcomm_pp_wait": (_I, [_P]),
    "hcomm_pp_group_start": (_I, [_P]),
    "hcomm_pp_group_end": (_I, [_P]),
    "hcomm_moe_dispatch": (_I, [_P, _T, _P, _I, ctypes.POINTER(_P)]),
    "hcomm_moe_dispatch_topk": (_I, [_P, _T, _P, _P, _I, _I, ctypes.POINTER(MoeOptions),
                                     ctypes.POINTER(_P)]),
    "hcomm_moe_received": (_I, [_P, _T, _P]),
    "hcomm_moe_expert_offsets": (_I, [_P, _P]),
    "hcomm_moe_combine": (_I, [_P, _T, _T]),
    "hcomm_moe_combine_bwd": (_I, [_P, _T, _T]),
    "hcomm_moe_dispatch_bwd": (_I, [_P, _T, _T]),
    "hcomm_moe_combine_topk": (_I, [_P, _T, _T]),
    "hcomm_moe_combine_topk_bwd": (_I, [_P, _T, _T, _P]),
    "hcomm_moe_dispatch_topk_bwd": (_I, [_P, _T, _T]),
    "hcomm_moe_handle_free": (_I, [_P]),
    "hcomm_dp_all_reduce_grads": (_I, [_P, _T, _I, _I, _SZ]),
    "hcomm_dp_reducer_create": (_I, [_P, _T, _I, _I, _SZ, ctypes.POINTER(_P)]),
    "hcomm_dp_reducer_mark_ready": (_I, [_P, _I]),
    "hcomm_dp_reducer_finish": (_I, [_P, ctypes.POINTER(ctypes.c_double)]),
    "hcomm_dp_reducer_destroy": (_I, [_P]),
    "hcomm_reduce": (_I, [_P, _P, _P, _SZ, _I, _I, _I]),
    "hcomm_all_to_allv": (_I, [_P, _P, _P, _P, _P, _P, _P]),
    "hcomm_iall_reduce": (_I, [_P, _P, _P, _SZ, _I, _I, ctypes.POINTER(_P)]),
    "hcomm_ibroadcast": (_I, [_P, _P, _SZ, _I, ctypes.POINTER(_P)]),
    "hcomm_ireduce": (_I, [_P, _P, _P, _SZ, _I, _I, _I, ctypes.POINTER(_P)]),
    "hcomm_iall_to_allv": (_I, [_P, _P, _P, _P, _P, _P, _P, ctypes.POINTER(_P)]),
    "hcomm_wait": (_I, [_P]),
    "hcomm_test": (_I, [_P, ctypes.POINTER(_I)]),
    "hcomm_tp_iall_reduce": (_I, [_P, _T, _T, _I, ctypes.POINTER(_P)]),
    "hcomm_tp_iall_gather": (_I, [_P, _T, _T, _I, ctypes.POINTER(_P)]),
    "hcomm_tp_ireduce_scatter": (_I, [_P, _T, _T, _I, _I, ctypes.POINTER(_P)]),
    # fault.h, and the domain calls that recover (hcomm.Group.revoke, hcomm.fault_stop, ...)
    "hcomm_comm_destroy": (_I, [_P]),
    "hcomm_comm_revoke": (_I, [_P]),
    "hcomm_comm_agree": (_I, [_P, ctypes.POINTER(_I)]),
    "hcomm_comm_shrink": (_I, [_P, ctypes.POINTER(_P)]),
    "hcomm_comm_lost": (_I, [_P, ctypes.POINTER(_I), _I, ctypes.POINTER(_I)]),
    "hcomm_fault_stop": (_I, [_P]),
    "hcomm_ctx_revoke": (_I, [_P]),
    "hcomm_ctx_rebuild": (_I, [_P, _P, ctypes.POINTER(_P)]),
    "hcomm_ctx_world": (_I, [_P, ctypes.POINTER(_P)]),
}
for _region in ("copy_to", "reduce_from"):
    for _dir in ("fwd", "bwd"):
        PROTOS[f"hcomm_tp_{_region}_{_dir}"] = (_I, [_P, _T, _T])
for _region in ("scatter_to", "gather_from"):
    for _dir in ("fwd", "bwd"):
        PROTOS[f"hcomm_tp_{_region}_{_dir}"] = (_I, [_P, _T, _T, _I])
for _h in ("send_forward", "send_backward", "recv_forward", "recv_backward"):
    PROTOS["hcomm_pp_" + _h] = (_I, [_P, _T, _I])
for _h in ("send_forward_recv_backward", "send_backward_recv_forward",
           "send_forward_recv_forward", "send_backward_recv_backward"):
    PROTOS["hcomm_pp_" + _h] = (_I, [_P, _T, _T, _I])
for _name, (_res, _args) in PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args



def raw(name):
    """C function `name` without argtypes, for the hot paths (hcomm.tp): ctypes then passes
    the arguments as they are, c_void_p and byref() objects and ints (as C int), without the
    per-argument conversion that costs about 0.3 us each. The caller passes exactly the C
    types; the prototype above documents them."""
    f = lib[name]  # a new function object: the declared one keeps its argtypes
    f.restype = PROTOS[name][0]
    return f


# Backends this build has: hcomm_comm_wrap_mpi exists only when the mpi backend is built.
BACKENDS = ("local", "mpi") if hasattr(lib, "hcomm_comm_wrap_mpi") else ("local",)

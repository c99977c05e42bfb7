"""hcomm for Python: the C library's communication primitives on numpy arrays and torch CPU
tensors, zero-copy through ctypes. Python calls C; nothing is implemented twice.

    import hcomm
    from hcomm import tp, pp, moe

    def rank():
        ctx = hcomm.init_context(tp_size=2, pp_size=2, dp_size=2)
        y = tp.all_reduce(x, group=ctx.tp)
    hcomm.launch(rank, nranks=8)  # threads; or: /usr/bin/python3 -m hcomm.run -n 8 script.py
"""
from . import _lib
from ._lib import (BACKENDS, AbortedError, BackendError, DtypeError, GroupError, HcommError,
                   HcommTimeout, InternalError, InvalidArgError, MismatchError, NoMemError,
                   NullError, PeerError, PeerLostError, RevokedError, ShapeError,
                   StateError, UnsupportedError)
from ._world import Group, get_rank, get_world_size, launch, under_mpirun, world
from .context import Context, init_context, init_tensor_parallel_group, plan
from ._work import Work
from .fault import fault_stop
from .collectives import (all_gather_into_tensor, all_reduce, all_to_all, all_to_all_single,
                          barrier, broadcast, reduce, reduce_scatter_tensor)
from . import dp, moe, pp, tp  # noqa: E402  (after the names they import)

HcommIOError = _lib.IOError_
__version__ = "0.1.0"
__all__ = ["AbortedError", "BACKENDS", "BackendError", "Context", "DtypeError", "Group",
           "GroupError", "HcommError", "HcommIOError", "HcommTimeout", "InternalError",
           "InvalidArgError", "MismatchError", "NoMemError", "NullError", "PeerError",
           "PeerLostError", "RevokedError",
           "ShapeError", "StateError", "UnsupportedError", "Work", "all_gather_into_tensor",
           "all_reduce", "all_to_all", "all_to_all_single", "reduce_scatter_tensor", "barrier",
           "broadcast", "dp", "fault_stop", "get_rank", "get_world_size", "init_context",
           "init_tensor_parallel_group", "launch", "moe", "plan", "pp", "reduce", "tp",
           "under_mpirun", "world"]

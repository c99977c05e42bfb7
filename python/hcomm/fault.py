"""Going on after a lost rank (hcomm/fault.h, with ULFM's meaning: MPIX_Comm_revoke,
MPIX_Comm_agree, MPIX_Comm_shrink). A rank whose process died (mpi) or whose thread called
fault_stop() (local) is noticed by every peer waiting on it, or in a collective of a group it
belongs to, within HCOMM_FAILURE_DETECT seconds (default 2): the call raises
hcomm.PeerLostError naming the lost rank. A rank that is alive but slow is never declared lost
(only HCOMM_TIMEOUT applies to it). Recovery, as ULFM writes it:

    try:
        ctx.dp.all_reduce(grads)
    except (hcomm.PeerLostError, hcomm.RevokedError):
        ctx.revoke()                       # release the peers waiting in any of its groups
        _, lost = ctx.world.agree()        # every survivor learns it in the same call
        shrunk = ctx.world.shrink()        # the survivors, in the old rank order
        ctx = ctx.rebuild(shrunk)          # dp - 1 replicas; None: my replica was dropped

Where it works: the local backend, and mpi with every process on one host, started with
`mpirun --enable-recovery` (mpirun then exits 0 whatever its processes return: print your own
outcome). Elsewhere agree() and shrink() raise hcomm.UnsupportedError: restart from a
checkpoint (scripts/hcomm-restart.sh)."""
from . import _lib, _world
from ._lib import lib


def fault_stop(group=None):
    """Test hook: this rank stops for good, as a crash would (hcomm_fault_stop). local: the
    rank is marked lost, the thread blocks until every other rank's function has returned, then
    this raises hcomm.PeerLostError, which ends the rank quietly: hcomm.launch does not count
    it as failed and returns None for it. Let it propagate (the rank's groups are freed alone
    at its end). mpi: the process sends itself SIGKILL and never returns. `group`: any group
    of this rank (default: the world)."""
    what = "hcomm.fault_stop"
    g = _world.world() if group is None else group
    if not isinstance(g, _world.Group):
        raise TypeError(f"{what}: group must be an hcomm.Group, not {type(g).__name__}")
    ptr = g.ptr(what)
    _world._state.stopped = True
    r = lib.hcomm_fault_stop(ptr)
    if r != _lib.PeerLostError.code:  # the rank did not stop: it is no lost rank then
        _world._state.stopped = False
    raise _lib.error(r) if r else _lib.InternalError(f"{what}: returned without stopping")

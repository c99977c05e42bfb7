"""Ranks and groups: hcomm.launch runs a function on every rank through hcomm_launch, and each
rank thread finds its world communicator and context in a threading.local."""
import ctypes
import os
import threading
import weakref

from . import _lib
from ._lib import call, lib

# Per rank thread: .world (Group), .contexts (list), .ctx (the current one), .routings (the
# live handles that keep a group, MoE routings and DP reducers, freed before their groups).
_state = threading.local()
_launching = threading.Lock()
# hcomm.dp, which Group.all_reduce and Group.reducer call. It sets this itself when imported (the
# package imports it with the others), so that this module imports none of the modules above it.
_dp = None


def register_dp(module):
    """Called once by hcomm.dp with itself: the module Group's DP shortcuts forward to."""
    global _dp
    _dp = module


def dead(what, name, why):
    """The StateError of a call on an object that was freed: names the object and why."""
    return _lib.StateError(f"{what}: {name} was destroyed ({why}); create a new one")


class Group:
    """A communicator: `rank`, `size`, `ranks` (world ranks of the members, in member order)
    and `backend`. Groups of a context belong to it and die with it (ctx.destroy()); the world
    belongs to hcomm.launch and dies when it returns; a group from shrink() is the caller's
    (destroy()). revoke, agree, lost and shrink go on after a lost rank (hcomm.fault). Every
    call on a dead group raises hcomm.StateError naming it: its C pointer is then NULL, which
    every C call refuses, so a stale group cannot reach freed memory even on the calls that
    skip the Python check."""

    def __init__(self, ptr, name="world"):
        self._ptr = ptr
        self._vp = ctypes.c_void_p(ptr)  # as _lib.raw functions take it
        self._why = None  # why it died, once it has
        self.name = name
        # Who frees it: None for a group the caller owns (Group.shrink), else the owner named
        # in destroy()'s refusal.
        self._owner = "hcomm.launch (it is the world of this rank)"
        r, s = ctypes.c_int(), ctypes.c_int()
        call(lib.hcomm_comm_rank, ptr, ctypes.byref(r))
        call(lib.hcomm_comm_size, ptr, ctypes.byref(s))
        self.rank, self.size = r.value, s.value
        members = (ctypes.c_int * self.size)()
        call(lib.hcomm_comm_members, ptr, members, self.size)
        self.ranks = list(members)
        b = ctypes.c_char_p()
        call(lib.hcomm_comm_backend, ptr, ctypes.byref(b))
        self.backend = b.value.decode()

    def __repr__(self):
        state = f" (destroyed: {self._why})" if self._why else ""
        return f"<hcomm.Group {self.name} rank {self.rank} of {self.size} {self.ranks}{state}>"

    def kill(self, why):
        """Marks the group dead (its communicator is being freed by its owner)."""
        self._why = why
        self._ptr = None
        self._vp = ctypes.c_void_p()

    def ptr(self, what):
        """The C pointer for call `what`; StateError naming the group when it is dead."""
        if self._ptr is None:
            raise self.dead(what)
        return self._ptr

    def dead(self, what):
        return dead(what, f"group {self.name!r}", self._why)

    def fail(self, what, r):
        """The exception for C result r of call `what` on this group."""
        return self.dead(what) if self._ptr is None else _lib.error(r)

    def barrier(self):
        call(lib.hcomm_barrier, self.ptr("hcomm.Group.barrier"))

    def set_timeout(self, seconds):
        call(lib.hcomm_comm_set_timeout, self.ptr("hcomm.Group.set_timeout"), float(seconds))

    def all_reduce(self, grads, op="sum", bucket_bytes=0, async_op=False):
        """Reduces `grads` in place over this group with hcomm_dp_all_reduce_grads (bucketed,
        one all_reduce per bucket) and returns them; op 'sum' (default, as tp.all_reduce with
        group=this group) or 'avg'. `grads`: a tensor, a list of tensors, or torch parameters
        (their .grad is reduced; those without one are skipped). No autograd (see hcomm.dp).
        async_op=True returns a work handle (hcomm.Work) whose wait() returns `grads`."""
        return _dp.all_reduce_grads(grads, op=op, bucket_bytes=bucket_bytes, group=self,
                                    async_op=async_op)

    # --- going on after a lost rank (fault.h; ULFM's meaning) ---

    def revoke(self):
        """Revokes the group (hcomm_comm_revoke, ULFM's MPIX_Comm_revoke): every pending and
        later call on it fails with hcomm.RevokedError on this rank and on every live member.
        agree(), shrink() and destroy() still work on it. Local; a second revoke does nothing.
        The way a rank that saw hcomm.PeerLostError releases peers waiting on it."""
        call(lib.hcomm_comm_revoke, self.ptr("hcomm.Group.revoke"))

    def agree(self, flag=1):
        """Fault-tolerant agreement (hcomm_comm_agree, ULFM's MPIX_Comm_agree): returns
        (value, lost), value the bitwise AND of every live member's int `flag`, the same on
        every survivor even when members are lost before or during the call, and lost True
        when a member was found lost (C's HCOMM_ERR_PEER_LOST with the flag still agreed: not
        an exception here, so every survivor learns it in the same call). Collective over the
        live members, revoked or not, in the same order as their other agree() and shrink()
        calls on the group. Raises hcomm.UnsupportedError (mpi: members on several hosts),
        hcomm.HcommTimeout (a live member did not call it)."""
        if not isinstance(flag, int) or isinstance(flag, bool) or \
                not -2**31 <= flag < 2**31:
            raise ValueError(f"hcomm.Group.agree: flag must be a C int, not {flag!r}")
        v = ctypes.c_int(flag)
        r = lib.hcomm_comm_agree(self.ptr("hcomm.Group.agree"), ctypes.byref(v))
        if r not in (0, _lib.PeerLostError.code):
            raise self.fail("hcomm.Group.agree", r)
        return v.value, r != 0

    def lost(self):
        """The members known lost now, as ranks in this group, ascending (hcomm_comm_lost).
        Local; a member found lost stays lost."""
        ptr = self.ptr("hcomm.Group.lost")
        ranks, n = (ctypes.c_int * self.size)(), ctypes.c_int()
        call(lib.hcomm_comm_lost, ptr, ranks, self.size, ctypes.byref(n))
        return list(ranks[:min(n.value, self.size)])

    def shrink(self):
        """A new group of the live members, in this group's rank order, the same on every
        survivor (hcomm_comm_shrink, ULFM's MPIX_Comm_shrink); a member lost while it runs is
        left out. Collective over the live members (revoked or not), ordered with agree().
        The caller owns the new group: free it with destroy() (hcomm.launch frees the ones
        left at the end of the rank, after the contexts)."""
        out = ctypes.c_void_p()
        call(lib.hcomm_comm_shrink, self.ptr("hcomm.Group.shrink"), ctypes.byref(out))
        try:
            g = Group(out.value, f"shrink of {self.name}")
        except BaseException:
            lib.hcomm_comm_destroy(out)
            raise
        g._owner = None
        owned = getattr(_state, "owned", None)
        if owned is not None:
            owned.append(g)
        return g

    def destroy(self):
        """Frees a group the caller owns (one from shrink()). Collective over the group; no
        call may be in flight on it. The world and a context's groups belong to their owner:
        hcomm.StateError naming it. Afterwards every call on the group raises
        hcomm.StateError."""
        what = "hcomm.Group.destroy"
        ptr = self.ptr(what)
        if self._owner is not None:
            raise _lib.StateError(f"{what}: group {self.name!r} belongs to {self._owner}; only "
                                  f"a group from Group.shrink() is destroyed by its caller")
        call(lib.hcomm_comm_destroy, ptr)
        self.kill("Group.destroy() freed it")
        owned = getattr(_state, "owned", None)
        if owned and self in owned:
            owned.remove(self)

    def reducer(self, grads, op="avg", bucket_bytes=0, find_unused_parameters=False):
        """A DDP-style hcomm.dp.Reducer over this group: buckets reduced during backward as
        their gradients are marked ready (see hcomm.dp.Reducer). Collective."""
        return _dp.Reducer(grads, op=op, bucket_bytes=bucket_bytes, group=self,
                           find_unused_parameters=find_unused_parameters)


def _rank_state():
    return getattr(_state, "world", None)


def world():
    """This rank's world group (inside hcomm.launch or hcomm.run)."""
    w = _rank_state()
    if w is None:
        raise RuntimeError("hcomm: no world on this thread; run the code inside "
                           "hcomm.launch(fn, nranks=N) or python3 -m hcomm.run -n N script.py")
    return w


def get_rank(group=None):
    """This rank's index in `group` (default: the world), as torch.distributed.get_rank."""
    g = world() if group is None else group
    g.ptr("hcomm.get_rank")
    return g.rank


def get_world_size(group=None):
    """The number of ranks in `group` (default: the world)."""
    g = world() if group is None else group
    g.ptr("hcomm.get_world_size")
    return g.size


def under_mpirun():
    """True when mpirun/srun started this process (Open MPI, MPICH/PMI or Slurm variables)."""
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def check_backend(backend):
    if backend is not None and backend not in _lib.BACKENDS:
        raise ValueError(f"hcomm: backend {backend!r} is not built; this build has "
                         f"{', '.join(_lib.BACKENDS)}")


def _frees():
    """What a rank holds at its end, in the order it is freed: its MoE handles, then its
    contexts, then the groups it owns (Group.shrink), newest first."""
    st = _state
    return ([r.free for r in list(getattr(st, "routings", None) or ())] +
            [c.destroy for c in reversed(list(getattr(st, "contexts", None) or []))] +
            [g.destroy for g in reversed(list(getattr(st, "owned", None) or []))])


def destroy_all():
    """End of a rank: frees what it holds (_frees; collective, in one order)."""
    for free in _frees():
        free()


def _note(exc, rank, n):
    exc.rank = rank
    exc.add_note(f"hcomm.launch: raised on rank {rank} of {n}")
    return exc


def _free_stopped():
    """Frees what a rank that hcomm.fault_stop stopped still holds, alone (every other rank
    has returned), as a crashed rank's would be by the process's end: errors say nothing."""
    for free in _frees():
        try:
            free()
        except _lib.HcommError:
            pass


def launch(fn, nranks=None, args=(), backend=None):
    """Runs fn(*args) on every rank and returns the list of the ranks' return values, in rank
    order. backend "local": nranks threads of this process (the C calls release the GIL, so
    ranks run in parallel); "mpi": this process is one rank of the mpirun job and the list
    holds its own value only. None: "mpi" under mpirun, else HCOMM_BACKEND, else "local".
    An exception on a rank aborts the others (their waits fail) and is raised here, with the
    rank named in its notes and in `exc.rank`. A rank stopped by hcomm.fault_stop is no
    failure: the hcomm.PeerLostError it raises ends it quietly and its value is None."""
    if backend is None:
        backend = "mpi" if under_mpirun() and "mpi" in _lib.BACKENDS else \
            os.environ.get("HCOMM_BACKEND", "local")
    check_backend(backend)
    if backend == "local" and (nranks is None or nranks < 1):
        raise ValueError(f"hcomm.launch: nranks must be >= 1 on the local backend, not {nranks}")
    if _rank_state() is not None:
        raise RuntimeError("hcomm.launch: called from inside a rank; worlds do not nest")
    results, errors, size = {}, {}, [0]

    def body(comm, _arg):
        w = Group(comm)
        size[0] = w.size
        _state.world, _state.contexts, _state.ctx = w, [], None
        _state.routings, _state.owned, _state.stopped = weakref.WeakSet(), [], False
        try:
            results[w.rank] = fn(*args)
            if _state.stopped:  # it caught hcomm.fault_stop's error: its peers are gone
                _free_stopped()
            else:
                destroy_all()  # collective: every rank frees its contexts in one order
            return 0
        except BaseException as e:  # noqa: B036 -- a rank's failure must reach the caller
            if _state.stopped and isinstance(e, _lib.PeerLostError):
                # hcomm.fault_stop's: no failure (hcomm_launch ignores a stopped rank's result)
                results[w.rank] = None
                _free_stopped()
                return e.code
            errors[w.rank] = e
            return e.code if isinstance(e, _lib.HcommError) else _lib.InternalError.code
        finally:
            _state.world = _state.contexts = _state.ctx = _state.routings = None
            _state.owned, _state.stopped = None, False
            w.kill("its hcomm.launch returned")

    cb = _lib.RANK_FN(body)  # kept alive in this frame for the whole launch
    with _launching:
        r = lib.hcomm_launch(backend.encode(), nranks or 0, cb, None)
    if errors:
        # The first rank with its own failure, not one aborted because of another rank.
        secondary = (_lib.AbortedError, _lib.PeerError)
        rank = min(errors, key=lambda k: (isinstance(errors[k], secondary), k))
        raise _note(errors[rank], rank, nranks or size[0])
    if r != 0:
        raise _lib.error(r)
    return [results[k] for k in sorted(results)]

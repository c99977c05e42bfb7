"""The domain context (every parallel group of a job, hcomm_ctx_create) and the layout plan
(hcomm_plan_groups, no communication)."""
import ctypes

from . import _lib, _world
from ._lib import ParallelConfig, call, lib
from ._world import destroy_all  # noqa: F401  (hcomm.context.destroy_all, as before)

# hcomm_group_kind_t, in the C enum's order; the attribute names of a Context.
KINDS = ("tp", "pp", "dp", "cp", "dp_cp", "tp_pp", "ep", "etp", "edp", "embedding",
         "dp_shard", "dp_replicate", "edp_shard", "edp_replicate")


def _config(tp, pp, dp, cp, ep, etp, num_experts, order, dp_shard=None):
    for name, v in (("tp_size", tp), ("pp_size", pp), ("dp_size", dp), ("cp_size", cp),
                    ("ep_size", ep), ("etp_size", etp), ("num_experts", num_experts),
                    ("dp_shard_size", dp_shard)):
        if v is not None and (not isinstance(v, int) or v < 0):
            raise ValueError(f"hcomm: {name} must be a non-negative int, not {v!r}")
    return ParallelConfig(tp or 0, pp or 0, dp or 0, cp or 0, ep or 0, etp or 0,
                          num_experts or 0, order.encode() if order else None, dp_shard or 0)


class Context:
    """A rank's view of every group of the job: ctx.tp, ctx.pp, ctx.dp, ctx.cp, ctx.dp_cp,
    ctx.tp_pp, ctx.ep, ctx.etp, ctx.edp, the sharded-DP groups ctx.dp_shard, ctx.dp_replicate,
    ctx.edp_shard, ctx.edp_replicate (hcomm.Group each) and ctx.embedding (None on the middle
    pipeline stages). ctx.config is the resolved configuration as a dict. After a lost rank:
    ctx.revoke(), then ctx.rebuild(ctx.world.shrink()) (hcomm.fault)."""

    def __init__(self, world, cfg):
        self.world = world
        self._owns_world = False
        ptr = ctypes.c_void_p()
        r = lib.hcomm_ctx_create(world.ptr("hcomm.init_context"), ctypes.byref(cfg),
                                 ctypes.byref(ptr))
        if r == _lib.StateError.code and current() is not None:
            raise _lib.StateError(f"hcomm.init_context: this world already holds a context "
                                  f"({current()!r}); call ctx.destroy() first")
        if r:
            raise _lib.error(r)
        self._adopt(ptr)

    @classmethod
    def wrap(cls, ptr, world=None):
        """A Context over an existing C hcomm_ctx_t pointer, which it then owns (destroy()
        frees it). `world`: the hcomm.Group it was built on, owned by someone else; None: the
        context owns its world (hcomm_ctx_world, as after hcomm_ctx_rebuild), which becomes
        ctx.world and dies with it. Not registered with the rank (see Context.rebuild)."""
        self = cls.__new__(cls)
        self.world, self._owns_world, self._ptr = world, world is None, None
        if world is None:
            w = ctypes.c_void_p()
            r = lib.hcomm_ctx_world(ptr, ctypes.byref(w))
            if r:
                lib.hcomm_ctx_destroy(ptr)
                raise _lib.error(r)
            try:
                self.world = _world.Group(w.value, "world")
            except BaseException:
                lib.hcomm_ctx_destroy(ptr)
                raise
            self.world._owner = "its context (ctx.destroy() frees it)"
        self._adopt(ptr)
        return self

    def _adopt(self, ptr):
        self._ptr = ptr
        try:  # nothing of a failed init stays behind
            self._groups(ptr)
        except BaseException:
            lib.hcomm_ctx_destroy(ptr)
            self._ptr = None
            if self._owns_world:
                self.world.kill("its context failed to initialise")
            raise

    def _groups(self, ptr):
        for kind, name in enumerate(KINDS):
            g = ctypes.c_void_p()
            r = lib.hcomm_ctx_group(ptr, kind, ctypes.byref(g))
            if r == _lib.GroupError.code:  # embedding on a middle stage
                setattr(self, name, None)
                continue
            if r != 0:
                raise _lib.error(r)
            setattr(self, name, _world.Group(g.value, name))
            getattr(self, name)._owner = "its context (ctx.destroy() frees it)"
        res = ParallelConfig()
        call(lib.hcomm_ctx_config, ptr, ctypes.byref(res))
        self.config = {f: getattr(res, f) for f, _ in ParallelConfig._fields_}
        self.config["order"] = res.order.decode()

    def __repr__(self):
        state = " (destroyed)" if self._ptr is None else ""
        return f"<hcomm.Context rank {self.world.rank} {self.config}{state}>"

    @property
    def alive(self):
        return self._ptr is not None

    def _live(self, what):
        if self._ptr is None:
            raise _lib.StateError(f"{what}: this context was destroyed (ctx.destroy()); "
                                  f"create a new one")
        return self._ptr

    def revoke(self):
        """Revokes every group of the context and the world it was built on
        (hcomm_ctx_revoke; Group.revoke, ULFM's MPIX_Comm_revoke, on each): every pending and
        later call on them fails with hcomm.RevokedError on every live member. The way a rank
        that saw hcomm.PeerLostError releases the peers that wait on it in any group. Local."""
        call(lib.hcomm_ctx_revoke, self._live("hcomm.Context.revoke"))

    def rebuild(self, shrunk):
        """The context rebuilt on `shrunk`, the survivors of its world (world.shrink()), by
        hcomm_ctx_rebuild: the same tp, pp, ep, cp and order, dp lowered to the data-parallel
        replicas that kept every member, ranks in their old order. Returns the new Context,
        made current and freed by hcomm.launch at the end of the rank like init_context's; it
        owns its world (ctx.world). Returns None on the survivors of a replica that lost a
        member: they are not in it and should end. Destroy this context too, on every
        survivor (hcomm.launch does at the end of the rank). Collective over `shrunk`.
        Raises hcomm.StateError (no replica kept every member: restart from a checkpoint),
        hcomm.InvalidArgError (the smaller dp does not fit the config)."""
        what = "hcomm.Context.rebuild"
        if not isinstance(shrunk, _world.Group):
            raise TypeError(f"{what}: shrunk must be an hcomm.Group, not "
                            f"{type(shrunk).__name__}")
        out = ctypes.c_void_p()
        call(lib.hcomm_ctx_rebuild, self._live(what), shrunk.ptr(what), ctypes.byref(out))
        if not out.value:
            return None
        ctx = Context.wrap(out.value)
        st = _world._state
        if getattr(st, "contexts", None) is not None:
            st.contexts.append(ctx)
            st.ctx = ctx
        return ctx

    def destroy(self):
        """Frees the context and its groups. Collective over the world. Pending work handles
        on its groups are completed first, MoE routings and DP reducers freed; afterwards every
        call on its groups raises hcomm.StateError. A second destroy() does nothing."""
        if self._ptr is None:
            return
        mine = {id(getattr(self, k)) for k in KINDS}
        for r in list(getattr(_world._state, "routings", ())):
            if id(r.group) in mine:  # a handle keeps its group: complete or free it first
                r.free()
        call(lib.hcomm_ctx_destroy, self._ptr)
        self._ptr = None
        for k in KINDS:
            if getattr(self, k) is not None:
                getattr(self, k).kill("ctx.destroy() freed it with its context")
        if self._owns_world:
            self.world.kill("ctx.destroy() freed it with its context")
        st = _world._state
        if getattr(st, "contexts", None) and self in st.contexts:
            st.contexts.remove(self)
        if getattr(st, "ctx", None) is self:
            st.ctx = st.contexts[-1] if st.contexts else None


def init_context(tp_size=1, pp_size=1, dp_size=None, cp_size=1, ep_size=1, etp_size=None,
                 order="tp-cp-ep-dp-pp", backend=None, num_experts=0, dp_shard_size=None):
    """Builds every group of the job (Megatron-Core order) over this rank's world and makes it
    the current context (the default group of hcomm.tp/pp/moe calls). Collective over the
    world. dp_size None: world / (tp*pp*cp). dp_shard_size None: dp (no HSDP); else the shard
    group's DP size, the rest of dp replicating (ctx.dp_shard, ctx.dp_replicate; hcomm.zero).
    backend: None, or the backend the world runs on ('local' or 'mpi'); one this build lacks
    is a ValueError naming the built ones."""
    _world.check_backend(backend)
    w = _world.world()
    if backend is not None and backend != w.backend:
        raise ValueError(f"hcomm.init_context: backend {backend!r} asked for, but this world "
                         f"runs on {w.backend!r} (choose it in hcomm.launch or hcomm.run)")
    ctx = Context(w, _config(tp_size, pp_size, dp_size, cp_size, ep_size, etp_size,
                             num_experts, order, dp_shard_size))
    _world._state.contexts.append(ctx)
    _world._state.ctx = ctx
    return ctx


def init_tensor_parallel_group(tp_rank=None, tp_size=1):
    """Megatron-style shortcut: a context with TP groups of tp_size (every other rank in DP),
    made current, returning its TP group. Collective over the world.

    tp_rank is accepted as the brief writes it (`tp_rank=0` on every rank, or
    `tp_rank=get_rank() % tp_size`) and does not choose anything: a rank's index in its TP
    group follows from its world rank (world rank % tp_size, Megatron's layout) and is the
    returned group's `.rank`. It must be an int in 0..tp_size-1 (a ValueError before any
    communication otherwise)."""
    if tp_rank is not None and (not isinstance(tp_rank, int) or
                                not 0 <= tp_rank < max(tp_size, 1)):
        raise ValueError(f"hcomm.init_tensor_parallel_group: tp_rank={tp_rank!r} outside "
                         f"0..{tp_size - 1}")
    return init_context(tp_size=tp_size).tp


def current():
    """The current context of this rank, or None."""
    return getattr(_world._state, "ctx", None)


def default_group(kind, group):
    """`group` if given, else the current context's group of `kind`, else the world."""
    if group is not None:
        if not isinstance(group, _world.Group):
            raise TypeError(f"hcomm: group must be an hcomm.Group, not {type(group).__name__}")
        if group._ptr is None:
            raise group.dead(f"hcomm.{kind}")
        return group
    ctx = current()
    return getattr(ctx, kind) if ctx is not None else _world.world()


def plan(world, tp=1, pp=1, dp=None, cp=1, ep=1, etp=None, num_experts=0, order=None,
         dp_shard=None):
    """The layout hcomm-plan prints, without launching: {kind: [[world ranks] per group]} for
    every kind, plus "config" (the resolved sizes). `world` is the world size (an int) or a
    Group."""
    n = world.size if isinstance(world, _world.Group) else world
    if not isinstance(n, int):
        raise TypeError(f"hcomm.plan: world must be an int or an hcomm.Group, not {world!r}")
    cfg = _config(tp, pp, dp, cp, ep, etp, num_experts, order, dp_shard)
    res = ParallelConfig()
    call(lib.hcomm_parallel_config_resolve, ctypes.byref(cfg), n, ctypes.byref(res))
    out = {"config": {f: getattr(res, f) for f, _ in ParallelConfig._fields_}}
    out["config"]["order"] = res.order.decode()
    for kind, name in enumerate(KINDS):
        gl = _lib.GroupList()
        call(lib.hcomm_plan_groups, ctypes.byref(cfg), n, kind, ctypes.byref(gl))
        try:
            s = gl.group_size
            out[name] = [[gl.ranks[g * s + i] for i in range(s)] for g in range(gl.num_groups)]
        finally:
            lib.hcomm_group_list_free(ctypes.byref(gl))
    return out

"""Going on after a lost rank (hcomm.fault_stop, Group.revoke/agree/lost/shrink/destroy,
Context.revoke/rebuild) on the local backend: one rank stops for good; its peers see
hcomm.PeerLostError from the collectives it belongs to, revoke, agree, shrink, rebuild with one
DP replica fewer and reduce on the new context; hcomm.launch does not count the stopped rank
as failed. Bounded by HCOMM_TIMEOUT (conftest) and, per test, by faulthandler, which ends the
process with every thread's stack if a test outlives it."""
import faulthandler
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hcomm
from conftest import run

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _bound():
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _reduce(group, value):
    x = np.array([value], np.int64)
    hcomm.all_reduce(x, group=group)
    return int(x[0])


def _recover(p, victim):
    """tp 2 x dp p/2; `victim` stops after the context is built. Returns what each survivor
    saw, for the caller to check against the serial answer."""
    ctx = hcomm.init_context(tp_size=2)
    me, seen = hcomm.get_rank(), {}
    if me == victim:
        hcomm.fault_stop()
    # The DP group of my TP position holds the victim when its TP position is mine.
    try:
        seen["dp_sum"] = _reduce(ctx.dp, me)
    except hcomm.PeerLostError as e:
        seen["dp_lost"] = str(e)
    try:
        hcomm.barrier()
        seen["barrier"] = "ok"
    except hcomm.PeerLostError:
        seen["barrier"] = "lost"
    ctx.revoke()
    with pytest.raises(hcomm.RevokedError):
        ctx.tp.barrier()
    seen["agree"] = ctx.world.agree(0b111 if me % 2 else 0b101)
    seen["lost"] = ctx.world.lost()
    shrunk = ctx.world.shrink()
    seen["shrunk"] = (shrunk.rank, shrunk.size, shrunk.ranks)
    seen["shrunk_sum"] = _reduce(shrunk, me)
    new = ctx.rebuild(shrunk)
    if new is None:
        seen["new"] = None
        return seen
    assert hcomm.context.current() is new and ctx.alive
    seen["new"] = (new.config["dp"], new.config["tp"], new.world.rank, new.world.ranks,
                   new.dp.size)
    seen["new_dp_sum"] = _reduce(new.dp, me)
    seen["new_world_sum"] = _reduce(new.world, me)
    return seen


@pytest.mark.parametrize("p,victim", [(4, 3), (4, 0), (6, 2), (6, 5)])
def test_lost_rank_recovery(p, victim):
    res = run(_recover, p, p, victim)
    assert len(res) == p and res[victim] is None  # stopped: no failure, no value
    kept = [r for r in range(p) if r // 2 != victim // 2]  # replicas that kept every member
    survivors = [r for r in range(p) if r != victim]
    for me in survivors:
        s = res[me]
        if me % 2 == victim % 2:
            assert "dp_lost" in s, (me, s)
            assert f"rank {victim}" in s["dp_lost"] or f"rank {victim // 2}" in s["dp_lost"], s
        else:
            assert s["dp_sum"] == sum(range(me % 2, p, 2)), (me, s)
        assert s["barrier"] == "lost", (me, s)
        assert s["agree"] == (0b101, True), (me, s)  # the AND over the survivors, lost seen
        assert s["lost"] == [victim], (me, s)
        assert s["shrunk"] == (survivors.index(me), p - 1, survivors), (me, s)
        assert s["shrunk_sum"] == sum(survivors), (me, s)
        if me not in kept:
            assert s["new"] is None, (me, s)
            continue
        # Members are named by their ranks in the launch world; new ranks keep the old order.
        assert s["new"] == (p // 2 - 1, 2, kept.index(me), kept, p // 2 - 1), (me, s)
        assert s["new_dp_sum"] == sum(r for r in kept if r % 2 == me % 2), (me, s)
        assert s["new_world_sum"] == sum(kept), (me, s)


def test_explicit_destroy_after_recovery():
    """The caller frees the new context, the old one and the shrunk group itself, in C's
    order; the stopped rank's result is None and the run is no failure."""
    def body():
        ctx = hcomm.init_context(tp_size=2)
        if hcomm.get_rank() == 1:
            hcomm.fault_stop(ctx.tp)
        ctx.revoke()
        assert ctx.world.agree() == (1, True)
        shrunk = ctx.world.shrink()
        new = ctx.rebuild(shrunk)
        out = None
        if new is not None:
            out = _reduce(new.dp, 1)
            new.destroy()
            with pytest.raises(hcomm.StateError, match="destroyed"):
                new.dp.barrier()
            with pytest.raises(hcomm.StateError, match="destroyed"):
                new.world.barrier()
        ctx.destroy()
        shrunk.destroy()
        with pytest.raises(hcomm.StateError, match="destroyed"):
            shrunk.shrink()
        with pytest.raises(hcomm.StateError, match="destroyed"):
            shrunk.destroy()
        return out

    assert run(body, 6) == [None, None, 2, 2, 2, 2]


def test_agree_shrink_without_loss():
    """Nobody lost: agree is the AND with lost False, shrink a copy of the group in order."""
    def body():
        me = hcomm.get_rank()
        ctx = hcomm.init_context(tp_size=2)
        v, lost = ctx.dp.agree(~(1 << me))
        s = ctx.dp.shrink()
        got = (v, lost, ctx.dp.lost(), s.ranks, s.rank, _reduce(s, me))
        s2 = s.shrink()  # left to hcomm.launch, as s is
        return got + (s2.ranks,)

    res = run(body, 4)
    for me, (v, lost, gone, ranks, rank, total) in enumerate(r[:6] for r in res):
        mates = [r for r in range(4) if r % 2 == me % 2]
        assert v == ~sum(1 << r for r in mates) and lost is False and gone == []
        assert ranks == mates and rank == mates.index(me) and total == sum(mates)
        assert res[me][6] == mates


def test_bad_input():
    def body():
        ctx = hcomm.init_context(tp_size=2)
        errs = []
        for g in (hcomm.world(), ctx.dp, ctx.world):
            with pytest.raises(hcomm.StateError) as e:
                g.destroy()
            errs.append(str(e.value))
        s = hcomm.world().shrink()
        s.destroy()
        for call in (s.shrink, s.destroy, s.revoke, s.agree, s.lost):
            with pytest.raises(hcomm.StateError, match="destroyed"):
                call()
        with pytest.raises(ValueError, match="flag"):
            ctx.dp.agree(1.5)
        with pytest.raises(TypeError, match="hcomm.Group"):
            ctx.rebuild(None)
        with pytest.raises(TypeError, match="hcomm.Group"):
            hcomm.fault_stop("world")
        ctx.destroy()
        for call in (ctx.revoke, lambda: ctx.rebuild(hcomm.world())):
            with pytest.raises(hcomm.StateError, match="destroyed"):
                call()
        with pytest.raises(hcomm.StateError, match="destroyed"):
            hcomm.fault_stop(ctx.tp)
        return errs

    for errs in run(body, 4):
        assert "'world'" in errs[0] and "hcomm.launch" in errs[0], errs
        assert "'dp'" in errs[1] and "context" in errs[1], errs
        assert "'world'" in errs[2], errs


def test_other_failures_still_reported():
    """A rank that fails for another reason after a peer stopped is still a failure."""
    def body():
        if hcomm.get_rank() == 0:
            hcomm.fault_stop()
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom") as e:
        run(body, 3)
    assert e.value.rank in (1, 2)


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
@pytest.mark.parametrize("n,victim", [(4, 3), (6, 2)])
def test_lost_process_mpirun(n, victim):
    """fault_mpi_script.py: one process per rank; the victim's process SIGKILLs itself."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60",
               HCOMM_FAILURE_DETECT="1")
    cmd = ["mpirun", "--enable-recovery", "--oversubscribe", "-np", str(n), sys.executable,
           "-m", "hcomm.run", str(HERE / "fault_mpi_script.py"), str(victim)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    out = p.stdout + p.stderr
    assert p.stdout.count("fault ok") == n - 1, out  # mpirun's status says nothing here
    for r in range(n):
        kept = r // 2 != victim // 2
        line = f"rank {r}: fault ok, " + (f"dp {n // 2 - 1} sum " if kept else "replica dropped")
        assert (line in p.stdout) == (r != victim), (r, out)


def test_stopped_rank_that_catches():
    """A stopped rank that catches fault_stop's PeerLostError and returns keeps its value; its
    context is freed alone, without failing the run."""
    def body():
        hcomm.init_context(tp_size=2)
        if hcomm.get_rank() == 2:
            try:
                hcomm.fault_stop()
            except hcomm.PeerLostError as e:
                return "stopped: " + str(e)
        return hcomm.get_rank()

    res = run(body, 4)
    assert res[:2] + res[3:] == [0, 1, 3], res
    assert res[2].startswith("stopped: hcomm_fault_stop: this rank stopped for good"), res


def test_revoke_releases_a_waiting_peer():
    """Nobody lost: rank 1 revokes its TP group instead of joining rank 0's barrier, which
    then raises RevokedError; agree still works on the revoked group and says nobody was lost;
    the group stays revoked for both, its shrink a working copy."""
    def body():
        ctx = hcomm.init_context(tp_size=2)
        me, got = ctx.tp.rank, []
        if me == 1:
            ctx.tp.revoke()
            ctx.tp.revoke()  # a second revoke does nothing
        try:
            ctx.tp.barrier()
            got.append("barrier ok")
        except hcomm.RevokedError as e:
            got.append("revoked" if "hcomm_barrier" in str(e) else str(e))
        got.append(ctx.tp.agree(me + 2))
        got.append(ctx.tp.lost())
        with pytest.raises(hcomm.RevokedError):
            _reduce(ctx.tp, 1)
        s = ctx.tp.shrink()
        got.append(_reduce(s, hcomm.get_rank()))
        s.destroy()
        return got

    for r, got in enumerate(run(body, 4)):
        assert got == ["revoked", (2 & 3, False), [], (r // 2) * 4 + 1], (r, got)


def test_rebuild_without_a_whole_replica():
    """tp 2 x dp 2 losing a rank of each replica: rebuild refuses with StateError (restart from
    a checkpoint) on both survivors."""
    def body():
        ctx = hcomm.init_context(tp_size=2)
        if hcomm.get_rank() in (1, 2):
            hcomm.fault_stop()
        ctx.revoke()
        assert ctx.world.agree() == (1, True)
        assert ctx.world.lost() == [1, 2]
        shrunk = ctx.world.shrink()
        with pytest.raises(hcomm.StateError) as e:
            ctx.rebuild(shrunk)
        return shrunk.ranks, str(e.value)

    res = run(body, 4)
    assert res[1] is None and res[2] is None
    for ranks, msg in (res[0], res[3]):
        assert ranks == [0, 3] and msg.startswith("hcomm_ctx_rebuild") and "no whole" in msg, msg

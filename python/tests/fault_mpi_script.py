"""Run by test_fault.py under `mpirun --enable-recovery` (each process a rank, backend mpi)
through python3 -m hcomm.run: tp 2 x dp N/2, rank VICTIM (argv[1]) kills itself with SIGKILL
(hcomm.fault_stop); the survivors see hcomm.PeerLostError, revoke, agree, shrink, rebuild with
one DP replica fewer and check a DP all_reduce on the new context against the serial sum.
mpirun's exit status cannot be trusted under --enable-recovery, so each survivor prints
`rank R: fault ok` for the test to count."""
import sys

import numpy as np

import hcomm

victim = int(sys.argv[1])
ctx = hcomm.init_context(tp_size=2)
me, p = hcomm.get_rank(), hcomm.get_world_size()
assert ctx.world.backend == "mpi"
if me == victim:
    hcomm.fault_stop()
    raise SystemExit("hcomm.fault_stop returned on mpi")


def reduce(group, value):
    x = np.array([value], np.int64)
    hcomm.all_reduce(x, group=group)
    return int(x[0])


try:
    hcomm.barrier()
    raise SystemExit(f"rank {me}: a world barrier without rank {victim} succeeded")
except hcomm.PeerLostError as e:
    assert f"rank {victim}" in str(e), str(e)
ctx.revoke()
assert ctx.world.agree(1) == (1, True)
assert ctx.world.lost() == [victim], ctx.world.lost()
survivors = [r for r in range(p) if r != victim]
shrunk = ctx.world.shrink()
assert (shrunk.rank, shrunk.size, shrunk.ranks) == (survivors.index(me), p - 1, survivors)
assert reduce(shrunk, me) == sum(survivors)
new = ctx.rebuild(shrunk)
kept = [r for r in range(p) if r // 2 != victim // 2]
if me in kept:
    assert new is not None and new.config["dp"] == p // 2 - 1 and new.world.ranks == kept
    got = reduce(new.dp, me)
    want = sum(r for r in kept if r % 2 == me % 2)
    assert got == want, (got, want)
    print(f"rank {me}: fault ok, dp {new.config['dp']} sum {got}", flush=True)
else:
    assert new is None, new
    print(f"rank {me}: fault ok, replica dropped", flush=True)

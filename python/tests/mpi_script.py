"""Run by test_mpi.py under mpirun: each process is a rank (backend mpi), through
python3 -m hcomm.run, with the brief's snippets."""
import numpy as np

import hcomm
from hcomm import moe, pp, tp
from hcomm.pp import PP_TAG_BACKWARD, PP_TAG_FORWARD

ctx = hcomm.init_context(tp_size=1, pp_size=2, dp_size=1, backend="mpi")
r, n = hcomm.get_rank(), hcomm.get_world_size()
assert hcomm.world().backend == "mpi" and n == 2
x = np.full((2, 4), r + 1, np.float32)
assert (tp.all_reduce(x, group=ctx.dp) == x).all()
assert (tp.all_gather(x, dim=-1, group=hcomm.world()) == np.concatenate(
    [np.full((2, 4), 1, np.float32), np.full((2, 4), 2, np.float32)], -1)).all()
if ctx.pp.rank == 0:
    pp.send(x, dst=1, tag=PP_TAG_FORWARD)
    grad = pp.recv(src=1, tag=PP_TAG_BACKWARD, kind="numpy")
    assert (grad == 2 * x).all()
else:
    out = pp.recv(src=0, tag=PP_TAG_FORWARD, kind="numpy")
    pp.send(out * 2, dst=0, tag=PP_TAG_BACKWARD)
tokens = np.arange(8, dtype=np.float32).reshape(4, 2) + 10 * r
routed, routing = moe.all_to_all(tokens, np.array([0, 1, 1, 0], np.int32), num_experts=2,
                                 group=hcomm.world())
assert (moe.all_to_all(routed, routing) == tokens).all()
grads = [np.full(3, r, np.float64)]
hcomm.dp.all_reduce(grads, op="avg", group=hcomm.world())
assert (grads[0] == 0.5).all()
print(f"rank {r}: mpi ok", flush=True)

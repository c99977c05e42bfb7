"""Run by test_lifecycle.py under mpirun and threads: every call on a destroyed group raises
hcomm.StateError naming it (on main this was SIGSEGV), then a new context works."""
import numpy as np

import hcomm
from hcomm import dp, moe, pp, tp

ctx = hcomm.init_context(tp_size=2)
g = ctx.tp
x = np.ones(4, np.float32)
ctx.destroy()
calls = {
    "tp.all_reduce": lambda: tp.all_reduce(x, group=g),
    "tp.all_reduce(out)": lambda: tp.all_reduce(x, group=g, out=np.empty_like(x)),
    "tp.all_reduce(async)": lambda: tp.all_reduce(x, group=g, async_op=True),
    "tp.all_gather": lambda: tp.all_gather(x, group=g),
    "tp.reduce_scatter": lambda: tp.reduce_scatter(x, dim=0, group=g),
    "tp.split": lambda: tp.split(x, dim=0, group=g),
    "tp.reduce_from": lambda: tp.reduce_from(x, group=g),
    "pp.send": lambda: pp.send(x, dst=0, group=g),
    "moe.all_to_all": lambda: moe.all_to_all(x.reshape(2, 2), np.zeros(2, np.int32),
                                             num_experts=2, group=g),
    "dp.all_reduce": lambda: dp.all_reduce([x], group=g),
    "g.all_reduce": lambda: g.all_reduce(x),
    "g.barrier": g.barrier,
    "hcomm.broadcast": lambda: hcomm.broadcast(x, src=0, group=g),
    "hcomm.barrier": lambda: hcomm.barrier(group=g),
    "get_rank": lambda: hcomm.get_rank(g),
}
for name, fn in calls.items():
    try:
        fn()
    except hcomm.StateError as e:
        assert "group 'tp' was destroyed" in str(e), (name, str(e))
    else:
        raise AssertionError(f"{name} on a destroyed group did not raise")
ctx.destroy()  # a second destroy does nothing
ctx2 = hcomm.init_context(tp_size=1)  # init again after destroy
assert tp.all_reduce(x, group=ctx2.dp)[0] == hcomm.get_world_size()
print(f"rank {hcomm.get_rank()}: lifecycle ok {len(calls)}", flush=True)

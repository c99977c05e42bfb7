"""init_context, groups, plan, init_tensor_parallel_group and ctx.dp.all_reduce."""
import numpy as np
import pytest

import hcomm
from conftest import run


def test_groups_match_plan():
    def body():
        ctx = hcomm.init_context(tp_size=2, pp_size=2, dp_size=2)
        return hcomm.get_rank(), {k: (g.rank, g.size, g.ranks) for k, g in
                                  (("tp", ctx.tp), ("pp", ctx.pp), ("dp", ctx.dp),
                                   ("ep", ctx.ep))}, ctx.config

    layout = hcomm.plan(8, tp=2, pp=2, dp=2)
    assert layout["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for rank, groups, cfg in run(body, 8):
        assert cfg["tp"] == 2 and cfg["order"] == "tp-cp-ep-dp-pp"
        for kind, (r, size, ranks) in groups.items():
            assert ranks in layout[kind] and ranks[r] == rank and size == len(ranks)


def test_hsdp_groups_match_plan():
    def body():
        ctx = hcomm.init_context(tp_size=1, dp_size=8, dp_shard_size=4)
        return hcomm.get_rank(), {k: (getattr(ctx, k).rank, getattr(ctx, k).ranks)
                                  for k in ("dp_shard", "dp_replicate")}, ctx.config

    layout = hcomm.plan(8, dp=8, dp_shard=4)
    assert layout["dp_shard"] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # shard innermost
    assert layout["dp_replicate"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for rank, groups, cfg in run(body, 8):
        assert cfg["dp_shard"] == 4
        for kind, (r, ranks) in groups.items():
            assert ranks in layout[kind] and ranks[r] == rank
    with pytest.raises(hcomm.HcommError, match="dp_shard=3 does not divide dp=8"):
        hcomm.plan(8, dp=8, dp_shard=3)


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_dp_all_reduce(op):
    def body():
        ctx = hcomm.init_context(tp_size=2, pp_size=1, dp_size=2)
        r = hcomm.get_rank()
        grads = [np.full(3, r, np.float64), np.full((2, 2), r, np.float32)]
        out = ctx.dp.all_reduce(grads, op=op, bucket_bytes=16)
        assert out is grads
        return ctx.dp.ranks, grads

    for ranks, grads in run(body, 4):
        want = sum(ranks) / (len(ranks) if op == "avg" else 1)
        np.testing.assert_array_equal(grads[0], np.full(3, want))
        np.testing.assert_array_equal(grads[1], np.full((2, 2), want))


def test_init_tensor_parallel_group():
    def body():
        g = hcomm.init_tensor_parallel_group(tp_rank=hcomm.get_rank() % 4, tp_size=4)
        return g.rank, g.size

    assert run(body, 8) == [(r % 4, 4) for r in range(8)]


def test_backend_not_built():
    def body():
        hcomm.init_context(tp_size=1, backend="hccl")

    with pytest.raises(ValueError, match="'hccl' is not built; this build has local"):
        run(body, 2)
    with pytest.raises(ValueError, match="nccl"):
        hcomm.launch(lambda: None, nranks=2, backend="nccl")


def test_world_outside_launch():
    with pytest.raises(RuntimeError, match="hcomm.launch"):
        hcomm.world()

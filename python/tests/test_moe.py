"""hcomm.moe: top-1 and top-k routing against a numpy model of the layout (experts contiguous,
received rows expert-major, then source rank, then token order)."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import moe

E, H = 8, 3


def batch(rank):
    rng = np.random.default_rng(10 + rank)
    n = 4 + rank  # N differs by rank
    return (rng.standard_normal((n, H)).astype(np.float32),
            rng.integers(0, E, size=n).astype(np.int32))


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_all_to_all_top1(n):
    def body():
        tokens, ids = batch(hcomm.get_rank())
        tpe = np.zeros(E // n, np.int64)
        routed, routing = moe.all_to_all(tokens, ids, num_experts=E, tokens_per_expert=tpe)
        back = moe.all_to_all(routed * 2, routing)  # the reverse table
        return routed, tpe, back

    for r, (routed, tpe, back) in enumerate(run(body, n)):
        mine = range(r * E // n, (r + 1) * E // n)
        rows = [batch(s)[0][batch(s)[1] == e] for e in mine for s in range(n)]
        ref = np.concatenate(rows) if rows else np.zeros((0, H), np.float32)
        np.testing.assert_array_equal(routed, ref)
        np.testing.assert_array_equal(tpe, [sum((batch(s)[1] == e).sum() for s in range(n))
                                            for e in mine])
        np.testing.assert_array_equal(back, batch(r)[0] * 2)


def test_topk_combine_weights():
    """k=2 with weights: combining the received rows unchanged gives token * (w0 + w1)."""
    def body():
        r = hcomm.get_rank()
        tokens, ids = batch(r)
        ids2 = np.stack([ids, (ids + 3) % E], axis=1)
        ids2[0, 1] = -1  # an empty slot
        w = np.full(ids2.shape, 0.25, np.float32)
        w[:, 0] = 0.5
        routed, routing = moe.dispatch(tokens, ids2, E, weights=w)
        grad_tokens = moe.dispatch_bwd(routed, routing)
        return tokens, moe.combine(routed, routing), grad_tokens

    for tokens, out, grad_tokens in run(body, 4):
        ref = tokens * 0.75
        ref[0] = tokens[0] * 0.5
        np.testing.assert_allclose(out, ref, rtol=1e-6)
        ref = tokens * 2  # dispatch_bwd sums a token's slots, unweighted
        ref[0] = tokens[0]
        np.testing.assert_allclose(grad_tokens, ref, rtol=1e-6)


def test_moe_on_ep_group_and_backward_passes():
    def body():
        hcomm.init_context(tp_size=2, dp_size=4, ep_size=4)
        tokens, ids = batch(hcomm.get_rank())
        routed, routing = moe.dispatch(tokens, ids, E)
        assert routing.group.size == 4
        g = moe.combine_bwd(tokens, routing)  # routed like the dispatch
        return routed, g, moe.dispatch_bwd(routed, routing), tokens

    for routed, g, d, tokens in run(body, 8):
        np.testing.assert_array_equal(g, routed)
        np.testing.assert_array_equal(d, tokens)


def test_expert_tp_sequence_parallel():
    """ep 2 x etp 2: each rank's own token shard; the gathered rows are the same on both
    expert-TP members, and column-split identity experts combine back to token * sum(w)."""
    def body():
        ctx = hcomm.init_context(tp_size=2, ep_size=2, num_experts=E)
        r = hcomm.get_rank()
        tokens, ids = batch(r)
        ids2 = np.stack([ids, (ids + 5) % E], axis=1)
        w = np.full(ids2.shape, 0.25, np.float32)
        routed, routing = moe.dispatch(tokens, ids2, E, weights=w, group=ctx.ep,
                                       etp_group=ctx.etp, path="flat")
        shard = np.zeros_like(routed)
        cols = np.arange(H) % ctx.etp.size == ctx.etp.rank
        shard[:, cols] = routed[:, cols]
        return tokens, routed, ctx.etp.ranks, moe.combine(shard, routing)

    res = run(body, 4)
    for tokens, routed, members, out in res:
        np.testing.assert_allclose(out, tokens * 0.5, rtol=1e-6)
        for m in members:
            np.testing.assert_array_equal(routed, res[m][1])


def uniform(rank, n):
    """E tokens per rank, token i to expert i: every local expert gets one row per rank."""
    x = np.arange(E * H, dtype=np.float64).reshape(E, H) + 100 * rank
    return x, np.arange(E, dtype=np.int32)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_brief_reverse_call_as_written(n):
    """routed, reverse_expert_ids = all_to_all(...); all_to_all(expert_output, reverse_ids,
    num_experts=8, tokens_per_expert=tokens_per_npu) returns the tokens in original order,
    with tokens_per_expert an int, a list or a tensor; reverse_ids(routing) works the same."""
    torch = pytest.importorskip("torch")

    def body():
        r = hcomm.get_rank()
        x, ids = uniform(r, n)
        tokens = torch.from_numpy(x)
        local = E // n
        out = []
        for tpe in (n, [n] * local, torch.full((local,), n), np.full(local, n), torch.tensor(n)):
            routed, reverse_expert_ids = moe.all_to_all(tokens, torch.from_numpy(ids),
                                                        num_experts=E, tokens_per_expert=tpe)
            back = moe.all_to_all(routed * 3, reverse_expert_ids, num_experts=E,
                                  tokens_per_expert=tpe)
            out.append(torch.equal(back, tokens * 3))
        rid = moe.reverse_ids(reverse_expert_ids)
        assert rid.tolist() == sorted(list(range(local)) * n)
        back = moe.all_to_all(routed * 2, rid, num_experts=E, tokens_per_expert=[n] * local)
        out.append(torch.equal(back, tokens * 2))
        return out

    assert run(body, n) == [[True] * 6] * n


def test_shape_errors_before_any_collective():
    """Each names the argument and both shapes; nothing was sent (the next call works)."""
    def body():
        r = hcomm.get_rank()
        x, ids = uniform(r, 2)
        for call, pattern in (
                (lambda: moe.all_to_all(x[0], ids, num_experts=E), r"tokens has shape \(3,\)"),
                (lambda: moe.all_to_all(x, ids[:5], num_experts=E),
                 r"expert_ids has shape \(5,\); expected \(8,\).*\(8, 3\)"),
                (lambda: moe.all_to_all(x, ids, num_experts=E, tokens_per_expert=np.zeros(3)),
                 r"tokens_per_expert has shape \(3,\); expected \(4,\)"),
                (lambda: moe.all_to_all(x, ids, num_experts=E, tokens_per_expert=[1, 2]),
                 r"tokens_per_expert has shape \(2,\); expected \(4,\)"),
                (lambda: moe.all_to_all(x, ids, num_experts=7), "num_experts=7")):
            with pytest.raises(ValueError, match=pattern):
                call()
        routed, routing = moe.all_to_all(x, ids, num_experts=E)
        for call, pattern in (
                (lambda: moe.all_to_all(routed[:5], routing),
                 r"expert_output has shape \(5, 3\); expected \(8, H\)"),
                (lambda: moe.all_to_all(routed, routing, num_experts=4), "num_experts=4"),
                (lambda: moe.all_to_all(routed, routing, tokens_per_expert=3),
                 r"tokens_per_expert=\[3, 3, 3, 3\] but .* \[2, 2, 2, 2\]")):
            with pytest.raises(ValueError, match=pattern):
                call()
        with pytest.raises(ValueError, match=r"tokens_per_expert=\[1, 1, 1, 1\] but the local"):
            moe.all_to_all(x, ids, num_experts=E, tokens_per_expert=1)  # checked once known
        return np.array_equal(moe.all_to_all(routed, routing), x)

    assert run(body, 2) == [True, True]

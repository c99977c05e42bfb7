"""hcomm.pp: sends and receives with and without a shape, nonblocking, send_recv and the
pipeline helpers, against what the peer sent."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import pp


def act(rank, step=0, shape=(2, 3)):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * rank + step


def test_send_recv_shape_and_any():
    def body():
        r = hcomm.get_rank()
        if r == 0:
            pp.send(act(0), dst=1, tag=pp.PP_TAG_FORWARD)
            pp.send(act(0, 1, (5,)).astype(np.int64), dst=1, tag=7)
            return pp.recv(src=1, tag=pp.PP_TAG_BACKWARD, kind="numpy")
        a = pp.recv(src=0, tag=pp.PP_TAG_FORWARD, shape=(2, 3), dtype=np.float32)
        b = pp.recv(src=0, tag=7, kind="numpy")  # any shape: hcomm_pp_recv_any
        pp.send(a * 2, dst=0, tag=pp.PP_TAG_BACKWARD)
        return a, b

    grad, (a, b) = run(body, 2)
    np.testing.assert_array_equal(a, act(0))
    assert b.dtype == np.int64 and b.shape == (5,)
    np.testing.assert_array_equal(b, act(0, 1, (5,)).astype(np.int64))
    np.testing.assert_array_equal(grad, act(0) * 2)


def test_nonblocking_and_send_recv():
    def body():
        r, n = hcomm.get_rank(), hcomm.get_world_size()
        nxt, prv = (r + 1) % n, (r - 1) % n
        s = pp.isend(act(r), dst=nxt, tag=3)
        a = pp.irecv(src=prv, tag=3, shape=(2, 3), dtype=np.float32)
        b = pp.irecv(src=prv, tag=4, kind="numpy")
        pp.send(act(r, 1, (r + 1,)), dst=nxt, tag=4)
        s.wait()
        got = a.wait(), b.wait()
        c = pp.send_recv(act(r, 2), dst=nxt, src=prv, send_tag=5, recv_tag=5,
                         shape=(2, 3), dtype=np.float32)
        d = pp.send_recv(act(r, 3, (r + 2,)), dst=nxt, src=prv, send_tag=6, recv_tag=6,
                         kind="numpy")
        return got + (c, d)

    n = 3
    for r, (a, b, c, d) in enumerate(run(body, n)):
        p = (r - 1) % n
        np.testing.assert_array_equal(a, act(p))
        np.testing.assert_array_equal(b, act(p, 1, (p + 1,)))
        np.testing.assert_array_equal(c, act(p, 2))
        np.testing.assert_array_equal(d, act(p, 3, (p + 2,)))


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_pipeline_helpers(stages):
    """One forward and backward through `stages` stages on the PP group of a context."""
    def body():
        ctx = hcomm.init_context(tp_size=1, pp_size=stages, dp_size=8 // stages)
        s = ctx.pp.rank
        x = pp.recv_forward(kind="numpy")
        x = act(0) if x is None else x + 1
        g = pp.send_forward_recv_backward(x, shape=(2, 3), dtype=np.float32)
        g = np.ones((2, 3), np.float32) if g is None else g * 2
        pp.send_backward(g)  # first stage: no previous, a no-op
        ring = pp.send_forward_recv_forward(x, ring=True, kind="numpy")
        return s, x, g, ring

    out = run(body, 8)
    for s, x, g, ring in out:
        np.testing.assert_array_equal(x, act(0) + s)
        np.testing.assert_array_equal(g, np.full((2, 3), 2.0 ** (stages - 1 - s)))
        if stages > 1:
            np.testing.assert_array_equal(ring, act(0) + (s - 1) % stages)
        else:
            assert ring is None


def test_recv_any_torch_bf16():
    torch = pytest.importorskip("torch")

    def body():
        if hcomm.get_rank() == 0:
            pp.send(torch.arange(6, dtype=torch.bfloat16).reshape(3, 2), dst=1)
            return None
        return pp.recv(src=0)

    y = run(body, 2)[1]
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert torch.equal(y, torch.arange(6, dtype=torch.bfloat16).reshape(3, 2))

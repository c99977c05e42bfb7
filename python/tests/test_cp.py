"""hcomm.cp: causal attention over CP = 1, 2, 4 ranks (ring, allgather, ulysses) equals a
single-process torch attention within 1e-12 relative in f64, forward and backward; the layout
calls against numpy references; bad input fails naming the numbers."""
import numpy as np
import pytest

from conftest import run

torch = pytest.importorskip("torch")
from hcomm import cp  # noqa: E402
import hcomm  # noqa: E402

B, S, H, D = 2, 16, 4, 8


def reference(seed):
    """q, k, v, the output gradient, and torch's causal attention with its gradients."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, gout = (torch.randn(B, S, H, D, dtype=torch.float64, generator=g) for _ in range(4))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qr, kr) / D ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vr)
    out.backward(gout)
    return (q, k, v, gout), (out.detach(), qr.grad, kr.grad, vr.grad)


def rows(rank, size, algo):
    """The sequence rows a rank holds: zigzag for ring and allgather, contiguous for ulysses."""
    n = S // size
    if algo == "ulysses":
        return list(range(rank * n, rank * n + n))
    return cp.zigzag_positions(rank, size, n)


def close(got, want):
    err = (got - want).abs().max().item()
    return err <= 1e-12 * want.abs().max().item(), err


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("algo", ["ring", "allgather", "ulysses"])
def test_attention_parity(n, algo):
    inputs, ref = reference(7)

    def body():
        r = hcomm.get_rank()
        mine = rows(r, n, algo)
        q, k, v, gout = (t[:, mine].clone() for t in inputs)
        for t in (q, k, v):
            t.requires_grad_()
        out = cp.attention(q, k, v, algo)
        out.backward(gout)
        return mine, [out.detach(), q.grad, k.grad, v.grad]

    for mine, got in run(body, n):
        for name, x, want in zip(("out", "dq", "dk", "dv"), got, ref):
            ok, err = close(x, want[:, mine])
            assert ok, f"{algo} cp={n} {name}: max abs error {err}"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_layout_calls(n):
    full = np.arange(2 * 2 * n * 3, dtype=np.float64).reshape(2, 2 * n, 3)

    def body():
        r = hcomm.get_rank()
        part = cp.split(full, 1, cp.ZIGZAG)
        back = cp.all_gather(part, 1, cp.ZIGZAG)
        rs = cp.reduce_scatter(full * (r + 1), 1, cp.ZIGZAG)
        return r, part, back, rs

    for r, part, back, rs in run(body, n):
        mine = cp.zigzag_positions(r, n, 2)
        np.testing.assert_array_equal(part, full[:, mine])
        np.testing.assert_array_equal(back, full)
        np.testing.assert_array_equal(rs, full[:, mine] * (n * (n + 1) // 2))


def test_ring_and_errors():
    def body():
        r = hcomm.get_rank()
        chunk = np.full((3, 4), float(r))
        ring = cp.Ring(chunk)
        got = ring.step(chunk).copy()
        ring.close()
        with pytest.raises(hcomm.ShapeError, match="is not divisible by 2\\*cp=4"):
            cp.split(np.zeros((2, 6)), 1, cp.ZIGZAG)
        with pytest.raises(hcomm.ShapeError, match="heads are not divisible by cp=2"):
            cp.seq_to_head(np.zeros((1, 2, 3, 2)))
        return r, got

    for r, got in run(body, 2):
        np.testing.assert_array_equal(got, np.full((3, 4), float((r + 1) % 2)))

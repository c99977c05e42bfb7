"""Context parallelism (include/hcomm/cp.h) on numpy arrays and torch CPU tensors: the
contiguous and zigzag sequence splits, all-gather CP, Ulysses all-to-all, the ring exchange,
and causal multi-head attention over the CP group with autograd (`attention`: ring, allgather
or ulysses; the ring's backward runs the ring again with dK/dV travelling back to their
owners). Sequence tensors are [B, S, H, D] (batch, sequence, heads, head dim) unless a call
takes dims. `group` defaults to the current context's CP group, else the world."""
import ctypes
import math

import numpy as np

from . import _lib, _tensor
from .context import default_group

CONTIGUOUS, ZIGZAG = 0, 1
FORWARD, BACKWARD = 0, 1

_P, _I, _T = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_lib.Tensor)
_PROTOS = {
    "hcomm_cp_split": [_P, _T, _T, _I, _I],
    "hcomm_cp_all_gather": [_P, _T, _T, _I, _I],
    "hcomm_cp_reduce_scatter": [_P, _T, _T, _I, _I],
    "hcomm_cp_a2a_seq_to_head": [_P, _T, _T, _I, _I],
    "hcomm_cp_a2a_head_to_seq": [_P, _T, _T, _I, _I],
    "hcomm_cp_ring_create": [_P, _T, _I, ctypes.POINTER(_P)],
    "hcomm_cp_ring_start": [_P, _T],
    "hcomm_cp_ring_wait": [_P, _T],
    "hcomm_cp_ring_destroy": [_P],
}
for _name, _args in _PROTOS.items():
    _f = getattr(_lib.lib, _name)
    _f.restype, _f.argtypes = _I, _args
_C = _lib.lib


def _group(group):
    return default_group("cp", group)


def _dim(x, dim):
    _tensor.check(x)
    if not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"hcomm: dim={dim!r} out of range for a tensor of {x.ndim} dims")
    return dim % x.ndim


def _run(fn, g, x, shape, *ints):
    """fn(group, &x, &out, *ints) into a new array of `shape` (x's kind and dtype)."""
    out = _tensor.empty(x, shape)
    d_in, d_out = _tensor.desc(x, "x"), _tensor.desc(out, "out", True)
    _lib.call(fn, g._vp, ctypes.byref(d_in), ctypes.byref(d_out), *ints)
    return out


def _resized(x, dim, extent):
    shape = list(x.shape)
    shape[dim] = extent
    return shape


def split(x, dim=1, layout=ZIGZAG, group=None):
    """This rank's part of the full sequence x along `dim` (local): zigzag (chunks r and
    2cp-1-r of 2cp) or contiguous."""
    g, d = _group(group), _dim(x, dim)
    return _run(_C.hcomm_cp_split, g, x, _resized(x, d, x.shape[d] // g.size), d, layout)


def all_gather(x, dim=1, layout=ZIGZAG, group=None):
    """Every rank's part gathered into the full sequence in natural order (collective)."""
    g, d = _group(group), _dim(x, dim)
    return _run(_C.hcomm_cp_all_gather, g, x, _resized(x, d, x.shape[d] * g.size), d, layout)


def reduce_scatter(x, dim=1, layout=ZIGZAG, group=None):
    """This rank's part of the sum over ranks of the full-sequence x (collective)."""
    g, d = _group(group), _dim(x, dim)
    return _run(_C.hcomm_cp_reduce_scatter, g, x, _resized(x, d, x.shape[d] // g.size), d,
                layout)


def seq_to_head(x, seq_dim=1, head_dim=2, group=None):
    """Ulysses: [.., S/P, .., H, ..] -> [.., S, .., H/P, ..] (H < P dividing P: GQA, one
    replicated head per rank)."""
    g, s, h = _group(group), _dim(x, seq_dim), _dim(x, head_dim)
    heads = x.shape[h] // g.size if x.shape[h] % g.size == 0 else 1
    shape = _resized(x, s, x.shape[s] * g.size)
    shape[h] = heads
    return _run(_C.hcomm_cp_a2a_seq_to_head, g, x, shape, s, h)


def head_to_seq(x, seq_dim=1, head_dim=2, heads=None, group=None):
    """Ulysses' inverse: [.., S, .., H/P, ..] -> [.., S/P, .., H, ..]; heads (default
    H/P * P) below P sums the GQA replicas."""
    g, s, h = _group(group), _dim(x, seq_dim), _dim(x, head_dim)
    shape = _resized(x, s, x.shape[s] // g.size)
    shape[h] = heads if heads is not None else x.shape[h] * g.size
    return _run(_C.hcomm_cp_a2a_head_to_seq, g, x, shape, s, h)


class Ring:
    """A ring exchange for chunks shaped as `like` (hcomm_cp_ring_*): start(cur) sends cur to
    the next rank (FORWARD; BACKWARD: the previous one) while the caller computes, wait()
    returns the neighbour's chunk, a view of the ring's buffer (valid until the step after the
    next is waited for). Collective over `group`; close() frees it."""

    def __init__(self, like, direction=FORWARD, group=None):
        self.g = _group(group)
        self._like = like
        self._h = ctypes.c_void_p()
        d = _tensor.desc(like, "like")
        _lib.call(_C.hcomm_cp_ring_create, self.g._vp, ctypes.byref(d), direction,
                  ctypes.byref(self._h))
        self._sent = None

    def start(self, cur):
        self._sent = (cur, _tensor.desc(cur, "cur"))  # cur must outlive the step
        _lib.call(_C.hcomm_cp_ring_start, self._h, ctypes.byref(self._sent[1]))

    def wait(self):
        t = _lib.Tensor()
        _lib.call(_C.hcomm_cp_ring_wait, self._h, ctypes.byref(t))
        self._sent = None
        like = self._like
        nbytes = int(np.prod(like.shape)) * like.element_size() if _tensor.is_torch(like) \
            else like.nbytes
        buf = (ctypes.c_char * max(nbytes, 1)).from_address(t.data)
        if _tensor.is_torch(like):
            import torch
            return torch.frombuffer(buf, dtype=like.dtype, count=like.numel()).view(like.shape)
        return np.frombuffer(buf, dtype=like.dtype, count=like.size).reshape(like.shape)

    def step(self, cur):
        self.start(cur)
        return self.wait()

    def close(self):
        if self._h:
            _lib.call(_C.hcomm_cp_ring_destroy, self._h)
            self._h = ctypes.c_void_p()


def zigzag_positions(rank, size, length):
    """Sequence positions of the `length` rows that zigzag rank `rank` of `size` holds."""
    c = length // 2
    return [rank * c + t if t < c else (2 * size - 1 - rank) * c + t - c for t in range(length)]


# --- causal attention over the CP group, with autograd ---------------------------------------

def _torch():
    import torch
    return torch


def _scores(q, k, qpos, kpos, scale):
    """[B, H, Sq, Sk] scaled scores with -inf where a key lies after its query."""
    torch = _torch()
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    mask = torch.tensor(qpos)[:, None] < torch.tensor(kpos)[None, :]
    return s.masked_fill(mask, float("-inf"))


def _local(q, k, v, qpos, kpos):
    """Plain causal attention of q over (k, v) by positions (autograd through torch)."""
    torch = _torch()
    p = torch.softmax(_scores(q, k, qpos, kpos, 1.0 / math.sqrt(q.shape[-1])), dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


class _RingAttention:
    """Ring attention's forward (online softmax over the chunks as they arrive) and backward
    (the chunks travel again with their dK/dV, which come home after cp steps)."""

    @staticmethod
    def forward(q, k, v, g):
        torch = _torch()
        P, r, n = g.size, g.rank, q.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        qpos = zigzag_positions(r, P, n)
        ring = Ring(torch.stack([k, v]).contiguous(), FORWARD, g)
        cur = torch.stack([k, v]).contiguous()
        m = torch.full(q.shape[:1] + (q.shape[2], n), float("-inf"), dtype=q.dtype)
        l, o = torch.zeros_like(m), torch.zeros(q.shape[0], q.shape[2], n, q.shape[3],
                                                 dtype=q.dtype)
        for s in range(P):
            if s + 1 < P:
                ring.start(cur)
            sc = _scores(q, cur[0], qpos, zigzag_positions((r - s) % P, P, n), scale)
            mn = torch.maximum(m, sc.amax(-1))
            safe = torch.where(torch.isinf(mn), torch.zeros_like(mn), mn)
            e = torch.exp(sc - safe[..., None])
            a = torch.exp(m - safe)
            l = l * a + e.sum(-1)
            o = o * a[..., None] + torch.einsum("bhqk,bkhd->bhqd", e, cur[1])
            m = mn
            if s + 1 < P:
                cur = ring.wait().clone()
        ring.close()
        out = (o / l[..., None]).permute(0, 2, 1, 3).contiguous()
        return out, m + torch.log(l)

    @staticmethod
    def backward(q, k, v, out, lse, dout, g):
        torch = _torch()
        P, r, n = g.size, g.rank, q.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        qpos = zigzag_positions(r, P, n)
        delta = (dout * out).sum(-1).permute(0, 2, 1)  # [B, H, Sq]
        cur = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)]).contiguous()
        ring = Ring(cur, FORWARD, g)
        dq = torch.zeros_like(q)
        for s in range(P):
            kpos = zigzag_positions((r - s) % P, P, n)
            p = torch.exp(_scores(q, cur[0], qpos, kpos, scale) - lse[..., None])
            dp = torch.einsum("bqhd,bkhd->bhqk", dout, cur[1])
            ds = p * (dp - delta[..., None]) * scale
            dq += torch.einsum("bhqk,bkhd->bqhd", ds, cur[0])
            cur[2] += torch.einsum("bhqk,bqhd->bkhd", ds, q)
            cur[3] += torch.einsum("bhqk,bqhd->bkhd", p, dout)
            cur = ring.step(cur).clone()  # after cp steps: this rank's chunk, every term in
        ring.close()
        return dq, cur[2].clone(), cur[3].clone()


def _functions():
    """The autograd Functions, made on first use (torch is imported only when needed)."""
    global _FNS
    try:
        return _FNS
    except NameError:
        pass
    torch = _torch()

    class RingFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g):
            out, lse = _RingAttention.forward(q, k, v, g)
            ctx.g = g
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _RingAttention.backward(q, k, v, out, lse, dout.contiguous(), ctx.g)
            return dq, dk, dv, None

    class GatherFn(torch.autograd.Function):  # all-gather CP: forward gather, backward RS
        @staticmethod
        def forward(ctx, x, g):
            ctx.g = g
            return all_gather(x.contiguous(), 1, ZIGZAG, g)

        @staticmethod
        def backward(ctx, d):
            return reduce_scatter(d.contiguous(), 1, ZIGZAG, ctx.g), None

    class S2HFn(torch.autograd.Function):  # Ulysses: forward seq->head, backward head->seq
        @staticmethod
        def forward(ctx, x, g):
            ctx.g = g
            return seq_to_head(x.contiguous(), 1, 2, g)

        @staticmethod
        def backward(ctx, d):
            return head_to_seq(d.contiguous(), 1, 2, None, ctx.g), None

    class H2SFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, g):
            ctx.g = g
            return head_to_seq(x.contiguous(), 1, 2, None, g)

        @staticmethod
        def backward(ctx, d):
            return seq_to_head(d.contiguous(), 1, 2, ctx.g), None

    _FNS = (RingFn, GatherFn, S2HFn, H2SFn)
    return _FNS


def attention(q, k, v, algo="ring", group=None):
    """Causal softmax attention of this rank's rows q, k, v [B, S/cp, H, D] (torch) over the
    whole sequence split over the CP group: ring and allgather take the zigzag split (split()
    with ZIGZAG), ulysses the contiguous one (H divisible by cp). Returns this rank's rows of
    the output; autograd runs the matching backward exchange."""
    g = _group(group)
    ring, gather, s2h, h2s = _functions()
    P, r, n = g.size, g.rank, q.shape[1]
    if algo == "ring":
        return ring.apply(q.contiguous(), k.contiguous(), v.contiguous(), g)
    if algo == "allgather":
        full = list(range(n * P))
        return _local(q, gather.apply(k, g), gather.apply(v, g), zigzag_positions(r, P, n), full)
    if algo == "ulysses":
        full = list(range(n * P))
        o = _local(s2h.apply(q, g), s2h.apply(k, g), s2h.apply(v, g), full, full)
        return h2s.apply(o, g)
    raise ValueError(f"hcomm.cp.attention: algo must be ring, allgather or ulysses, not {algo!r}")

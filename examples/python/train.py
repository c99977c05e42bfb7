"""A small character-level language model in PyTorch, trained with hcomm over TP x PP x DP x EP:
the same text and the same four units as hcomm-train, written as model code would write them.

    0 embed:    h = emb_cur[c_t] + emb_prev[c_(t-1)]                            [n, C]
    1 TP block: h += RowParallelLinear(gelu(ColumnParallelLinear(h)))  (Megatron-LM MLP)
    2 MoE:      p = softmax(h Wr); e = argmax p; h += p[e] * expert_e(h): tokens go to the
                rank of their expert (hcomm.moe.all_to_all), each expert sharded over the
                expert-TP group like the TP block (top-1, dropless)
    3 head:     loss = cross_entropy(h Wo^T + bo, c_(t+1)), summed and scaled by 1/(batch*seq)

The units are split contiguously over the pipeline stages (GPipe: every micro-batch's forward,
then the backwards in reverse). Every rank draws the same global batch and keeps its DP slice,
and builds the full weights from one seed before keeping its shard, so any layout trains the
1-rank model: in f64 the per-step losses agree to ~1e-15 relative over 50 steps (the
reductions sum partial results in another order), in f32 to ~1e-7. Dense gradients are summed over DP, expert ones
over expert-DP, by the DDP-style bucketed reducer during backward (--dp-overlap 1) or by one
bucketed all_reduce after it (0).

    /usr/bin/python3 examples/python/train.py --ranks 8 --tp 2 --pp 2 --dp 2 --ep 2  (threads)
    mpirun --oversubscribe -np 4 /usr/bin/python3 examples/python/train.py --tp 2 --pp 2
Prints one line per step, 'step N loss L', from one rank (the last stage's first TP/DP rank).
"""
import argparse
import contextlib
import pathlib
import sys

import numpy as np
import torch

try:
    import hcomm
except ImportError:  # run from the source tree without PYTHONPATH
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import hcomm
from hcomm import moe, pp, tp
from hcomm.torch import ColumnParallelLinear, RowParallelLinear

F = torch.nn.functional
UNITS = 4  # embed, TP block, MoE, head
DTYPES = {"f64": torch.float64, "f32": torch.float32}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=None,
                    help="ranks on the local backend (threads; default 1); under mpirun the "
                         "job's processes are the ranks")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (and expert-TP)")
    ap.add_argument("--pp", type=int, default=1, help=f"pipeline stages, 1..{UNITS}")
    ap.add_argument("--dp", type=int, default=None, help="data-parallel size (world/(tp*pp))")
    ap.add_argument("--ep", type=int, default=1, help="expert-parallel size; divides dp")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=32, help="width C (TP FFN 2C, expert FFN C)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    ap.add_argument("--micro-batches", type=int, default=2, help="per step per DP rank")
    ap.add_argument("--seq", type=int, default=16, help="characters per sequence")
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f64")
    ap.add_argument("--dp-overlap", type=int, choices=(0, 1), default=1,
                    help="1: reduce gradient buckets during backward (hcomm.dp.Reducer)")
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    a = ap.parse_args(argv)
    if not 1 <= a.pp <= UNITS:
        ap.error(f"--pp {a.pp}: the model has {UNITS} units, so 1..{UNITS} stages")
    if a.hidden % a.tp:
        ap.error(f"--hidden {a.hidden} is not divisible by --tp {a.tp}")
    if a.experts % a.ep:
        ap.error(f"--experts {a.experts} is not divisible by --ep {a.ep}")
    if not pathlib.Path(a.data).is_file():
        ap.error(f"--data {a.data}: no such file (pass --data FILE with some text)")
    return a


def load_text(path):
    """The training text (the first 90%) as vocabulary indices, and the vocabulary size: the
    vocabulary is the distinct bytes, sorted, as hcomm-train has it."""
    raw = np.frombuffer(pathlib.Path(path).read_bytes(), np.uint8)
    chars = np.unique(raw)
    ids = torch.from_numpy(np.searchsorted(chars, raw).astype(np.int64))
    return ids[: len(ids) * 9 // 10], len(chars)


def full_weights(a, vocab, dtype):
    """Every weight of the 1-rank model, drawn in one fixed order from one seeded generator
    (each rank its own torch.Generator: threads share torch's global one)."""
    g = torch.Generator().manual_seed(a.seed)
    C, E = a.hidden, a.experts

    def randn(*shape, fan_in):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * fan_in ** -0.5).to(dtype)

    return {"emb_cur": randn(vocab, C, fan_in=C), "emb_prev": randn(vocab, C, fan_in=C),
            "w1": randn(2 * C, C, fan_in=C), "b1": torch.zeros(2 * C, dtype=dtype),
            "w2": randn(C, 2 * C, fan_in=2 * C), "b2": torch.zeros(C, dtype=dtype),
            "router": randn(E, C, fan_in=C),
            "e_w1": randn(E, C, C, fan_in=C), "e_w2": randn(E, C, C, fan_in=C),
            "wo": randn(vocab, C, fan_in=C), "bo": torch.zeros(vocab, dtype=dtype)}


class Stage(torch.nn.Module):
    """The units of one pipeline stage, with this rank's shards of their weights."""

    def __init__(self, a, ctx, full, dtype):
        super().__init__()
        self.units = [u for u in range(UNITS) if u * a.pp // UNITS == ctx.pp.rank]
        self.ctx, self.E = ctx, a.experts
        P = torch.nn.Parameter
        self.expert_params = []
        if 0 in self.units:
            self.emb_cur, self.emb_prev = P(full["emb_cur"]), P(full["emb_prev"])
        if 1 in self.units:
            kw = dict(dtype=dtype, group=ctx.tp, generator=torch.Generator())
            self.col = ColumnParallelLinear(a.hidden, 2 * a.hidden, **kw).load_full(
                full["w1"], full["b1"])
            self.row = RowParallelLinear(2 * a.hidden, a.hidden, **kw).load_full(
                full["w2"], full["b2"])
        if 2 in self.units:
            self.router = P(full["router"])
            n_local = a.experts // ctx.ep.size
            lo, et = ctx.ep.rank * n_local, ctx.etp
            # Expert e: gelu(x W1_e^T) W2_e^T, W1_e split by rows and W2_e by columns over ETP.
            self.e_w1 = P(full["e_w1"][lo:lo + n_local].chunk(et.size, 1)[et.rank].clone())
            self.e_w2 = P(full["e_w2"][lo:lo + n_local].chunk(et.size, 2)[et.rank].clone())
            self.expert_params = [self.e_w1, self.e_w2]
        if 3 in self.units:
            self.wo, self.bo = P(full["wo"]), P(full["bo"])

    def moe(self, h):
        """Top-1 MoE over the EP group; returns p[e] * expert_e(h)   [n, C]."""
        p = torch.softmax(h @ self.router.T, -1)                        # [n, E]
        e = p.argmax(-1)
        x = tp.copy_to(h, group=self.ctx.etp)  # backward: sum the ETP shards' input gradients
        routed, routing = moe.all_to_all(x, e.to(torch.int32), num_experts=self.E,
                                         group=self.ctx.ep)             # [R, C] expert-major
        off = routing.expert_offsets
        y = torch.cat([F.gelu(routed[off[j]:off[j + 1]] @ self.e_w1[j].T) @ self.e_w2[j].T
                       for j in range(len(off) - 1)])                   # [R, C] partial
        back = moe.all_to_all(y, routing)                               # [n, C] token order
        return tp.reduce_from(back, group=self.ctx.etp) * p.gather(1, e[:, None])

    def forward(self, h, cur, prev, tgt, scale):
        for u in self.units:
            if u == 0:
                h = self.emb_cur[cur] + self.emb_prev[prev]
            elif u == 1:
                h = h + self.row(F.gelu(self.col(h)))
            elif u == 2:
                h = h + self.moe(h)
            else:
                return F.cross_entropy(h @ self.wo.T + self.bo, tgt, reduction="sum") * scale
        return h


def batches(a, text, step, dp_rank, dp_size):
    """This DP rank's micro-batches of step `step`: (current, previous, target) ids, each
    [n = batch/dp/micro * seq]. Every rank draws the whole global batch, so layouts agree."""
    g = torch.Generator().manual_seed(a.seed * 1000003 + step)
    starts = torch.randint(1, len(text) - a.seq - 1, (a.batch,), generator=g)
    mine = starts.chunk(dp_size)[dp_rank].chunk(a.micro_batches)
    out = []
    for s in mine:
        idx = s[:, None] + torch.arange(a.seq)                          # [b, seq]
        out.append((text[idx].reshape(-1), text[idx - 1].reshape(-1), text[idx + 1].reshape(-1)))
    return out


class Grads:
    """Sums dense gradients over DP and expert gradients over expert-DP: with the reducer,
    each bucket starts as soon as backward has produced its gradients; else all at the end."""

    def __init__(self, stage, ctx, overlap):
        self.sets = [(ctx.dp, [p for p in stage.parameters()
                               if all(p is not q for q in stage.expert_params)]),
                     (ctx.edp, stage.expert_params)]
        self.reducers = []
        for group, params in self.sets:
            for p in params:  # registered buffers must stay put: allocate .grad once
                p.grad = torch.zeros_like(p)
            if overlap and params:
                self.reducers.append(group.reducer(params, op="sum").hook_params())

    def backward(self, out, grad, last_micro_batch):
        """out.backward(grad); only the step's last backward marks gradients ready."""
        with contextlib.ExitStack() as stack:
            if not last_micro_batch:
                for r in self.reducers:
                    stack.enter_context(r.no_sync())
            out.backward(grad)

    def reduce(self):
        if self.reducers:
            for r in self.reducers:
                r.wait()
        else:
            for group, params in self.sets:
                hcomm.dp.all_reduce(params, op="sum", group=group)


def train(a):
    torch.set_num_threads(1)  # ranks are threads (or processes) on few cores already
    dtype = DTYPES[a.dtype]
    text, vocab = load_text(a.data)
    ctx = hcomm.init_context(tp_size=a.tp, pp_size=a.pp, dp_size=a.dp, ep_size=a.ep,
                             num_experts=a.experts)
    dp_rank, dp_size = ctx.dp.rank, ctx.dp.size
    if a.batch % (dp_size * a.micro_batches):
        raise ValueError(f"--batch {a.batch} is not divisible by dp*micro-batches = "
                         f"{dp_size}*{a.micro_batches}")
    stage = Stage(a, ctx, full_weights(a, vocab, dtype), dtype)
    first, last = ctx.pp.rank == 0, ctx.pp.rank == ctx.pp.size - 1
    n = a.batch // dp_size // a.micro_batches * a.seq
    scale = 1.0 / (a.batch * a.seq)
    grads = Grads(stage, ctx, a.dp_overlap)
    momentum = [torch.zeros_like(p) for p in stage.parameters()]
    printer = last and ctx.tp.rank == 0 and dp_rank == 0
    losses = []
    for step in range(a.steps):
        kept, loss = [], 0.0
        for cur, prev, tgt in batches(a, text, step, dp_rank, dp_size):  # GPipe: forwards
            h = None if first else \
                pp.recv_forward(shape=(n, a.hidden), dtype=dtype).requires_grad_()
            out = stage(h, cur, prev, tgt, scale)
            if not last:
                pp.send_forward(out.detach())
            kept.append((h, out))
        for i, (h, out) in reversed(list(enumerate(kept))):              # then backwards
            if last:
                grads.backward(out, None, i == 0)
                loss += out.item()
            else:
                grads.backward(out, pp.recv_backward(shape=(n, a.hidden), dtype=dtype), i == 0)
            if not first:
                pp.send_backward(h.grad)
        grads.reduce()
        with torch.no_grad():  # SGD with momentum
            for p, m in zip(stage.parameters(), momentum):
                m.mul_(a.momentum).add_(p.grad)
                p.sub_(a.lr * m)
                p.grad.zero_()
        if last:  # the step's loss: the sum of the DP ranks' shares
            loss = float(tp.all_reduce(np.array([loss]), group=ctx.dp)[0])
            losses.append(loss)
        if printer:
            print(f"step {step + 1} loss {loss!r}", flush=True)
    return losses


def main(argv=None):
    a = parse(argv)
    if a.ranks is None and not hcomm.under_mpirun():
        a.ranks = 1
    return hcomm.launch(train, nranks=a.ranks, args=(a,))  # each rank's losses (last stage)


if __name__ == "__main__":
    main()

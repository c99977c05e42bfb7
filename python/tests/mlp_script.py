"""Run by test_autograd.py through hcomm.run on 4 ranks (processes, and --threads): a 2-layer
MLP, Megatron-style (layer 1 column-parallel, layer 2 row-parallel), TP 2 x DP 2, written with
the plain calls only: tp.all_reduce sums layer 2's partial products (backward: identity) and
tp.all_gather gathers layer 1's output for a second head (backward: this rank's slice). DP
averages the gradients with ctx.dp.all_reduce. 50 SGD steps in f64 must match a
single-process torch.nn.Linear model on the whole batch within 1e-12 relative."""
import torch

import hcomm
from hcomm import tp

STEPS, IN, HID, OUT, BATCH = 50, 6, 8, 5, 4
ctx = hcomm.init_context(tp_size=2)
t, d = ctx.tp, ctx.dp
gen = torch.Generator().manual_seed(1234)  # the same full weights and data on every rank
f64 = dict(dtype=torch.float64)
ref1, ref2 = torch.nn.Linear(IN, HID, **f64), torch.nn.Linear(HID, OUT, **f64)
head = torch.nn.Linear(HID, 1, **f64)  # the head on the gathered hidden, replicated
with torch.no_grad():
    for m in (ref1, ref2, head):
        m.weight.copy_(torch.randn(m.weight.shape, generator=gen, **f64) * 0.5)
        m.bias.copy_(torch.randn(m.bias.shape, generator=gen, **f64) * 0.1)
data = torch.randn(STEPS, d.size * BATCH, IN, generator=gen, **f64)
target = torch.randn(STEPS, d.size * BATCH, OUT, generator=gen, **f64)


def shard(w, dim):
    return torch.nn.Parameter(w.detach().chunk(t.size, dim)[t.rank].clone())


w1, b1 = shard(ref1.weight, 0), shard(ref1.bias, 0)
w2, b2 = shard(ref2.weight, 1), torch.nn.Parameter(ref2.bias.detach().clone())
hw, hb = (torch.nn.Parameter(p.detach().clone()) for p in (head.weight, head.bias))
mine = [w1, b1, w2, b2, hw, hb]
opt = torch.optim.SGD(mine, lr=0.1)
ref_opt = torch.optim.SGD([*ref1.parameters(), *ref2.parameters(), *head.parameters()], lr=0.1)


worst = 0.0
for s in range(STEPS):
    x = data[s].chunk(d.size)[d.rank]
    tgt = target[s].chunk(d.size)[d.rank]
    h = torch.relu(torch.nn.functional.linear(x, w1, b1))          # [B, HID/tp]
    y = tp.all_reduce(torch.nn.functional.linear(h, w2), group=t) + b2
    h_full = tp.all_gather(h, dim=-1, group=t)                      # [B, HID]
    z = torch.nn.functional.linear(h_full, hw, hb)
    loss = ((y - tgt) ** 2).mean() + (z ** 2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    d.all_reduce([p.grad for p in mine], op="avg")
    opt.step()
    # The serial model on the whole batch (the mean over DP shards of the shards' means).
    rh = torch.relu(ref1(data[s]))
    rloss = ((ref2(rh) - target[s]) ** 2).mean() + (head(rh) ** 2).mean()
    ref_opt.zero_grad()
    rloss.backward()
    ref_opt.step()
    full = tp.all_reduce(loss.detach().reshape(1), op="avg", group=d)[0]
    worst = max(worst, abs(float(full - rloss)) / abs(float(rloss)))
pairs = [(w1, ref1.weight.chunk(t.size, 0)[t.rank]), (b1, ref1.bias.chunk(t.size, 0)[t.rank]),
         (w2, ref2.weight.chunk(t.size, 1)[t.rank]), (b2, ref2.bias), (hw, head.weight),
         (hb, head.bias)]
for p, r in pairs:
    worst = max(worst, float(((p - r).abs() / r.abs().clamp_min(1e-300)).max()))
print(f"rank {hcomm.get_rank()}: mlp worst {worst:.3e} on {hcomm.world().backend}", flush=True)
assert worst <= 1e-12, worst

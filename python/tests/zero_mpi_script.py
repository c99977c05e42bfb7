"""Run by test_zero.py under mpirun (each process a rank, backend mpi) through
python3 -m hcomm.run: hcomm.zero.shard trains the MLP of test_zero.py and every process
checks its losses and weights against its own single-process run."""
import numpy as np
import torch

import hcomm
from hcomm import zero

STEPS, BATCH, LR, MOM = 50, 12, 0.05, 0.9


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).double()


g = torch.Generator().manual_seed(1)
xs = torch.randn(STEPS, BATCH, 5, generator=g, dtype=torch.float64)
ys = torch.randn(STEPS, BATCH, 3, generator=g, dtype=torch.float64)
ref = make()
opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOM)
want = []
for s in range(STEPS):
    opt.zero_grad()
    loss = ((ref(xs[s]) - ys[s]) ** 2).sum() / BATCH
    loss.backward()
    opt.step()
    want.append(loss.item())

w = hcomm.world()
r, n = hcomm.get_rank(), hcomm.get_world_size()
assert w.backend == "mpi"
per = BATCH // n
model = make()
z = zero.shard(model, group=w, stage=3, bucket_bytes=256)
opt = torch.optim.SGD(z.parameters(), lr=LR, momentum=MOM)
got = np.zeros(STEPS)
for s in range(STEPS):
    z.zero_grad()
    x, y = xs[s][r * per:(r + 1) * per], ys[s][r * per:(r + 1) * per]
    loss = ((model(x) - y) ** 2).sum() / BATCH
    loss.backward()
    opt.step()
    got[s] = loss.item()
w.all_reduce([got], op="sum")
np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
model(xs[0])
for p, q in zip(model.parameters(), ref.parameters()):
    np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, atol=1e-15)
z.close()
print(f"rank {r}: zero ok", flush=True)

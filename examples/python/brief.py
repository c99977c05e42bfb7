"""The design brief's Python snippets, as written, on 8 ranks:
    /usr/bin/python3 -m hcomm.run -n 8 examples/python/brief.py            (processes, mpi)
    /usr/bin/python3 -m hcomm.run --threads -n 8 examples/python/brief.py  (threads, local)"""
import torch

import hcomm
from hcomm import moe, pp, tp
from hcomm.pp import PP_TAG_BACKWARD, PP_TAG_FORWARD

backend = hcomm.world().backend  # 'hccl' would be a ValueError naming the built backends
ctx = hcomm.init_context(tp_size=4, pp_size=2, dp_size=1, backend=backend)
tp_group = ctx.tp
gen = torch.Generator().manual_seed(hcomm.get_rank())  # threads share torch's global RNG
x = torch.randn(2, 8, generator=gen)

y = tp.all_reduce(x, group=tp_group)                 # sum over the 4 TP ranks
z = tp.all_gather(x, dim=-1, group=tp_group)         # [2, 32]

out = torch.tanh(x)
if ctx.pp.rank == 0:
    pp.send(out, dst=1, tag=PP_TAG_FORWARD)
    grad = pp.recv(src=1, tag=PP_TAG_BACKWARD)       # shape and dtype come with the message
    assert torch.equal(grad, out * 2)
else:
    act = pp.recv(src=0, tag=PP_TAG_FORWARD)
    pp.send(act * 2, dst=0, tag=PP_TAG_BACKWARD)

tokens = torch.randn(6, 8, generator=gen)
expert_ids = torch.randint(0, 8, (6,), generator=gen, dtype=torch.int32)
counts = torch.zeros(8 // ctx.tp.size, dtype=torch.int64)
routed, reverse_expert_ids = moe.all_to_all(tokens, expert_ids, num_experts=8,
                                            tokens_per_expert=counts,
                                            group=ctx.tp)  # EP over the TP ranks here
expert_output = routed * 3
tokens_per_npu = counts.tolist()                     # an int, a list or a tensor
back = moe.all_to_all(expert_output, reverse_expert_ids, num_experts=8,
                      tokens_per_expert=tokens_per_npu)  # the reverse: original token order
assert torch.allclose(back, tokens * 3)

grads = [torch.ones(4) * hcomm.get_rank()]
ctx.dp.all_reduce(grads, op="avg")                   # over the DP group, in place
ctx.destroy()
g = hcomm.init_tensor_parallel_group(tp_rank=hcomm.get_rank() % 4, tp_size=4)
print(f"rank {hcomm.get_rank()}: brief ok (tp rank {g.rank} of {g.size}, "
      f"{int(counts.sum())} rows for my experts)", flush=True)

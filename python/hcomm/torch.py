"""PyTorch autograd over hcomm: the four Megatron TP regions and MoE dispatch/combine as
torch.autograd.Functions whose forward and backward are each one C call, and two thin
tensor-parallel layers built on them (Megatron-LM's ColumnParallelLinear/RowParallelLinear)."""
import torch

from . import _moe_calls as _moe
from . import _tp_calls as _tp
from .context import default_group


def _region(name, fwd, bwd, with_dim):
    """A Function class: forward = tp.<name>_fwd, backward = tp.<name>_bwd."""

    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return fwd(x.detach().contiguous(), *((dim,) if with_dim else ()), group=group)

    def backward(ctx, grad):
        g = bwd(grad.contiguous(), *((ctx.dim,) if with_dim else ()), group=ctx.group)
        return g, None, None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


CopyTo = _region("CopyTo", _tp.copy_to_fwd, _tp.copy_to_bwd, False)
ReduceFrom = _region("ReduceFrom", _tp.reduce_from_fwd, _tp.reduce_from_bwd, False)
ScatterTo = _region("ScatterTo", _tp.scatter_to_fwd, _tp.scatter_to_bwd, True)
GatherFrom = _region("GatherFrom", _tp.gather_from_fwd, _tp.gather_from_bwd, True)


def copy_to(x, group=None):
    return CopyTo.apply(x, None, default_group("tp", group))


def reduce_from(x, group=None):
    return ReduceFrom.apply(x, None, default_group("tp", group))


def scatter_to(x, dim=-1, group=None):
    return ScatterTo.apply(x, dim, default_group("tp", group))


def gather_from(x, dim=-1, group=None):
    return GatherFrom.apply(x, dim, default_group("tp", group))


class MoeDispatch(torch.autograd.Function):
    """tokens [N, H] -> rows received [R, H]; backward: hcomm_moe_dispatch_bwd (a combine).
    The routing goes to the caller through `box` (a Function returns tensors only)."""

    @staticmethod
    def forward(ctx, tokens, expert_ids, num_experts, kw, box):
        out, ctx.routing = _moe.dispatch(tokens.detach().contiguous(), expert_ids, num_experts,
                                         **kw)
        box.append(ctx.routing)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _moe.dispatch_bwd(grad.contiguous(), ctx.routing), None, None, None, None


class MoeCombine(torch.autograd.Function):
    """expert outputs [R, H'] -> [N, H'] in token order; backward: hcomm_moe_combine_bwd."""

    @staticmethod
    def forward(ctx, expert_out, routing):
        ctx.routing = routing
        return _moe.combine(expert_out.detach().contiguous(), routing)

    @staticmethod
    def backward(ctx, grad):
        return _moe.combine_bwd(grad.contiguous(), ctx.routing), None


def moe_dispatch(tokens, expert_ids, num_experts, **kw):
    """Differentiable dispatch: (rows received, routing). Top-k weights get no gradient here
    (pass them to the combine's caller side instead)."""
    box = []
    out = MoeDispatch.apply(tokens, expert_ids, num_experts, kw, box)
    return out, box[0]


def moe_combine(expert_out, routing):
    return MoeCombine.apply(expert_out, routing)


class ColumnParallelLinear(torch.nn.Module):
    """y = x A^T + b with A [out, in] split by rows (output columns) over the TP group: each
    rank holds out/tp rows. Input is copied to the region (backward all_reduce); the output
    stays split unless gather_output (Megatron-LM, Shoeybi et al. 2019, section 3)."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False, group=None,
                 dtype=None, generator=None):
        super().__init__()
        self.group = default_group("tp", group)
        if out_features % self.group.size:
            raise ValueError(f"ColumnParallelLinear: out_features={out_features} is not "
                             f"divisible by the TP size {self.group.size}")
        self.gather_output = gather_output
        n = out_features // self.group.size
        self.weight = torch.nn.Parameter(torch.empty(n, in_features, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(n, dtype=dtype)) if bias else None
        with torch.no_grad():  # a per-rank generator: threads share torch's global one
            self.weight.normal_(0.0, in_features ** -0.5, generator=generator)

    def load_full(self, weight, bias=None):
        """Copies this rank's rows of the full weight [out, in] (and bias [out])."""
        with torch.no_grad():
            self.weight.copy_(weight.chunk(self.group.size, 0)[self.group.rank])
            if bias is not None:
                self.bias.copy_(bias.chunk(self.group.size, 0)[self.group.rank])
        return self

    def forward(self, x):
        y = torch.nn.functional.linear(copy_to(x, self.group), self.weight, self.bias)
        return gather_from(y, -1, self.group) if self.gather_output else y


class RowParallelLinear(torch.nn.Module):
    """y = x A^T + b with A [out, in] split by columns (input features) over the TP group;
    the partial products are summed with reduce_from, and the bias added once after it."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True,
                 group=None, dtype=None, generator=None):
        super().__init__()
        self.group = default_group("tp", group)
        if in_features % self.group.size:
            raise ValueError(f"RowParallelLinear: in_features={in_features} is not "
                             f"divisible by the TP size {self.group.size}")
        self.input_is_parallel = input_is_parallel
        n = in_features // self.group.size
        self.weight = torch.nn.Parameter(torch.empty(out_features, n, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        with torch.no_grad():  # a per-rank generator: threads share torch's global one
            self.weight.normal_(0.0, in_features ** -0.5, generator=generator)

    def load_full(self, weight, bias=None):
        """Copies this rank's columns of the full weight [out, in] (and the whole bias)."""
        with torch.no_grad():
            self.weight.copy_(weight.chunk(self.group.size, 1)[self.group.rank])
            if bias is not None:
                self.bias.copy_(bias)
        return self

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to(x, -1, self.group)
        y = reduce_from(torch.nn.functional.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y

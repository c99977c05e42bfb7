"""Autograd for the plain calls (hcomm.tp.all_reduce, all_gather, reduce_scatter, split): the
forward runs outside autograd (blocking or async_op), then one Function ties its result to
the input, with the backward the call's role defines. torch is imported on first use only."""
import sys

_FN = None


def needed(x):
    """True when x is a torch tensor that requires grad and autograd is recording."""
    return getattr(x, "requires_grad", False) and sys.modules["torch"].is_grad_enabled()


def _function():
    global _FN
    if _FN is None:
        import torch

        class Attach(torch.autograd.Function):
            """forward: the result computed outside (box[0]); backward: box[1](grad)."""

            @staticmethod
            def forward(ctx, x, box):
                ctx.bwd = box[1]
                return box[0]

            @staticmethod
            def backward(ctx, grad):
                return ctx.bwd(grad.contiguous()), None

        _FN = Attach
    return _FN


def attach(what, x, out, run, bwd):
    """run(x.detach()) -> a tensor or a Work whose result is known at issue; returns it with
    a grad_fn whose backward is bwd(grad). out= is refused, as torch refuses out= arguments
    of differentiable calls."""
    if out is not None:
        raise RuntimeError(f"{what}: out= is not allowed when the input requires grad "
                           f"(autograd cannot record a write into a given tensor); drop out=")
    res = run(x.detach())
    if hasattr(res, "wait"):  # a Work: its output buffer is filled when it completes
        res._result = _function().apply(x, [res._result, bwd])
        return res
    return _function().apply(x, [res, bwd])

"""STAND-IN of quack.rmsnorm (0.6.5): ``rmsnorm`` with the real signature, plain torch."""


import torch
from torch import Tensor

from quack._layout import assert_copy_width, assert_layout, div_for

#: Every call's arguments, for the adapters' translation tests.
CALLS: list = []


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, weight_offset):
        assert x.dim() == 2
        supported = {torch.float16, torch.bfloat16, torch.float32}
        assert x.dtype in supported, "Unsupported dtype"
        assert weight.dtype in supported, "Weight must be float32, float16 or bfloat16"
        n = x.shape[-1]
        assert_copy_width(n, x, weight)
        div = div_for(n, x, weight)
        assert_layout(x, div, "x")
        assert_layout(weight, div, "weight")
        xf = x.float()
        rstd = torch.rsqrt(xf.square().mean(-1) + eps)
        # As the real kernel: x_hat * (w_f32 + weight_offset) in float32, one cast at the end.
        out = (xf * rstd[:, None] * (weight.float() + weight_offset)).to(x.dtype)
        ctx.save_for_backward(x, weight, rstd)
        ctx.weight_offset = weight_offset
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, rstd = ctx.saved_tensors
        # rmsnorm_bwd_ref of the real package: float32 math, dX in x's dtype, dW summed in
        # float32 and cast to the weight's dtype.
        xhat = x.float() * rstd[:, None]
        wdy = dout.float() * (weight.float() + ctx.weight_offset)
        c1 = (xhat * wdy).mean(-1, keepdim=True)
        dx = ((wdy - xhat * c1) * rstd[:, None]).to(x.dtype)
        dw = (dout.float() * xhat).sum(0).to(weight.dtype)
        return dx, dw, None, None


def rmsnorm(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    residual_dtype: torch.dtype | None = None,
    eps: float = 1e-6,
    prenorm: bool = False,
    weight_offset: float = 0.0,
) -> Tensor:
    CALLS.append(dict(x=x, weight=weight, bias=bias, residual=residual, out_dtype=out_dtype,
                      residual_dtype=residual_dtype, eps=eps, prenorm=prenorm, weight_offset=weight_offset))
    # The stand-in implements only what the adapters use.
    assert bias is None and residual is None and out_dtype is None and not prenorm
    assert weight is not None and weight.dim() == 1
    shape = x.shape
    # As the real wrapper: flatten (reshape, which may copy), then only a last-dim fix-up.
    x_flat = x.reshape(-1, shape[-1])
    if x_flat.stride(-1) != 1:
        x_flat = x_flat.contiguous()
    return RMSNormFunction.apply(x_flat, weight, eps, weight_offset).reshape(shape)

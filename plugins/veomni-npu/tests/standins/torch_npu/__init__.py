"""A STAND-IN for ``torch_npu``, in plain torch on the CPU, for the veomni-npu tests.

The real torch_npu needs an Ascend NPU and the CANN toolkit. This package implements only
the operators the veomni-npu adapters call, with the semantics and input limits Ascend
documents (torch_npu API reference, op-plugin ``op_plugin_functions.yaml`` and
``derivatives.yaml``, the CANN kernels' docs and golden references), so the adapters'
argument translation, layouts, dtype handling and autograd wiring are exercised. It says
nothing about the real kernels' numerics or speed: nothing here has run on an NPU.

Where the real operator has an autograd formula (npu_rms_norm, npu_rotary_mul, npu_swiglu,
npu_moe_token_permute, npu_moe_token_unpermute, npu_fusion_attention), the stand-in is
differentiable through plain torch ops. ``npu_grouped_matmul`` has none in torch_npu, so the stand-in returns
results detached from the graph: an adapter that forgot its own backward loses gradients
here too.

Unlike the real package, importing this one does not install ``torch.npu`` (tests that need
``torch.npu`` patch it in and restore it).
"""

from __future__ import annotations

import torch

IS_STAND_IN = True
__version__ = "2.7.1+standin"

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _fail(op: str, msg: str) -> None:
    # The real operators raise RuntimeError (ACL / TORCH_CHECK errors).
    raise RuntimeError(f"{op} (stand-in torch_npu): {msg}")


def _need_float(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype not in _FLOATS:
            _fail(op, f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")


# --------------------------------------------------------------------------- npu_rms_norm
#: (x, gamma) dtype pairs of aclnnRmsNorm on Atlas A2/A3 (torch_npu docs, "约束说明").
_RMS_PAIRS = {
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
}


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)``: ``y = x * rstd * gamma`` in float32, cast to x's dtype once (the CANN golden)."""
    op = "npu_rms_norm"
    _need_float(op, self=self, gamma=gamma)
    if (self.dtype, gamma.dtype) not in _RMS_PAIRS:
        _fail(op, f"unsupported dtype pair self {self.dtype} / gamma {gamma.dtype}")
    if not 2 <= self.dim() <= 8:
        _fail(op, f"self must be 2-8-D, got shape {tuple(self.shape)}")
    g = gamma.dim()
    if g < 1 or g >= self.dim() or tuple(self.shape[-g:]) != tuple(gamma.shape):
        _fail(op, f"gamma shape {tuple(gamma.shape)} must equal the trailing dims of self {tuple(self.shape)}")
    dims = tuple(range(self.dim() - g, self.dim()))
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (x * rstd * gamma.float()).to(self.dtype)
    return y, rstd


# --------------------------------------------------------------------------- npu_rotary_mul
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def npu_rotary_mul(
    input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half", rotate: torch.Tensor | None = None
) -> torch.Tensor:
    """``input * r1 + rotate_half(input) * r2`` ('half' mode), computed in float32, output in input's dtype."""
    op = "npu_rotary_mul"
    if rotary_mode != "half" or rotate is not None:
        _fail(op, "the stand-in implements rotary_mode='half' without a rotate matrix only")
    _need_float(op, input=input, r1=r1, r2=r2)
    if input.dim() not in (3, 4) or r1.dim() != input.dim() or r2.shape != r1.shape:
        _fail(op, f"input/r1/r2 must be 3-D or 4-D alike, got {tuple(input.shape)}, {tuple(r1.shape)}, "
                  f"{tuple(r2.shape)}")
    d = input.shape[-1]
    if d % 2 or d >= 896:
        _fail(op, f"the last dim D must be even and below 896, got {d}")
    if input.dim() == 4:
        b, n, s, _ = input.shape
        if b >= 1000 or n >= 1000:
            _fail(op, f"B and N must be below 1000, got {tuple(input.shape)}")
        # BNSD input: r1/r2 layouts 11SD, B1SD or BNSD.
        if r1.shape[2:] != (s, d) or tuple(r1.shape[:2]) not in {(1, 1), (b, 1), (b, n)}:
            _fail(op, f"r1/r2 {tuple(r1.shape)} is not a supported layout (11SD, B1SD, BNSD) for {tuple(input.shape)}")
        if (r1.requires_grad or r2.requires_grad) and b * n > 1024:
            _fail(op, f"computing the r1/r2 gradient needs B*N <= 1024, got {b}*{n}")
    # op_api casts r1/r2 to the input's dtype when they differ (RotaryMulKernelNpuOpApi.cpp).
    r1, r2 = r1.to(input.dtype), r2.to(input.dtype)
    x = input.float()
    return (x * r1.float() + _rotate_half(x) * r2.float()).to(input.dtype)


# --------------------------------------------------------------------------- npu_swiglu
def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``silu(A) * B`` for ``A, B = chunk(input, 2, dim)`` (A: the first half), float32 math."""
    op = "npu_swiglu"
    _need_float(op, input=input)
    if not 1 <= input.dim() <= 8:
        _fail(op, f"input must be 1-8-D, got shape {tuple(input.shape)}")
    if not input.is_contiguous():
        _fail(op, "non-contiguous input is not supported")
    if input.numel() == 0:
        _fail(op, "empty input is not supported")
    if input.shape[dim] % 2:
        _fail(op, f"the size along dim {dim} must be even, got {input.shape[dim]}")
    a, b = torch.chunk(input.float(), 2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(input.dtype)


# --------------------------------------------------------------------------- MoE permutation
def npu_moe_token_permute(
    tokens: torch.Tensor, indices: torch.Tensor, num_out_tokens: int | None = None, padded_mode: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(permuted, sorted_indices)``: ``first = argsort(flatten(indices))``,
    ``sorted_indices = argsort(first)`` (int32), ``permuted[sorted_indices[i]] = tokens[i // topK]``."""
    op = "npu_moe_token_permute"
    _need_float(op, tokens=tokens)
    if padded_mode:
        _fail(op, "padded_mode=True is not supported")
    if num_out_tokens not in (None, 0):
        _fail(op, "the stand-in implements num_out_tokens=None (no token dropping) only")
    if tokens.dim() != 2:
        _fail(op, f"tokens must be 2-D [num_tokens, hidden], got {tuple(tokens.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        _fail(op, f"indices must be int32 or int64, got {indices.dtype}")
    if indices.dim() not in (1, 2) or indices.shape[0] != tokens.shape[0]:
        _fail(op, f"indices must be [num_tokens, topK] or [num_tokens], got {tuple(indices.shape)}")
    top_k = 1 if indices.dim() == 1 else indices.shape[1]
    if indices.dim() == 2 and top_k > 512:
        _fail(op, f"topK must be at most 512, got {top_k}")
    flat = indices.reshape(-1).long()
    n = flat.numel()
    # An argsort of the expert ids; the docs do not say it is stable, so the stand-in orders the
    # routes of one expert in REVERSE (a valid argsort): an adapter relying on order within a
    # group would fail here.
    first = torch.argsort(flat * n + (n - 1 - torch.arange(n, device=flat.device)))
    sorted_indices = torch.argsort(first).to(torch.int32)
    permuted = tokens.index_select(0, first // top_k)
    return permuted, sorted_indices


def npu_moe_token_unpermute(
    permuted_tokens: torch.Tensor,
    sorted_indices: torch.Tensor,
    probs: torch.Tensor | None = None,
    padded_mode: bool = False,
    restore_shape: list[int] | None = None,
) -> torch.Tensor:
    """``out[i] = sum_j probs[i, j] * permuted[sorted_indices[i*topK + j]]`` (float32 sum, output in
    permuted_tokens' dtype)."""
    op = "npu_moe_token_unpermute"
    _need_float(op, permuted_tokens=permuted_tokens)
    if padded_mode or restore_shape is not None:
        _fail(op, "padded_mode / restore_shape are not supported")
    if sorted_indices.dtype != torch.int32:
        _fail(op, f"sorted_indices must be int32, got {sorted_indices.dtype}")
    n = permuted_tokens.shape[0]
    if permuted_tokens.dim() != 2 or sorted_indices.shape != (n,):
        _fail(op, f"permuted_tokens must be [N, H] and sorted_indices [N], got {tuple(permuted_tokens.shape)}, "
                  f"{tuple(sorted_indices.shape)}")
    rows = permuted_tokens.index_select(0, sorted_indices.long())
    if probs is None:
        return rows
    _need_float(op, probs=probs)
    # Same-dtype probs only: the documented dtypes are listed per tensor, never as mixed pairs,
    # and Ascend's own callers (MindSpeed) cast the tokens to the probs' dtype first.
    if probs.dtype != permuted_tokens.dtype:
        _fail(op, f"probs dtype {probs.dtype} differs from permuted_tokens dtype {permuted_tokens.dtype}")
    if probs.dim() != 2 or probs.numel() != n or probs.shape[1] > 512:
        _fail(op, f"probs must be [num_tokens, topK] with num_tokens*topK = {n} and topK <= 512, "
                  f"got {tuple(probs.shape)}")
    t, k = probs.shape
    out = (rows.float().view(t, k, -1) * probs.float().unsqueeze(-1)).sum(dim=1)
    return out.to(permuted_tokens.dtype)


# --------------------------------------------------------------------------- npu_grouped_matmul
def _group_sizes(group_list: torch.Tensor, group_list_type: int, groups: int, total: int) -> list[int]:
    op = "npu_grouped_matmul"
    if not isinstance(group_list, torch.Tensor) or group_list.dtype != torch.int64 or group_list.dim() != 1:
        _fail(op, "the stand-in implements a 1-D int64 tensor group_list only")
    if group_list.numel() != groups or groups > 1024:
        _fail(op, f"group_list has {group_list.numel()} entries for {groups} groups (at most 1024)")
    vals = [int(v) for v in group_list.tolist()]
    if group_list_type == 0:
        if any(v < 0 for v in vals) or any(b < a for a, b in zip(vals, vals[1:])):
            _fail(op, f"group_list_type=0 needs a non-negative non-decreasing cumsum, got {vals}")
        if vals[-1] != total:
            _fail(op, f"the last cumsum value {vals[-1]} must equal the grouped axis size {total}")
        return [b - a for a, b in zip([0] + vals[:-1], vals)]
    if group_list_type == 1:
        if groups == 1:
            _fail(op, "group_list_type=1 needs more than one group")
        if any(v < 0 for v in vals) or sum(vals) != total:
            _fail(op, f"group_list_type=1 needs non-negative counts summing to {total}, got {vals}")
        return vals
    _fail(op, f"the stand-in implements group_list_type 0 and 1 only, got {group_list_type}")
    raise AssertionError  # unreachable


def npu_grouped_matmul(
    x: list[torch.Tensor],
    weight: list[torch.Tensor],
    *,
    bias: list[torch.Tensor] | None = None,
    group_list: torch.Tensor | None = None,
    split_item: int = 0,
    group_type: int | None = None,
    group_list_type: int = 0,
    output_dtype: torch.dtype | None = None,
    **unsupported: object,
) -> list[torch.Tensor]:
    """The single-tensor forms the adapters use (no autograd, as in torch_npu):

    * ``group_type=0`` (M grouped): ``x [M, K]``, ``weight [E, K, N]`` -> ``[M, N]``, rows of
      group e times ``weight[e]``;
    * ``group_type=2`` (K grouped): ``x [K', M]``, ``weight [M, N]`` -> ``[E, K', N]``,
      block e = ``x[:, cols of e] @ weight[rows of e]`` (zeros for an empty group).

    float32 accumulation, output in x's dtype.
    """
    op = "npu_grouped_matmul"
    if any(v is not None for v in unsupported.values()) or bias is not None or output_dtype is not None:
        _fail(op, "the stand-in implements the non-quantised form without bias / output_dtype only")
    if not (isinstance(x, list) and isinstance(weight, list) and len(x) == 1 and len(weight) == 1):
        _fail(op, "the stand-in implements one x tensor and one weight tensor (single-tensor mode) only")
    if split_item not in (2, 3):
        _fail(op, f"single-tensor output needs split_item 2 or 3, got {split_item}")
    a, w = x[0], weight[0]
    _need_float(op, x=a, weight=w)
    if a.dtype != w.dtype:
        _fail(op, f"x {a.dtype} and weight {w.dtype} must have the same dtype")
    if a.dim() != 2:
        _fail(op, f"x must be 2-D, got {tuple(a.shape)}")
    if group_type == 0:
        if w.dim() != 3 or w.shape[1] != a.shape[1]:
            _fail(op, f"M grouping needs weight [E, K, N] with K = {a.shape[1]}, got {tuple(w.shape)}")
        if a.stride(-1) != 1:
            _fail(op, "x must not be transposed for M grouping")
        if a.shape[1] >= 65536 or w.shape[2] >= 65536:
            _fail(op, "inner dims must be below 65536")
        sizes = _group_sizes(group_list, group_list_type, w.shape[0], a.shape[0])
        with torch.no_grad():
            out = torch.empty(a.shape[0], w.shape[2], dtype=a.dtype, device=a.device)
            start = 0
            for e, n in enumerate(sizes):
                out[start:start + n] = (a[start:start + n].float() @ w[e].float()).to(a.dtype)
                start += n
        return [out]
    if group_type == 2:
        if w.dim() != 2 or w.shape[0] != a.shape[1]:
            _fail(op, f"K grouping needs x [K', M] and weight [M, N], got {tuple(a.shape)}, {tuple(w.shape)}")
        groups = group_list.numel() if isinstance(group_list, torch.Tensor) else 0
        sizes = _group_sizes(group_list, group_list_type, groups, a.shape[1])
        with torch.no_grad():
            out = torch.zeros(groups, a.shape[0], w.shape[1], dtype=a.dtype, device=a.device)
            start = 0
            for e, n in enumerate(sizes):
                if n:
                    out[e] = (a[:, start:start + n].float() @ w[start:start + n].float()).to(a.dtype)
                start += n
        return [out]
    _fail(op, f"the stand-in implements group_type 0 and 2 only, got {group_type}")
    raise AssertionError  # unreachable


# --------------------------------------------------------------------------- npu_fusion_attention
_NO_BAND = 2147483647
#: The compressed causal mask sparse modes 2 and 3 take (torch_npu docs): triu(ones(2048, 2048), 1).
_COMPRESSED = 2048


def _attention_mask_rows(op: str, atten_mask: torch.Tensor | None, sparse_mode: int, b: int, n: int, sq: int, sk: int,
                         pre: int, nxt: int, varlen: bool) -> torch.Tensor | None:
    """Boolean ``[b or 1, n or 1, sq, sk]``, True = masked, for one call (or one varlen document)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    if sparse_mode in (2, 3):
        if atten_mask is None or tuple(atten_mask.shape) != (_COMPRESSED, _COMPRESSED):
            _fail(op, f"sparse_mode={sparse_mode} takes the compressed {_COMPRESSED}x{_COMPRESSED} causal atten_mask, "
                      f"got {None if atten_mask is None else tuple(atten_mask.shape)}")
        want = torch.ones(_COMPRESSED, _COMPRESSED, dtype=torch.bool).triu(1)
        if not torch.equal(atten_mask.cpu().bool(), want):
            _fail(op, f"the compressed atten_mask of sparse_mode={sparse_mode} must be triu(ones(2048, 2048), 1) "
                      "(True above the diagonal)")
        # 2: causal from the top-left corner; 3: from the bottom-right corner.
        shift = 0 if sparse_mode == 2 else sk - sq
        return (j > i + shift)[None, None]
    # sparse_mode 0 (defaultMask): without a mask everything is computed, pre/next ignored.
    if atten_mask is None:
        return None
    if varlen:
        _fail(op, "the stand-in implements a varlen (TND) atten_mask only as the compressed mask of sparse_mode 2/3")
    shape = tuple(atten_mask.shape)
    forms = {(b, n, sq, sk), (b, 1, sq, sk), (1, 1, sq, sk), (sq, sk)}  # BNSS, B1SS, 11SS, SS
    if shape not in forms:
        _fail(op, f"atten_mask {shape} is none of BNSS, B1SS, 11SS, SS for B={b}, N={n}, Sq={sq}, Skv={sk}")
    mask = atten_mask.bool().reshape((1, 1, sq, sk) if len(shape) == 2 else shape)
    # The band (top-left origin), as the docs' reference builds it: triu(next + 1) | tril(-pre - 1).
    return mask | ((j - i > nxt) | (i - j > pre))[None, None]


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor | None, scale: float,
                    keep_prob: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[B, N, S, D]`` in float64: softmax(scale * q k^T, masked -> -inf), dropout, @ v; GQA by head groups."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)  # query head h reads key/value head h // rep
    v = v.repeat_interleave(rep, dim=1)
    scores = scale * (q @ k.transpose(-1, -2))
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))  # a row with every key masked: NaN, never guessed
    probs = torch.softmax(scores, dim=-1)
    if keep_prob < 1.0:
        probs = probs * torch.bernoulli(torch.full_like(probs, keep_prob)) / keep_prob
    row_max = scores.amax(dim=-1, keepdim=True)
    row_sum = (scores - row_max).exp().sum(dim=-1, keepdim=True)
    return probs @ v, row_max, row_sum


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    *,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = _NO_BAND,
    next_tockens: int = _NO_BAND,
    inner_precise: int = 0,
    prefix: list[int] | None = None,
    actual_seq_qlen: list[int] | None = None,
    actual_seq_kvlen: list[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """``Dropout(Softmax(Mask(scale * q k^T, atten_mask)), keep_prob) @ v`` (torch_npu docs), in float64,
    output in query's dtype; ``atten_mask`` True = masked (not computed). Returns the 7-tuple whose
    ``[0]`` is the output (``[1]``/``[2]`` the softmax max and sum, float32, 8 wide; ``[3]`` reserved).

    Layouts implemented: ``BNSD``, ``BSND`` and ``TND`` (varlen: ``actual_seq_qlen`` /
    ``actual_seq_kvlen`` are the cumulative ends, without the leading 0, at most 1024 documents).
    Sparse modes implemented: 0 (a full BNSS/B1SS/11SS/SS mask, with the pre/next band; no mask:
    everything), 2 (top-left causal) and 3 (bottom-right causal; per document in TND), both with
    the compressed 2048x2048 mask. GQA: ``head_num`` is the query's head count, the key/value
    head count divides it. Not implemented (refused): pse, padding_mask, prefix, BSH/SBH, modes 1, 4-8.
    """
    op = "npu_fusion_attention"
    _need_float(op, query=query, key=key, value=value)
    if not query.dtype == key.dtype == value.dtype:
        _fail(op, f"query/key/value dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}")
    if pse is not None or prefix is not None:
        _fail(op, "the stand-in implements no pse / prefix")
    if padding_mask is not None:
        _fail(op, "padding_mask is not supported (torch_npu docs: not supported yet)")
    if not 0.0 < keep_prob <= 1.0:
        _fail(op, f"keep_prob must be in (0, 1], got {keep_prob}")
    if sparse_mode not in (0, 2, 3):
        _fail(op, f"the stand-in implements sparse_mode 0, 2 and 3, got {sparse_mode}")
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
        _fail(op, f"atten_mask must be bool or uint8 (1 = masked), got {atten_mask.dtype}")
    varlen = input_layout == "TND"
    if varlen:
        dims = 3
    elif input_layout in ("BNSD", "BSND"):
        dims = 4
    else:
        _fail(op, f"the stand-in implements input_layout BNSD, BSND and TND, got {input_layout!r}")
    if not query.dim() == key.dim() == value.dim() == dims:
        _fail(op, f"{input_layout} takes {dims}-D query/key/value, got {tuple(query.shape)}, {tuple(key.shape)}, "
                  f"{tuple(value.shape)}")
    if input_layout == "BSND":
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    heads_at = 1  # TND: [T, N, D]; BNSD (and BSND, viewed as BNSD): [B, N, S, D]
    nq, nk = query.shape[heads_at], key.shape[heads_at]
    if head_num != nq:
        _fail(op, f"head_num {head_num} is not the query's head count {nq}")
    if nk == 0 or nq % nk or nq > 256:
        _fail(op, f"query heads ({nq}) must be a multiple of key/value heads ({nk}), at most 256")
    if key.shape[:-1] != value.shape[:-1]:
        _fail(op, f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same shape but D")
    dq, dk, dv = query.shape[-1], key.shape[-1], value.shape[-1]
    if dq != dk or dv > dk or not 1 <= dq <= 768:
        _fail(op, f"head dims must satisfy Dq = Dk >= Dv, 1..768; got {dq}, {dk}, {dv}")
    q, k, v = query.double(), key.double(), value.double()
    if not varlen:
        if actual_seq_qlen is not None or actual_seq_kvlen is not None:
            _fail(op, "actual_seq_qlen / actual_seq_kvlen belong to the TND (varlen) layout")
        b, sq, sk = q.shape[0], q.shape[2], k.shape[2]
        if key.shape[0] != b:
            _fail(op, f"batch sizes differ: query {b}, key {key.shape[0]}")
        masked = _attention_mask_rows(op, atten_mask, sparse_mode, b, nq, sq, sk, pre_tockens, next_tockens, False)
        out, row_max, row_sum = _attention_core(q, k, v, masked, scale, keep_prob)
        if input_layout == "BSND":
            out = out.transpose(1, 2)
        row_max, row_sum = row_max.expand(*row_max.shape[:-1], 8), row_sum.expand(*row_sum.shape[:-1], 8)
    else:
        ends_q, ends_k = _varlen_ends(op, actual_seq_qlen, q.shape[0]), _varlen_ends(op, actual_seq_kvlen, k.shape[0])
        if len(ends_q) != len(ends_k):
            _fail(op, f"actual_seq_qlen has {len(ends_q)} entries, actual_seq_kvlen {len(ends_k)}")
        pieces, maxes, sums = [], [], []
        for (q0, q1), (k0, k1) in zip(zip([0, *ends_q[:-1]], ends_q), zip([0, *ends_k[:-1]], ends_k)):
            qd, kd, vd = (t[a:z].transpose(0, 1)[None] for t, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
            masked = _attention_mask_rows(op, atten_mask, sparse_mode, 1, nq, q1 - q0, k1 - k0, pre_tockens,
                                          next_tockens, True)
            if masked is not None and bool(masked.all(dim=-1).any()):
                _fail(op, "in the varlen layout atten_mask must not mask a whole row (docs: no padding rows)")
            o, m, s_ = _attention_core(qd, kd, vd, masked, scale, keep_prob)
            pieces.append(o[0].transpose(0, 1))
            maxes.append(m[0].transpose(0, 1))
            sums.append(s_[0].transpose(0, 1))
        out = torch.cat(pieces) if pieces else q.new_zeros(0, nq, dv)
        row_max = torch.cat(maxes).expand(-1, -1, 8) if maxes else q.new_zeros(0, nq, 8)
        row_sum = torch.cat(sums).expand(-1, -1, 8) if sums else q.new_zeros(0, nq, 8)
    stats = (row_max.detach().float().contiguous(), row_sum.detach().float().contiguous())
    return out.to(query.dtype), stats[0], stats[1], query.new_zeros(0), 0, 0, 0


def _varlen_ends(op: str, ends: list[int] | None, total: int) -> list[int]:
    if ends is None or isinstance(ends, torch.Tensor) or not all(isinstance(e, int) for e in ends):
        _fail(op, "the TND layout needs actual_seq_qlen and actual_seq_kvlen as lists of ints (cumulative ends)")
    ends = list(ends)
    if not 1 <= len(ends) <= 1024:
        _fail(op, f"the varlen layout takes 1 to 1024 sequences, got {len(ends)}")
    if any(b < a for a, b in zip([0, *ends[:-1]], ends)) or ends[-1] != total:
        _fail(op, f"cumulative ends {ends[:8]} must never decrease and end at T = {total} (no leading 0)")
    return ends

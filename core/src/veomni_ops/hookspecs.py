"""The plugin API: one hook per op. Each docstring is that op's *kernel contract*.

A backend is a Python distribution with an entry point in the group
``veomni_ops.backends`` naming a *light* module (no torch extension, Triton, vendor or
model import at module level). That module implements any of the hooks below with
:data:`hookimpl`; each returns an iterable of :class:`~veomni_ops.spec.KernelSpec` for
that op. The kernel itself is imported only when a config selects it (``factory``).

Every kernel must match the contract of its op, forward and backward, within the
tolerances of its spec, against the core's ``eager`` reference; ``veomni-ops check``
and the conformance kit (``veomni_ops.testing``) verify exactly this.

A complete backend, ``pyproject.toml``::

    [project.entry-points."veomni_ops.backends"]
    mybackend = "my_backend.specs"

and ``my_backend/specs.py``::

    from veomni_ops import HardwareRequirement, KernelSpec, hookimpl

    @hookimpl
    def swiglu():
        return [KernelSpec(name="mybackend", op="swiglu", variant="standard",
                           factory="my_backend.kernels:swiglu",
                           hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
                           priority=10)]
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .spec import KernelSpec

PROJECT = "veomni_ops"
ENTRY_POINT_GROUP = "veomni_ops.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class OpHookspecs:
    """One hook per op; each returns the :class:`KernelSpec` objects a backend offers for it."""

    @hookspec
    def rms_norm(self) -> Iterable[KernelSpec]:
        """RMS normalisation over the last dimension.

        Kernel signature::

            kernel(hidden_states: Tensor[..., H], weight: Tensor[H], eps: float) -> Tensor[..., H]

        Variants:

        * ``standard`` (Llama, Qwen2/3): ``x̂ = x * rsqrt(mean(x², -1) + eps)`` computed in
          float32, cast to the input dtype, then ``weight * x̂``.
        * ``offset`` (Qwen3.5, Qwen3-Next, Gemma): ``x̂ * (1 + weight)`` entirely in float32,
          cast to the input dtype at the end.

        The output has the shape and dtype of ``hidden_states``; any leading shape, rows
        need not be contiguous. Backward produces gradients for ``hidden_states`` and
        ``weight``. A standard kernel applied to an offset norm is a wrong result: the
        core refuses it.

        Example::

            @hookimpl
            def rms_norm():
                return [KernelSpec(name="mine", op="rms_norm", variant="standard",
                                   factory="my_backend.kernels.rms_norm:rms_norm")]
        """

    @hookspec
    def rotary(self) -> Iterable[KernelSpec]:
        """Rotary position embedding of queries and keys (transformers' ``rotate_half`` form).

        Kernel signature::

            kernel(q: Tensor[B, Hq, S, D], k: Tensor[B, Hk, S, D],
                   cos: Tensor[B, S, R], sin: Tensor[B, S, R]) -> tuple[Tensor, Tensor]

        ``cos``/``sin`` are what the model's rotary embedding module returns
        (``cat(freqs, freqs)``, so R is even). The first R channels of every head are
        rotated, ``x*cos + rotate_half(x)*sin``; the remaining ``D - R`` pass through
        unchanged. Outputs have the shapes and dtypes of ``q`` and ``k``.

        Variants: ``full`` (R == D) and ``partial`` (R < D, as Qwen3.5 / Qwen3-Next /
        GLM use). Backward produces gradients for ``q`` and ``k``.

        Example::

            @hookimpl
            def rotary():
                return [KernelSpec(name="mine", op="rotary", variant="full",
                                   factory="my_backend.kernels.rope:apply_rotary")]
        """

    @hookspec
    def swiglu(self) -> Iterable[KernelSpec]:
        """The gated activation of a SwiGLU MLP: ``silu(gate) * up``.

        Kernel signature::

            kernel(gate: Tensor[..., I], up: Tensor[..., I]) -> Tensor[..., I]

        The MLP module keeps its own projections: ``down_proj(kernel(gate_proj(x), up_proj(x)))``.
        Output in the input dtype (math may be float32). Backward produces gradients for
        ``gate`` and ``up``. Variant: ``standard``.

        Example::

            @hookimpl
            def swiglu():
                return [KernelSpec(name="mine", op="swiglu", variant="standard",
                                   factory="my_backend.kernels:silu_mul")]
        """

    @hookspec
    def cross_entropy(self) -> Iterable[KernelSpec]:
        """Token-level cross-entropy, returned as a **sum** over the tokens that count.

        Variants and signatures::

            logits:        kernel(logits: Tensor[N, V], labels: LongTensor[N], *,
                                  ignore_index: int = -100) -> Tensor[]  (float32)
            fused_linear:  kernel(hidden: Tensor[N, H], weight: Tensor[V, H], labels: LongTensor[N], *,
                                  bias: Tensor[V] | None = None, ignore_index: int = -100) -> Tensor[]

        The result is ``sum_i CE(z_i, labels_i)`` over ``labels_i != ignore_index``, in
        float32 (logits are upcast to float32 before the log-softmax). For
        ``fused_linear``, ``z = hidden @ weight.T (+ bias)`` computed in the input dtype
        and never held whole for all N tokens (that is its point). With every label
        ignored the sum is 0 and gradients are zero.

        The core does the rest, exactly as transformers' ``ForCausalLMLoss``: the label
        shift, then division by the number of counted tokens, or by
        ``num_items_in_batch`` under gradient accumulation. Returning the sum is what
        makes that division exact. Backward produces gradients for ``logits`` (or
        ``hidden``, ``weight`` and ``bias``).

        Example::

            @hookimpl
            def cross_entropy():
                return [KernelSpec(name="mine", op="cross_entropy", variant="fused_linear",
                                   factory="my_backend.kernels.flce:fused_linear_ce_sum")]
        """

    @hookspec
    def moe_experts(self) -> Iterable[KernelSpec]:
        """The routed experts of an MoE layer, transformers v5 layout, SiLU-gated.

        Kernel signature::

            kernel(hidden_states: Tensor[T, H], top_k_index: LongTensor[T, K],
                   top_k_weights: Tensor[T, K], gate_up_proj: Tensor[E, 2I, H],
                   down_proj: Tensor[E, H, I]) -> Tensor[T, H]

        For every token t and route k with expert ``e = top_k_index[t, k]``:
        ``g, u = (gate_up_proj[e] @ h_t).chunk(2)``; ``y_tk = down_proj[e] @ (silu(g) * u)``;
        ``out_t = sum_k top_k_weights[t, k] * y_tk``. Output in ``hidden_states.dtype``.
        It must be correct when an expert gets no token, when every token goes to one
        expert, and when a token lists the same expert twice. Backward produces
        gradients for ``hidden_states``, ``top_k_weights``, ``gate_up_proj`` and
        ``down_proj``. Variant: ``standard``.

        Example::

            @hookimpl
            def moe_experts():
                return [KernelSpec(name="mine", op="moe_experts", variant="standard",
                                   factory="my_backend.kernels.moe:experts_forward")]
        """

    @hookspec
    def load_balancing_loss(self) -> Iterable[KernelSpec]:
        """The Switch-Transformer auxiliary loss, as transformers' ``load_balancing_loss_func``.

        Kernel signature::

            kernel(gate_logits: Sequence[Tensor[T, E]], num_experts: int, top_k: int,
                   attention_mask: Tensor[B, S] | None = None) -> Tensor[]  (float32)

        One logits tensor per MoE layer (T = B*S tokens). Per layer: ``p = softmax(logits)``,
        the top-k experts of each token; over all layers and the tokens the mask keeps,
        ``f_e`` = fraction of routes to expert e and ``P_e`` = mean router probability;
        the loss is ``num_experts * sum_e f_e * P_e`` (without the model's coefficient).
        Backward produces gradients for the logits through ``P`` only. Variant: ``standard``.

        Example::

            @hookimpl
            def load_balancing_loss():
                return [KernelSpec(name="mine", op="load_balancing_loss", variant="standard",
                                   factory="my_backend.kernels:aux_loss")]
        """

    @hookspec
    def attention(self) -> Iterable[KernelSpec]:
        """Attention with the signature of transformers' ``AttentionInterface``.

        Kernel signature::

            kernel(module: nn.Module, query: Tensor[B, Hq, S, D], key: Tensor[B, Hk, Sk, D],
                   value: Tensor[B, Hk, Sk, D], attention_mask: Tensor | None, *,
                   dropout: float = 0.0, scaling: float | None = None,
                   sliding_window: int | None = None, softcap: float | None = None,
                   **kwargs) -> tuple[Tensor[B, S, Hq, D], Tensor | None]

        Hq is a multiple of Hk (GQA). ``attention_mask`` is the 4-D mask transformers
        builds for this implementation (boolean or additive ``[B, 1, S, Sk]``), or None;
        causality comes from ``module.is_causal`` / ``kwargs["is_causal"]``. Packed
        sequences arrive as ``position_ids`` / ``cu_seq_lens_q`` / ``cu_seq_lens_k`` kwargs.
        A kernel that cannot honour an argument it is given (e.g. dropout) raises.
        Returns the output in ``[B, S, Hq, D]`` and optionally the attention weights.
        Backward produces gradients for query, key and value. Variant: ``standard``.

        Example::

            @hookimpl
            def attention():
                return [KernelSpec(name="mine", op="attention", variant="standard",
                                   factory="my_backend.attn:attention_forward")]
        """

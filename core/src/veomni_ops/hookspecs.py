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

    VEOMNI_OPS_PLUGIN_API = ">=1.0,<2"   # the plugin API versions this backend was built for

    @hookimpl
    def swiglu():
        return [KernelSpec(name="mybackend", op="swiglu", variant="standard",
                           factory="my_backend.kernels:swiglu",
                           hardware=HardwareRequirement(("cuda",), min_capability=(8, 0)),
                           priority=10)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pluggy

from .spec import KernelSpec

PROJECT = "veomni_ops"
ENTRY_POINT_GROUP = "veomni_ops.backends"

#: The version of the plugin API this core provides, ``"MAJOR.MINOR"``. MAJOR goes up when a
#: backend written for the previous one may break: a hook removed or renamed, a kernel contract
#: (signature, layout, what backward produces) or the meaning of a ``KernelSpec`` field
#: changed. MINOR goes up when something is only added: a new op hook, a new variant or
#: feature, a new optional ``KernelSpec`` field. Published as ``veomni_ops.PLUGIN_API_VERSION``.
PLUGIN_API_VERSION = "1.0"

#: The module-level attribute of a spec module (the entry point's module) that declares the
#: plugin API versions the backend was built for, as a version range: ``">=1.0,<2"``.
#: Clauses are ``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=`` or ``~=`` with a version ``N`` or
#: ``N.M`` (``==N.*`` too), joined by commas, as in PEP 440. A backend outside the range is a
#: load failure (phase ``api``) that says whether to upgrade the core or the backend; a backend
#: that declares nothing loads, with a recorded warning.
PLUGIN_API_ATTR = "VEOMNI_OPS_PLUGIN_API"


class PluginAPIError(RuntimeError):
    """A backend was built for plugin API versions this core does not provide, or declares an
    invalid range."""


_CLAUSE = re.compile(r"^(>=|<=|==|!=|~=|>|<)\s*(\d+)(?:\.(\d+))?(\.\*)?$")


def _version(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a plugin API version (MAJOR.MINOR)")
    return int(m.group(1)), int(m.group(2) or 0)


def parse_api_range(declared: object) -> list[tuple[str, tuple[int, int], bool]]:
    """``">=1.0,<2"`` -> ``[(">=", (1, 0), False), ("<", (2, 0), False)]`` (the bool: ``.*``).

    Raises :class:`PluginAPIError` saying what is wrong."""
    if not isinstance(declared, str) or not declared.strip():
        raise PluginAPIError(
            f"{PLUGIN_API_ATTR} must be a version range string such as '>=1.0,<2', got "
            f"{type(declared).__name__} {declared!r}"
        )
    out = []
    for raw in declared.split(","):
        m = _CLAUSE.match(raw.strip())
        if not m or (m.group(4) and m.group(1) not in ("==", "!=")) or (m.group(1) == "~=" and m.group(3) is None):
            raise PluginAPIError(
                f"{PLUGIN_API_ATTR}={declared!r} is not a version range: {raw.strip()!r} is not a clause such as "
                "'>=1.0', '<2' or '==1.*' (operators >=, >, <=, <, ==, !=, ~=; versions N or N.M)"
            )
        op, major, minor, star = m.group(1), int(m.group(2)), m.group(3), bool(m.group(4))
        if star and minor is not None:
            raise PluginAPIError(f"{PLUGIN_API_ATTR}={declared!r}: write '==N.*' (a major version), not {raw.strip()!r}")
        out.append((op, (major, int(minor or 0)), star))
    return out


def _satisfies(v: tuple[int, int], op: str, w: tuple[int, int], star: bool) -> bool:
    if star:
        return (v[0] == w[0]) == (op == "==")
    return {
        ">=": v >= w, ">": v > w, "<=": v <= w, "<": v < w, "==": v == w, "!=": v != w,
        "~=": v >= w and v[0] == w[0],
    }[op]


def api_range_problem(declared: object, provided: str = PLUGIN_API_VERSION) -> tuple[str, str] | None:
    """``None`` if plugin API ``provided`` is in the ``declared`` range, else ``(side, why)``:
    ``side`` is ``"core"`` when the backend needs a newer core, ``"plugin"`` when it was built
    for an older API than this core provides. Raises :class:`PluginAPIError` for a bad range."""
    clauses = parse_api_range(declared)
    v = _version(provided)
    failed = [c for c in clauses if not _satisfies(v, *c)]
    if not failed:
        return None
    # A lower bound above us: the backend is newer than this core.
    newer = any((w[0] > v[0]) if star else (w >= v if op == ">" else w > v)
                for op, w, star in failed if op in (">=", ">", "==", "~="))
    return ("core" if newer else "plugin"), f"{str(declared).strip()} does not include {provided}"

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
        need not be contiguous. ``weight`` may have another float dtype than
        ``hidden_states`` (mixed precision: a float32 weight with bfloat16/float16
        activations): the output still has the activations' dtype, and the weight's
        gradient has the weight's. Backward produces gradients for ``hidden_states`` and
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

        Labels outside ``[0, V)`` other than ``ignore_index`` are an error: ``ValueError``
        naming the op and the offending label. Reading the labels costs a host
        synchronisation on an accelerator, so a kernel that does not synchronise anyway
        checks them with one reduction where that is free (CPU tensors) or asked for
        (``VEOMNI_OPS_CHECK_VALUES=1``, the debugging switch), and otherwise must not read
        out of bounds silently: it stops at a device-side assertion (PyTorch's own, in the
        core's kernels). Kernels that synchronise anyway (Liger's, Quack's) always check.

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

        Expert indices outside ``[0, E)``: ``-1`` and ``E`` mean "this route goes to no
        expert here" -- what an expert-parallel dispatcher writes for a route whose expert
        lives on another rank (transformers writes ``E``): the route contributes zero to
        ``out_t``, its ``top_k_weights`` entry gets a zero gradient, and no expert's
        weights see it. Any other index (``< -1`` or ``> E``) is an error: ``ValueError``
        naming the op, the index and E. A kernel that synchronises with the host anyway
        checks always; one that promises no synchronisation checks where reading the
        indices is free (CPU tensors) or asked for (``VEOMNI_OPS_CHECK_VALUES=1``), and
        otherwise asserts on the device where it can (``torch._assert_async`` on CUDA: the
        process stops at a device-side assertion); either way it never reads out of bounds
        and such a route never contributes to the output. The core's
        ``veomni_ops.kernels.moe.check_expert_index`` implements exactly this.

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
        Backward produces gradients for the logits through ``P`` only. With no token
        counted -- zero tokens (``T = 0``), or an ``attention_mask`` that keeps none -- the
        loss is 0 and the gradients are zero, never NaN (transformers divides 0 by 0
        there). Variant: ``standard``.

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

        Hq is a multiple of Hk (GQA). ``attention_mask`` is the mask transformers builds
        for this implementation (for ``eager``/``sdpa`` the 4-D boolean or additive
        ``[B, 1, S, Sk]``; the 2-D padding mask for flash kernels), or None; causality comes
        from ``module.is_causal`` / ``kwargs["is_causal"]``. A kernel that cannot honour an
        argument it is given (e.g. dropout) raises ``ValueError`` naming it.

        Packed sequences (documents side by side in one row) arrive as any of: a 4-D mask
        that transformers made block-diagonal from packed ``position_ids`` (authoritative
        where given); ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (cumulative document lengths of
        a packed batch, with optional ``max_length_q`` / ``max_length_k`` launch bounds, which
        mean nothing without them); ``position_ids`` of a batch of one row (``[S]`` or
        ``[1, S]``) that restart (a position that does not continue the previous one by +1
        starts a document). Position ids of other shapes (``[3, B, S]`` multimodal
        positions, a sequence-parallel shard) are not packing information; packed batches of
        those come as the mask or ``cu_seq_lens``. Every kernel either honours each of these
        -- attention never crosses a document boundary, causal within each document -- or
        refuses it with a ``ValueError`` naming the argument and which kernels honour it;
        none is ignored. The core's ``eager`` and ``sdpa`` honour all of them by building the
        block-diagonal mask (``veomni_ops.kernels.attention.packing_mask``; they also honour
        restarts in every row of ``[B, S]`` position ids, as transformers' masks do, and take
        ``cu_seq_lens`` only for a ``[1, total]`` batch); veomni-flash's kernels honour them
        with varlen launches.

        Returns the output in ``[B, S, Hq, D]`` and optionally the attention weights.
        Backward produces gradients for query, key and value. Variant: ``standard``.

        Example::

            @hookimpl
            def attention():
                return [KernelSpec(name="mine", op="attention", variant="standard",
                                   factory="my_backend.attn:attention_forward")]
        """

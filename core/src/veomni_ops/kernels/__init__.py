"""The core's plain-PyTorch kernels (heavy: these modules import torch).

One module per op; every function here follows its op's kernel contract in
:mod:`veomni_ops.hookspecs` exactly, forward and backward:

* :mod:`.rms_norm` — ``rms_norm_standard``, ``rms_norm_offset``
* :mod:`.rotary` — ``apply_rotary`` (full and partial); ``check_rotary_inputs`` (from :mod:`.checks`)
* :mod:`.swiglu` — ``silu_mul``
* :mod:`.cross_entropy` — ``cross_entropy_sum``, ``fused_linear_cross_entropy_sum``,
  ``chunked_fused_linear_cross_entropy_sum``
* :mod:`.moe` — ``routed``, ``moe_experts_eager``, ``moe_experts_grouped_mm``,
  ``grouped_mm_available``; ``check_moe_inputs``, ``check_expert_index`` (the expert-index
  rule: ``-1`` and ``E`` route nowhere) and ``NO_EXPERT`` (from :mod:`.checks`)
* :mod:`.load_balancing` — ``load_balancing_loss``
* :mod:`.attention` — ``eager_attention``, ``sdpa_attention``, ``packing_mask`` (packed
  sequences as a block-diagonal mask)
* :mod:`.checks` — THE input checks, public for every backend's adapters: tensor, dtype,
  device and shape checks, every op-level one (``check_rms_norm_inputs``, ``check_labels``,
  ``check_label_values`` -- the label-range rule --, ``check_linear_cross_entropy_inputs``,
  ``check_swiglu_inputs``, ``check_rotary_inputs``, ``check_moe_inputs``, ``check_expert_index``;
  it imports no kernel module),
  ``BackendChecks`` (the same bound to a backend's tag, dtypes and devices) and the
  value-check policy (``can_read_values``, ``VEOMNI_OPS_CHECK_VALUES``)

The ``eager`` kernels are the reference every other backend is checked against; they
reproduce transformers' own modules. Nothing is imported here so that importing one
kernel module does not import the others. The light spec module that registers them is
:mod:`veomni_ops.backends.reference`.
"""

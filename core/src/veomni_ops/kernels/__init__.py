"""The core's plain-PyTorch kernels (heavy: these modules import torch), and the input checks.

Each op's reference kernels live in its folder, ``veomni_ops/ops/<op>/kernel.py``; every
function there follows its op's kernel contract (:mod:`veomni_ops.hookspecs`) exactly, forward
and backward. The modules here keep the import paths plugins use, each the same names as its
op's ``kernel`` module:

* :mod:`.rms_norm` — ``rms_norm_standard``, ``rms_norm_offset``
* :mod:`.rotary` — ``apply_rotary`` (full and partial); ``check_rotary_inputs`` (from ``ops/rotary/checks.py``)
* :mod:`.swiglu` — ``silu_mul``
* :mod:`.cross_entropy` — ``cross_entropy_sum``, ``fused_linear_cross_entropy_sum``,
  ``chunked_fused_linear_cross_entropy_sum``
* :mod:`.moe` (``moe_experts``) — ``routed``, ``moe_experts_eager``, ``moe_experts_grouped_mm``,
  ``grouped_mm_available``; ``check_moe_inputs``, ``check_expert_index`` (the expert-index
  rule: ``-1`` and ``E`` route nowhere) and ``NO_EXPERT`` (from ``ops/moe_experts/checks.py``)
* :mod:`.load_balancing` (``load_balancing_loss``) — ``load_balancing_loss``
* :mod:`.attention` — ``eager_attention``, ``sdpa_attention``, ``packing_mask`` (packed
  sequences as a block-diagonal mask)
* :mod:`.checks` — THE input checks, public for every backend's adapters: tensor, dtype,
  device and shape checks (defined in :mod:`.tensor_checks`), every op-level one, defined in its
  op's folder (``ops/<op>/checks.py``) and re-exported here (``check_rms_norm_inputs``,
  ``check_labels``, ``check_label_values`` -- the label-range rule --,
  ``check_linear_cross_entropy_inputs``, ``check_swiglu_inputs``, ``check_rotary_inputs``,
  ``check_moe_inputs``, ``check_expert_index``; none imports a kernel module),
  ``BackendChecks`` (the same bound to a backend's tag, dtypes and devices) and the
  value-check policy (``can_read_values``, ``VEOMNI_OPS_CHECK_VALUES``)

The ``eager`` kernels are the reference every other backend is checked against; they
reproduce transformers' own modules. Nothing is imported here so that importing one
kernel module does not import the others. Each op folder's light ``reference`` module
declares them, and :mod:`veomni_ops.backends.reference` registers them.
"""

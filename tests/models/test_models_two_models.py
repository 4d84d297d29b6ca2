"""Two models in one process with different plans (teacher eager, student ``counting``).

The ``counting`` backend wraps the eager kernels and counts calls per (op, variant): the
student's forward must call every counting kernel, the teacher's none, and binding the
student must not change the teacher at all.
"""

from __future__ import annotations

import copy

import torch
import veomni_ops
from models_support import ALL_EAGER, ALL_FIELDS, batch, build, config

COUNTING = {f: "counting" for f in ALL_FIELDS}
# Explicit names only where the model has the op (elsewhere an explicit name is a BindingError).
COUNTING_MOE = {**COUNTING, "swiglu_mlp_implementation": "auto"}
COUNTING_DENSE = {**COUNTING, "moe_implementation": "auto", "load_balancing_loss_implementation": "auto",
                  "moe_router_implementation": "auto"}


def test_teacher_eager_student_counting(counting_registry, counter):
    cfg = config("qwen3_moe")
    teacher = build("qwen3_moe", cfg=cfg)
    student = build("qwen3_moe", cfg=cfg)  # same weights, same config object
    pristine = copy.deepcopy(teacher)
    b = batch()
    kw = {"output_router_logits": True}

    with torch.no_grad():
        before = teacher(**b, **kw)
    veomni_ops.apply(teacher, ALL_EAGER, registry=counting_registry, device="cpu")
    with torch.no_grad():
        teacher_eager = teacher(**b, **kw)
    assert sum(counter.values()) == 0

    binding = veomni_ops.apply(student, COUNTING_MOE, registry=counting_registry, device="cpu")
    assert {e.kernel for e in binding.plan.entries} == {"counting"}
    assert {e.kernel for e in teacher.veomni_ops_binding.plan.entries} == {"eager"}

    # The teacher after the student's apply: the same numbers, bit for bit, and no counting call.
    with torch.no_grad():
        after = teacher(**b, **kw)
    assert sum(counter.values()) == 0
    assert torch.equal(after.loss, teacher_eager.loss) and torch.equal(after.aux_loss, teacher_eager.aux_loss)
    # Binding the teacher itself kept transformers' numbers.
    torch.testing.assert_close(teacher_eager.loss, before.loss, atol=1e-5, rtol=1e-5)

    # The student calls its kernels: per forward, every norm, rotary and attention of both
    # layers (each layer's residual add and post-attention norm in one fused kernel), both
    # experts blocks, one CE and one aux loss.
    out = student(**b, **kw)
    n_norms = sum(1 for m in student.modules() if type(m).__name__.endswith("RMSNorm"))
    assert dict(counter) == {
        ("rms_norm", "standard"): n_norms - 2,
        ("residual_rms_norm", "standard"): 2,
        ("rotary", "full"): 2,
        ("attention", "standard"): 2,
        ("moe_router", "standard"): 2,
        ("moe_experts", "standard"): 2,
        ("cross_entropy", "fused_linear"): 1,
        ("load_balancing_loss", "standard"): 1,
    }
    torch.testing.assert_close(out.loss, after.loss, atol=1e-5, rtol=1e-5)
    out.loss.backward()  # the student trains through its kernels
    assert student.model.layers[0].mlp.experts.gate_up_proj.grad is not None

    # Running the student changed nothing in the teacher either, and the pristine copy
    # (never bound) still gives transformers' own numbers.
    counter.clear()
    with torch.no_grad():
        assert torch.equal(teacher(**b, **kw).loss, after.loss)
        assert torch.equal(pristine(**b, **kw).loss, before.loss)
    assert sum(counter.values()) == 0
    # Class-level code is untouched: a new, unbound model has no instance forwards.
    fresh = build("qwen3_moe")
    assert [n for n, m in fresh.named_modules() if "forward" in m.__dict__] == []


def test_apply_twice_rebinds(counting_registry, counter):
    """A second apply replaces the first plan on that model (and only that model): the first
    binding is removed, then the new one bound."""
    model = build("qwen3")
    veomni_ops.apply(model, COUNTING_DENSE, registry=counting_registry, device="cpu")
    b = batch()
    with torch.no_grad():
        model(**b)
    assert counter[("rms_norm", "standard")] > 0
    first = model.veomni_ops_binding
    veomni_ops.apply(model, ALL_EAGER, registry=counting_registry, device="cpu")
    assert not first.in_force and model.veomni_ops_binding.in_force
    counter.clear()
    with torch.no_grad():
        model(**b)
    assert sum(counter.values()) == 0
    assert {e.kernel for e in model.veomni_ops_binding.plan.entries} == {"eager"}

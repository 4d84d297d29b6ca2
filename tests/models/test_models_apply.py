"""``veomni_ops.apply`` on every supported transformers model: survey, eager and auto numerics.

Each model is tiny, float32, random weights. The reference is the same model unpatched
(``copy.deepcopy`` taken before ``apply``), run by transformers itself.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import veomni_ops
from models_support import (
    ALL_EAGER,
    AUX_LOSS_MODELS,
    MODELS,
    MOE_MODELS,
    OFFSET_MODELS,
    assert_grads_close,
    batch,
    build,
    pair,
)
from veomni_ops.binding import BindingError, survey
from veomni_ops.config import OpsConfig
from veomni_ops.resolve import resolve

# float32 end to end; the patched graph differs from transformers' only in op order
# (eager vs sdpa attention, chunked vs plain CE), so differences are a few ulps.
LOSS_TOL = dict(atol=1e-5, rtol=1e-5)
LOGIT_TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = dict(atol=1e-5, rtol=1e-4)


def _kw(name: str) -> dict:
    return {"output_router_logits": True} if name in AUX_LOSS_MODELS else {}


# ------------------------------------------------------------------------------------------
# survey
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_survey_finds_expected_places(name):
    model = build(name)
    places = survey(model)
    by_op = Counter(p.op for p in places)
    variants: dict[str, set] = {}
    paths: dict[str, list[str]] = {}
    for p in places:
        variants.setdefault(p.op, set()).add(p.variant)
        paths.setdefault(p.op, []).append(p.path)

    # RMSNorm: every decoder norm, standard or offset by model.
    norm_variant = "offset" if name in OFFSET_MODELS else "standard"
    assert variants["rms_norm"] == {norm_variant}
    n_norms = sum(1 for m in model.modules() if type(m).__name__.endswith("RMSNorm"))
    assert by_op["rms_norm"] == n_norms > 0

    # Rotary: partial for Qwen3.5/Qwen3-Next (partial_rotary_factor 0.25), full elsewhere,
    # on every attention layer that applies it (hybrids have one full-attention layer).
    n_attn = 1 if name in OFFSET_MODELS else 2
    if name == "deepseek_v3":
        # rope_interleave=True (the default) routes through apply_rotary_pos_emb_interleave,
        # a layout the rotary contract does not have: each attention's rotary is left, with why.
        assert [(p.path, p.left) for p in places if p.op == "rotary"] == [
            (f"model.layers.{i}.self_attn", "its forward calls apply_rotary_pos_emb_interleave instead of "
             "apply_rotary_pos_emb when config.rope_interleave is set (here True), which a rotary kernel would not "
             "replace") for i in range(n_attn)]
    else:
        assert variants["rotary"] == {"partial" if name in OFFSET_MODELS else "full"}
        assert by_op["rotary"] == n_attn
    rot = [p for p in places if p.op == "rotary" and not p.left]
    for p in rot:
        head_dim = p.module.head_dim
        assert (p.info["rot_dim"] < head_dim) == (name in OFFSET_MODELS)

    # Attention: every decoder attention layer (+ the vision tower's for Qwen2-VL).
    assert by_op["attention"] == n_attn + (1 if name == "qwen2_vl" else 0)

    # Experts and aux loss.
    if name in MOE_MODELS:
        assert by_op["moe_experts"] == (1 if name == "deepseek_v3" else 2)
    else:
        assert "moe_experts" not in by_op
    assert ("load_balancing_loss" in by_op) == (name in AUX_LOSS_MODELS)

    # SwiGLU: dense MLPs and shared experts; none in Qwen3-MoE (every layer is sparse).
    if name == "qwen3_moe":
        assert "swiglu" not in by_op
    else:
        assert by_op["swiglu"] == 2

    # The causal-LM head: fused linear preferred, logits as the alternative.
    assert variants["cross_entropy"] == {("fused_linear", "logits")}
    assert paths["cross_entropy"] == [""]


# ------------------------------------------------------------------------------------------
# eager: the plan reproduces transformers
# ------------------------------------------------------------------------------------------


def _check_against_transformers(name: str, config, registry, expect_logits_with_labels: bool):
    ref, model = pair(name)
    binding = veomni_ops.apply(model, config, registry=registry, device="cpu")
    assert binding.plan.device.type == "cpu"
    b = batch()
    kw = _kw(name)

    # Logits without labels.
    with torch.no_grad():
        r = ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **kw)
        g = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **kw)
    keep = b["attention_mask"].bool()  # padded positions attend to nothing: implementation-defined
    torch.testing.assert_close(g.logits[keep], r.logits[keep], **LOGIT_TOL)
    if name in AUX_LOSS_MODELS:
        torch.testing.assert_close(g.aux_loss, r.aux_loss, **LOSS_TOL)

    # Loss (ignore_index labels, padding), aux loss, and every parameter's gradient.
    r = ref(**b, **kw)
    g = model(**b, **kw)
    assert (g.logits is not None) == expect_logits_with_labels
    torch.testing.assert_close(g.loss, r.loss, **LOSS_TOL)
    if name in AUX_LOSS_MODELS:
        assert g.aux_loss is not None
        torch.testing.assert_close(g.aux_loss, r.aux_loss, **LOSS_TOL)
    r.loss.backward()
    g.loss.backward()
    assert assert_grads_close(ref, model, **GRAD_TOL) > 10

    # num_items_in_batch (gradient accumulation): sum / num_items, as transformers.
    with torch.no_grad():
        n = torch.tensor(37)
        r = ref(**b, num_items_in_batch=n, **kw)
        g = model(**b, num_items_in_batch=n, **kw)
    torch.testing.assert_close(g.loss, r.loss, **LOSS_TOL)
    return binding


@pytest.mark.parametrize("name", MODELS)
def test_all_eager_matches_transformers(name, registry):
    binding = _check_against_transformers(name, ALL_EAGER, registry, expect_logits_with_labels=True)
    kernels = {(e.op, e.variant): e.kernel for e in binding.plan.entries}
    assert set(kernels.values()) == {"eager"}
    # Every place got a kernel; an eager loss is transformers' own: logits, then the loss
    # (the logits are returned), not the fused form.
    assert len(binding.bound) == len([p for p in survey(build(name)) if not p.left])
    assert ("cross_entropy", "logits") in kernels and ("cross_entropy", "fused_linear") not in kernels


@pytest.mark.parametrize("name", MODELS)
def test_auto_matches_transformers(name, registry):
    binding = _check_against_transformers(name, {}, registry, expect_logits_with_labels=False)
    kernels = {(e.op, e.variant): e.kernel for e in binding.plan.entries}
    # auto: the portable kernels where they apply (grouped_mm is bfloat16-only: eager in float32).
    assert kernels[("cross_entropy", "fused_linear")] == "chunked"
    assert kernels[("attention", "standard")] == "sdpa"
    if name in MOE_MODELS:
        assert kernels[("moe_experts", "standard")] == "eager"
        assert "bfloat16" in binding.plan.get("moe_experts", "standard").reason  # grouped_mm passed over: dtype


@pytest.mark.parametrize("name", ["qwen3", "qwen3_next"])
def test_logits_variant_plan_returns_logits(name, registry):
    """A plan that only has the logits CE variant: logits come back with the loss."""
    ref, model = pair(name)
    needs = {op: [v for v in vs] for op, vs in _needs(model).items()}
    needs["cross_entropy"] = ["logits"]
    plan = resolve(OpsConfig(**ALL_EAGER), "cpu", needs=needs, registry=registry, dtype="float32")
    veomni_ops.apply(model, plan)
    b = batch()
    r, g = ref(**b, **_kw(name)), model(**b, **_kw(name))
    assert g.logits is not None
    keep = b["attention_mask"].bool()
    torch.testing.assert_close(g.logits[keep], r.logits[keep], **LOGIT_TOL)
    torch.testing.assert_close(g.loss, r.loss, **LOSS_TOL)
    r.loss.backward()
    g.loss.backward()
    assert_grads_close(ref, model, **GRAD_TOL)


def _needs(model):
    from veomni_ops.binding import needs_of

    return needs_of(survey(model))


@pytest.mark.parametrize("num_items", [None, "tensor 0", "int 0", "tensor 5"])
@pytest.mark.parametrize(("cfg", "variant", "kernel"), [(ALL_EAGER, "logits", "eager"), ({}, "fused_linear", "chunked")],
                         ids=["eager-logits", "auto-chunked"])
def test_all_ignored_labels_give_transformers_loss_and_zero_gradients(cfg, variant, kernel, num_items, registry):
    """Every label ignore_index (a batch of prompt-only rows): transformers' loss is 0/0 = nan
    (0 over a positive num_items_in_batch) and every gradient is zero, since its cross-entropy
    backward writes only counted rows, whatever the infinite 1/0 it is handed. Ours gives the same
    loss and gradients on both paths (was: nan in every gradient under the chunked fused loss,
    which scales its stored gradients by that inf; one optimizer step then ruined the model)."""
    ref, model = pair("qwen3")
    binding = veomni_ops.apply(model, cfg, registry=registry, device="cpu")
    assert binding.plan.get("cross_entropy", variant).kernel == kernel
    b = batch()
    b["labels"][:] = -100
    n = {None: None, "tensor 0": torch.tensor(0), "int 0": 0, "tensor 5": torch.tensor(5)}[num_items]
    kw = {} if n is None else {"num_items_in_batch": n}
    r, g = ref(**b, **kw), model(**b, **kw)
    assert (g.logits is None) == (variant == "fused_linear")  # the path that kernel runs on
    if num_items == "tensor 5":
        assert float(r.loss.detach()) == 0.0 and float(g.loss.detach()) == 0.0
    else:
        assert torch.isnan(r.loss) and torch.isnan(g.loss)
    r.loss.backward()
    g.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool((t == 0).all()) for t in grads), "gradients of a loss with no counted token"
    assert assert_grads_close(ref, model, atol=0.0, rtol=0.0) > 10  # transformers' zeros, every parameter


# ------------------------------------------------------------------------------------------
# what the model has no place for
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("qwen3", "moe_implementation", "grouped_mm"),
        ("llama", "load_balancing_loss_implementation", "counting"),
        ("qwen3_moe", "swiglu_mlp_implementation", "counting"),
        ("deepseek_v3", "load_balancing_loss_implementation", "counting"),
        ("deepseek_v3", "rotary_pos_emb_implementation", "counting"),
    ],
)
def test_non_eager_op_without_place_raises(name, field, value, registry):
    model = build(name)
    with pytest.raises(BindingError) as ei:
        veomni_ops.apply(model, {field: value}, registry=registry, device="cpu")
    msg = str(ei.value)
    assert f"{field}={value!r}" in msg
    assert "'auto' or 'eager'" in msg
    # Nothing was bound.
    assert not hasattr(model, "veomni_ops_binding")
    # auto and eager are fine there: the op is simply not bound.
    for ok in ("auto", "eager"):
        b = veomni_ops.apply(build(name), {field: ok}, registry=registry, device="cpu")
        assert b.plan.entries


def test_dense_model_auto_binds_no_experts(registry):
    b = veomni_ops.apply(build("qwen3"), {}, registry=registry, device="cpu")
    assert "moe_experts" not in b.summary() and "load_balancing_loss" not in b.summary()
    assert all(e.op not in ("moe_experts", "load_balancing_loss") for e in b.plan.entries)


@pytest.mark.parametrize("cfg", [ALL_EAGER, {}], ids=["eager", "auto"])
def test_bfloat16_offset_model_matches_transformers(cfg, registry):
    """bfloat16: Qwen3.5 (offset norms computed in float32, partial rotary, gated delta net)."""
    ref, model = pair("qwen3_5", dtype=torch.bfloat16)
    binding = veomni_ops.apply(model, cfg, registry=registry, device="cpu")
    assert binding.plan.get("rms_norm", "offset") is not None
    b = batch()
    r, g = ref(**b), model(**b)
    torch.testing.assert_close(g.loss, r.loss, atol=2e-2, rtol=1e-2)
    r.loss.backward()
    g.loss.backward()
    # bfloat16 rounding along different op orders (eager vs sdpa attention, chunked vs plain
    # CE); measured: at most ~1e-2 relative (Frobenius) error per parameter gradient.
    limit = 2e-2
    for (n, pr), pg in zip(ref.named_parameters(), model.parameters()):
        assert (pr.grad is None) == (pg.grad is None), n
        if pr.grad is None or pr.grad.abs().max() == 0:
            continue
        err = ((pg.grad.float() - pr.grad.float()).norm() / pr.grad.float().norm()).item()
        assert err < limit, f"grad of {n}: relative error {err:.3g}"


def test_apply_takes_a_memory_budget_through_its_target(registry):
    """``apply(memory=...)``: ``auto`` passes over the chunked fused loss where its extra memory
    does not fit the budget (issue 24), and the plan says so; a resolved plan takes no budget."""
    from veomni_ops import MemoryBudget
    from veomni_ops.ops.cross_entropy.memory import chunked_extra

    model = build("qwen3")
    cfg = model.config
    shapes = {"tokens": 24, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "itemsize": 4}
    budget = MemoryBudget(chunked_extra(shapes) - 1, shapes={"cross_entropy": shapes})
    binding = veomni_ops.apply(model, {}, registry=registry, memory=budget)
    e = binding.plan.get("cross_entropy", "fused_linear")
    assert e is not None and e.kernel == "eager", binding.plan.table()
    assert "passed over chunked (needs 0.00 GiB beyond its inputs at 24 tokens" in e.reason
    binding.remove()
    plan = resolve(OpsConfig(), "cpu", registry=registry)
    with pytest.raises(BindingError, match="a memory budget applies when resolving"):
        veomni_ops.apply(model, plan, registry=registry, memory=budget)


# ------------------------------------------------------------------------------------------
# what apply is given: refused by name, or replaced as a second apply replaces the first
# ------------------------------------------------------------------------------------------


def test_apply_refuses_what_is_not_a_module_naming_the_type_and_the_fix(registry):
    model = build("qwen3")
    cases = [
        (lambda: veomni_ops.apply("x", {}), "got a builtins.str ('x')"),
        (lambda: veomni_ops.apply(type(model), {}), "got the class Qwen3ForCausalLM itself; build the model first"),
        (lambda: veomni_ops.apply({}, model), "got a builtins.dict first and the model second; write "
                                              "veomni_ops.apply(model, config)"),
    ]
    for call, fix in cases:
        with pytest.raises(TypeError) as ei:
            call()
        msg = str(ei.value)
        assert msg.startswith("veomni_ops.apply(model, config): model must be a torch.nn.Module: a transformers "
                              "model (a PreTrainedModel"), msg
        assert fix in msg, msg
    assert not hasattr(model, "veomni_ops_binding")


def test_apply_on_a_module_without_a_transformers_model_or_a_place_is_refused(registry):
    """Nothing to bind and nothing transformers: an error that says what apply expects, not a
    binding of nothing."""
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with pytest.raises(BindingError) as ei:
        veomni_ops.apply(plain, {}, registry=registry, device="cpu")
    msg = str(ei.value)
    assert msg.startswith("Sequential is not a transformers model and holds none, and veomni-ops found no place in "
                          "it to bind a kernel"), msg
    assert "veomni_ops.apply expects a transformers model (a PreTrainedModel" in msg and "pass that model" in msg
    assert not hasattr(plain, "veomni_ops_binding") and "forward" not in plain[0].__dict__


def test_apply_on_a_bare_decoder_layer_binds_its_places_and_says_it_is_no_transformers_model(registry):
    """A module outside any transformers model whose places veomni-ops recognises by structure
    (a decoder layer taken out of its model) is bound, and the binding says what it is: its
    rotary is left (the rotary dimension is the model's), with why."""
    ref, model = pair("qwen3")
    layer = model.model.layers[0]
    binding = veomni_ops.apply(layer, ALL_EAGER, registry=registry, device="cpu")
    assert binding.summary() == {"residual_rms_norm": 1, "attention": 1, "rms_norm": 4, "swiglu": 1}
    assert binding.skipped == (("self_attn", "rotary", "the model has no rotary embedding module (a '*rotary_emb' "
                                                       "with inv_freq) to read the rotary dimension from"),)
    assert ("Qwen3DecoderLayer is not a transformers model and holds none: veomni-ops bound the places it "
            "recognised by their structure (8, listed above)") in str(binding)
    x = torch.randn(1, 5, 64)
    pe = model.model.rotary_emb(x, torch.arange(5)[None])
    torch.testing.assert_close(layer(x, position_embeddings=pe, attention_mask=None),
                               ref.model.layers[0](x, position_embeddings=pe, attention_mask=None), **LOGIT_TOL)


def test_apply_on_a_wrapper_after_apply_on_its_model_replaces_that_binding(registry):
    """apply(wrapper) after apply(model): the wrapper's binding replaces the model's (as a second
    apply on one model does), says so, and remove() leaves the model unbound."""
    ref, model = pair("qwen3")
    first = veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    wrapper = torch.nn.ModuleDict({"lm": model})
    binding = veomni_ops.apply(wrapper, {}, registry=registry, device="cpu")
    assert not first.in_force and not hasattr(model, "veomni_ops_binding")
    assert wrapper.veomni_ops_binding is binding and binding.skipped == ()
    assert len(binding.bound) == len(first.bound) and ("lm", "cross_entropy", "fused_linear", "chunked") in binding.bound
    assert ("replaced the binding veomni_ops.apply made on lm (Qwen3ForCausalLM): one binding per model, and this "
            "one covers lm") in str(binding)
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, **LOSS_TOL)
    binding.remove()
    assert not [m for m in wrapper.modules() if "forward" in m.__dict__]
    # A failed apply on the wrapper gives the model its own binding back.
    first = veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    with pytest.raises(BindingError):
        veomni_ops.apply(wrapper, {"moe_implementation": "grouped_mm"}, registry=registry, device="cpu")
    assert first.in_force and model.veomni_ops_binding is first and not hasattr(wrapper, "veomni_ops_binding")


def test_apply_on_a_model_inside_a_bound_wrapper_is_refused_naming_the_fix(registry):
    model = build("qwen3")
    wrapper = torch.nn.ModuleDict({"lm": model})
    outer = veomni_ops.apply(wrapper, {}, registry=registry, device="cpu")
    with pytest.raises(BindingError) as ei:
        veomni_ops.apply(model, ALL_EAGER, registry=registry, device="cpu")
    msg = str(ei.value)
    assert msg.startswith("Qwen3ForCausalLM is bound already, as part of the binding of a module that holds it"), msg
    assert "call veomni_ops.apply on that outer module again" in msg and "outer.veomni_ops_binding.remove()" in msg
    assert outer.in_force and not hasattr(model, "veomni_ops_binding")


def test_apply_under_the_device_variable_names_it(registry, monkeypatch):
    """VEOMNI_OPS_DEVICE set to another machine's device: apply's refusals say where the device
    came from, and its config mistakes are all said first."""
    from veomni_ops.device import detected_device

    model = build("qwen3")
    here = detected_device()
    other = "npu" if here.type != "npu" else "cuda:9.0"  # a device this machine is not
    monkeypatch.setenv("VEOMNI_OPS_DEVICE", other)
    with pytest.raises(BindingError) as ei:
        veomni_ops.apply(model, {}, registry=registry)
    assert (f"apply binds kernels that run on this machine ({here}), and the device to resolve for is {other} (from "
            "VEOMNI_OPS_DEVICE), another machine's. Unset VEOMNI_OPS_DEVICE") in str(ei.value)
    with pytest.raises(veomni_ops.ResolutionError, match=rf"for device {other} \(from VEOMNI_OPS_DEVICE\):\n  - "
                                                         "attn_implementation='flash_typo'"):
        veomni_ops.apply(model, {"attn_implementation": "flash_typo"}, registry=registry)
    assert not hasattr(model, "veomni_ops_binding")

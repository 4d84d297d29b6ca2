"""A bound model is a drop-in for the unbound one: the same forward signatures and outputs
(logits whenever the unbound model returns them), honest about what a kernel cannot do,
bindable on the meta device, removable, and explicit about copies and pickling."""

from __future__ import annotations

import copy
import inspect
import io
import pickle

import pytest
import torch
import transformers as T
import veomni_ops
from models_support import batch, build, config, pair
from veomni_ops.binding import BindingError, DroppedBinding
from veomni_ops.binding.functions import library_method

FORWARD_OWNERS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Qwen3MLP",
                  "Qwen3MoeExperts", "Qwen3MoeTopKRouter", "Qwen3Attention", "Qwen3MoeAttention")


def _bound_modules(model):
    return [(name, m) for name, m in model.named_modules() if "forward" in m.__dict__]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_every_bound_forward_keeps_the_original_signature(name):
    ref, model = pair(name)
    veomni_ops.apply(model, {}, device="cpu")
    bound = _bound_modules(model)
    assert {type(m).__name__ for _, m in bound} == set(FORWARD_OWNERS) & {type(m).__name__ for m in ref.modules()}
    for path, m in bound:
        original = ref.get_submodule(path).forward
        assert inspect.signature(m.forward) == inspect.signature(original), path
        assert inspect.unwrap(m.forward.__func__) is inspect.unwrap(library_method(type(m), "forward")), path
    # what Trainer reads to pick the batch columns
    assert list(inspect.signature(model.forward).parameters) == list(inspect.signature(ref.forward).parameters)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_logits_are_returned_whenever_the_unbound_model_returns_them(name):
    ref, model = pair(name)
    veomni_ops.apply(model, {}, device="cpu")
    b = batch()
    extra = {"output_router_logits": True} if name == "qwen3_moe" else {}
    # training with labels and grad: the fused loss, no logits
    g = model(**b, **extra)
    r = ref(**b, **extra)
    assert g.logits is None and type(g) is type(r)
    torch.testing.assert_close(g.loss, r.loss, rtol=1e-5, atol=1e-6)
    # no grad, eval, no labels, return_dict=False: the unbound model's logits and fields
    for mode in ("no_grad", "eval", "no_labels"):
        kw = dict(b) if mode != "no_labels" else {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
        model.train(mode != "eval")
        ref.train(mode != "eval")
        with torch.set_grad_enabled(mode != "no_grad"):
            g, r = model(**kw, **extra), ref(**kw, **extra)
        assert type(g) is type(r) and list(g.keys()) == list(r.keys()), mode
        torch.testing.assert_close(g.logits, r.logits, rtol=1e-5, atol=1e-6, msg=mode)
        if r.loss is not None:
            torch.testing.assert_close(g.loss, r.loss, rtol=1e-5, atol=1e-6, msg=mode)
    model.train()
    ref.train()
    g, r = model(**b, **extra, return_dict=False), ref(**b, **extra, return_dict=False)
    assert len(g) == len(r)
    for i, (x, y) in enumerate(zip(g, r)):
        if isinstance(y, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"tuple position {i}")


def test_skip_logits_forces_either_path():
    ref, model = pair("qwen3")
    veomni_ops.apply(model, {}, device="cpu", skip_logits=False)
    b = batch()
    out = model(**b)
    assert out.logits is not None  # training with labels, but forced to the logits path
    torch.testing.assert_close(out.loss, ref(**b).loss, rtol=1e-5, atol=1e-6)
    model.eval()
    ref.eval()
    with torch.no_grad():
        forced = model(**b, skip_logits=True)  # one call: the fused loss in eval
        assert forced.logits is None
        torch.testing.assert_close(forced.loss, ref(**b).loss, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="skip_logits=True needs labels"):
            model(input_ids=b["input_ids"], skip_logits=True)
    with pytest.raises(BindingError, match="skip_logits must be None, True or False"):
        veomni_ops.apply(build("qwen3"), {}, device="cpu", skip_logits="yes")


def test_skip_logits_needs_a_fused_kernel():
    _, model = pair("qwen3")
    veomni_ops.apply(model, {"cross_entropy_loss_implementation": "eager"}, device="cpu")
    with pytest.raises(ValueError, match="skip_logits=True needs a fused_linear cross-entropy kernel"):
        model(**batch(), skip_logits=True)


def test_a_kernel_without_a_logits_variant_gets_the_reference_for_the_logits_path():
    ref, model = pair("qwen3")
    binding = veomni_ops.apply(model, {"cross_entropy_loss_implementation": "chunked"}, device="cpu")
    assert binding.plan.get("cross_entropy", "logits").kernel == "eager"
    assert "chunked has no logits variant" in str(binding)
    model.eval()
    ref.eval()
    b = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(**b).loss, ref(**b).loss, rtol=1e-5, atol=1e-6)


def test_output_attentions_with_a_kernel_that_has_no_weights_raises():
    ref, model = pair("qwen3")
    veomni_ops.apply(model, {"attn_implementation": "sdpa"}, device="cpu")
    b = batch()
    with pytest.raises(ValueError, match="output_attentions=True: the attention kernel 'sdpa'.*attn_implementation"):
        model(**b, output_attentions=True)
    # config.output_attentions=True: transformers itself refuses it while the (bound) config says sdpa
    with pytest.raises(ValueError, match="output_attentions"):
        model.config.output_attentions = True
        model(**b)


def test_output_attentions_with_eager_returns_the_weights():
    ref, model = pair("qwen3", attn_implementation="eager")
    veomni_ops.apply(model, {"attn_implementation": "eager"}, device="cpu")
    b = batch()
    model.eval()
    ref.eval()
    g, r = model(**b, output_attentions=True), ref(**b, output_attentions=True)
    assert len(g.attentions) == len(r.attentions) == 2
    for x, y in zip(g.attentions, r.attentions):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe", "gemma"])
def test_meta_device_binding_equals_binding_a_materialised_model(name):
    ref, real = pair(name)
    veomni_ops.apply(real, {}, device="cpu")
    with torch.device("meta"):
        meta = type(ref)(config(name))
    binding = veomni_ops.apply(meta, {}, device="cpu")
    assert binding.summary() == real.veomni_ops_binding.summary()
    assert binding.bound == real.veomni_ops_binding.bound
    meta.to_empty(device="cpu")
    meta.load_state_dict(ref.state_dict())
    for (_path, buf), (_, want) in zip(meta.named_buffers(), ref.named_buffers()):  # non-persistent (rotary)
        buf.copy_(want)
    b = batch()
    torch.testing.assert_close(meta(**b).loss, real(**b).loss, rtol=0, atol=0)


def test_remove_restores_the_exact_model():
    ref, model = pair("qwen3_moe", attn_implementation="eager")
    user_cfg = model.config
    before = {n: dict(m.__dict__) for n, m in model.named_modules()}
    binding = veomni_ops.apply(model, {"attn_implementation": "sdpa"}, device="cpu")  # over eager: configs copied
    assert model.config is not user_cfg and user_cfg._attn_implementation == "eager"
    assert "private copy" in str(binding)
    assert binding.in_force
    binding.remove()
    assert not binding.in_force and "removed" in str(binding)
    assert not hasattr(model, "veomni_ops_binding")
    assert model.config is user_cfg
    for n, m in model.named_modules():
        assert set(m.__dict__) == set(before[n]), n
        for k, v in before[n].items():
            assert m.__dict__[k] is v, (n, k)
    b = batch()
    g, r = model(**b, output_router_logits=True), ref(**b, output_router_logits=True)
    assert torch.equal(g.loss, r.loss) and torch.equal(g.logits, r.logits)
    binding.remove()  # a second call does nothing
    veomni_ops.apply(model, {}, device="cpu")  # and the model can be bound again


def test_auto_keeps_the_eager_attention_a_model_was_built_with():
    """A model built with attn_implementation="eager" (to get attention weights): auto binds the
    reference attention there, says why, and output_attentions returns what transformers returns."""
    ref, model = pair("qwen3", attn_implementation="eager")
    binding = veomni_ops.apply(model, {}, device="cpu")
    entry = binding.plan.get("attention", "standard")
    assert entry.kernel == "eager" and "built with attn_implementation='eager'" in entry.reason
    assert model.config is ref.config or "private copy" not in str(binding)
    model.eval()
    ref.eval()
    b = batch()
    g, r = model(**b, output_attentions=True), ref(**b, output_attentions=True)
    for x, y in zip(g.attentions, r.attentions, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    named = veomni_ops.apply(copy.deepcopy(ref), {"attn_implementation": "sdpa"}, device="cpu")
    assert named.plan.get("attention", "standard").kernel == "sdpa"  # a named kernel still wins


def test_a_failed_rebind_keeps_the_first_binding(counting_registry, counter):
    ref, model = pair("qwen3")
    first = veomni_ops.apply(model, {}, registry=counting_registry, device="cpu")
    with pytest.raises(veomni_ops.ResolutionError):
        veomni_ops.apply(model, {"rms_norm_implementation": "no_such_kernel"}, registry=counting_registry,
                         device="cpu")
    assert model.veomni_ops_binding is first and first.in_force
    counter.clear()
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, rtol=1e-5, atol=1e-6)
    assert counter[("rms_norm", "standard")] > 0


def test_the_users_config_object_stays_the_models_when_no_copy_is_needed():
    _, model = pair("qwen3")  # built with sdpa; auto binds sdpa: same mask
    user_cfg = model.config
    binding = veomni_ops.apply(model, {}, device="cpu")
    assert model.config is user_cfg and "private copy" not in str(binding)
    user_cfg.use_cache = False
    assert model.config.use_cache is False


def test_deepcopy_keeps_the_binding_in_force(counting_registry, counter):
    ref, model = pair("qwen3")
    veomni_ops.apply(model, {}, registry=counting_registry, device="cpu")
    twin = copy.deepcopy(model)
    assert twin.veomni_ops_binding.in_force and twin.veomni_ops_binding is not model.veomni_ops_binding
    counter.clear()
    b = batch()
    torch.testing.assert_close(twin(**b).loss, ref(**b).loss, rtol=1e-5, atol=1e-6)
    assert counter[("rms_norm", "standard")] > 0 and counter[("cross_entropy", "fused_linear")] == 1
    twin.veomni_ops_binding.remove()
    assert "forward" not in twin.__dict__ and "forward" in model.__dict__  # the copy's undo touches the copy only
    counter.clear()
    twin(**b)
    assert sum(counter.values()) == 0


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_pickling_drops_the_binding_explicitly(how, counting_registry, counter):
    ref, model = pair("qwen3", attn_implementation="eager")
    veomni_ops.apply(model, {"attn_implementation": "counting"}, registry=counting_registry, device="cpu")
    if how == "pickle":
        back = pickle.loads(pickle.dumps(model))
    else:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
    dropped = back.veomni_ops_binding
    assert isinstance(dropped, DroppedBinding) and not dropped.in_force and dropped.summary() == {}
    assert "not in force" in str(dropped) and "apply" in str(dropped)
    assert back.config._attn_implementation == "eager"  # the original's, not the binding's
    counter.clear()
    b = batch()
    out = back(**b)
    assert sum(counter.values()) == 0
    torch.testing.assert_close(out.logits, ref(**b).logits, rtol=0, atol=0)
    veomni_ops.apply(back, {}, device="cpu")  # the unpickled model can be bound again


def test_auto_leaves_a_place_no_kernel_can_serve():
    """float32 Qwen3-MoE in compile mode: no experts kernel both compiles and runs float32 on the
    CPU; auto leaves the experts to transformers and says why. A named kernel is still refused."""
    ref, model = pair("qwen3_moe")
    binding = veomni_ops.apply(model, {}, device="cpu", compile=True)
    left = [(p, why) for p, op, why in binding.skipped if op == "moe_experts"]
    assert left and all(why.startswith("auto: no registered kernel is usable here") for _, why in left), left
    assert "moe_experts" not in binding.summary()
    b = batch()
    torch.testing.assert_close(model(**b).loss, ref(**b).loss, rtol=1e-5, atol=1e-6)
    with pytest.raises(veomni_ops.ResolutionError) as ei:
        veomni_ops.apply(build("qwen3_moe"), {"moe_implementation": "eager"}, device="cpu", compile=True)
    assert "while binding" not in str(ei.value) or "no extra features" not in str(ei.value)


class Wrapper(torch.nn.Module):
    """A user's module holding a causal LM (its forward is user code)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, **kw):
        return self.lm(**kw)


def test_apply_on_a_wrapper_binds_the_inner_head(counting_registry, counter):
    ref, lm = pair("qwen3")
    wrapper = Wrapper(lm)
    binding = veomni_ops.apply(wrapper, {}, registry=counting_registry, device="cpu")
    assert ("lm", "cross_entropy", "fused_linear", "counting") in binding.bound
    assert wrapper.veomni_ops_binding is binding
    counter.clear()
    b = batch()
    torch.testing.assert_close(wrapper(**b).loss, ref(**b).loss, rtol=1e-5, atol=1e-6)
    assert counter[("cross_entropy", "fused_linear")] == 1
    binding.remove()
    assert not _bound_modules(wrapper)


def test_apply_on_a_compiled_module_binds_the_original():
    ref, lm = pair("qwen3")
    compiled = torch.compile(lm, backend="eager")
    binding = veomni_ops.apply(compiled, {}, device="cpu")
    assert ("_orig_mod", "cross_entropy", "fused_linear", "chunked") in binding.bound
    b = batch()
    torch.testing.assert_close(compiled(**b).loss, ref(**b).loss, rtol=1e-5, atol=1e-6)


def test_a_forward_set_on_the_instance_by_other_code_is_kept():
    """accelerate wraps model.forward in autocast by setting it on the instance: binding must
    not drop it. The head is left to that code, and the binding says so."""
    ref, model = pair("qwen3")

    def scaled(self, *args, **kwargs):
        out = T.Qwen3ForCausalLM.forward(self, *args, **kwargs)
        out.loss = out.loss * 2
        return out

    model.forward = scaled.__get__(model)
    binding = veomni_ops.apply(model, {}, device="cpu")
    assert [(p, op) for p, op, why in binding.skipped if "set as this instance's forward" in why] == [
        ("", "cross_entropy")]
    b = batch()
    torch.testing.assert_close(model(**b).loss, 2 * ref(**b).loss, rtol=1e-5, atol=1e-6)
    binding.remove()
    assert model.__dict__["forward"].__func__ is scaled


def test_fused_loss_under_autocast_matches_the_unbound_model():
    """The bound head under torch.autocast (bf16 on the CPU): the fused loss sees what autocast
    gives the lm_head it replaces (the chunked kernel used to fail on its out= buffers)."""
    ref, model = pair("qwen3")
    veomni_ops.apply(model, {}, device="cpu")
    b = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g, r = model(**b), ref(**b)
    assert g.logits is None
    torch.testing.assert_close(g.loss, r.loss, rtol=2e-2, atol=2e-2)
    g.loss.backward()
    r.loss.backward()
    gw, rw = model.lm_head.weight.grad, ref.lm_head.weight.grad
    assert gw is not None and gw.dtype == torch.float32
    torch.testing.assert_close(gw, rw, rtol=5e-2, atol=5e-2 * rw.abs().max().item())


def test_an_adapter_on_lm_head_after_binding_takes_the_logits_path():
    """A module put in lm_head's place after binding (what PEFT's LoRA on lm_head does) is run:
    the fused loss, which would read lm_head.weight and skip it, is not taken."""
    ref, model = pair("qwen3")
    veomni_ops.apply(model, {}, device="cpu")

    class Doubled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) * 2

    model.lm_head, ref.lm_head = Doubled(model.lm_head), Doubled(ref.lm_head)
    b = batch()
    g, r = model(**b), ref(**b)
    assert g.logits is not None
    torch.testing.assert_close(g.loss, r.loss, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="skip_logits=True, but lm_head is now a"):
        model(**b, skip_logits=True)


def test_apply_inside_a_meta_device_block():
    """Binding while a `with torch.device("meta")` block is open (from_pretrained and large-model
    builders do that): the probes do not follow the default device."""
    ref, real = pair("qwen3")
    veomni_ops.apply(real, {}, device="cpu")
    with torch.device("meta"):
        meta = type(ref)(config("qwen3"))
        binding = veomni_ops.apply(meta, {}, device="cpu")
    assert binding.bound == real.veomni_ops_binding.bound


def test_apply_resolves_once(monkeypatch):
    """apply makes one target of the model and resolves it once: the eager attention the model was
    built with, the logits path of a kernel without logits, and a place auto finds nothing for are
    all decided in that one resolution."""
    import veomni_ops.binding.planning as planning

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1])
        return veomni_ops.resolve(*args, **kwargs)

    monkeypatch.setattr(planning, "resolve", counting)
    moe = build("qwen3_moe", attn_implementation="eager")
    b = veomni_ops.apply(moe, {"cross_entropy_loss_implementation": "chunked"}, device="cpu", compile=True)
    assert len(calls) == 1 and isinstance(calls[0], veomni_ops.Target) and calls[0].mode.compile
    assert b.plan.get("attention", "standard").kernel == "eager"
    assert b.plan.get("cross_entropy", "logits").kernel == "eager" and "chunked has no logits variant" in str(b)
    assert any(op == "moe_experts" and why.startswith("auto: ") for _, op, why in b.skipped)

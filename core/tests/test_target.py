"""``Mode`` and ``Target``: what resolution resolves for, checked when made; and what a target's
needs ask of resolution beside variants (a preferred kernel, a fallback, ops left to the model)."""

import json

import pytest
from conftest import make_plugin
from veomni_ops import (
    HardwareRequirement,
    KernelSpec,
    Mode,
    Need,
    OpsConfig,
    ResolutionError,
    Target,
    build_registry,
    parse_device,
    resolve,
)
from veomni_ops.backends import reference

STD = {"rms_norm": ["standard"]}


@pytest.fixture
def core_registry():
    """The core's own kernels (the reference backend), no entry points."""
    return build_registry([("eager", reference)], include_entry_points=False, env={})


# ----------------------------------------------------------------------------------------
# Mode
# ----------------------------------------------------------------------------------------


def test_mode_axes_and_defaults():
    assert Mode.of() == Mode.TRAINING | Mode.EAGER
    assert Mode.of(training=False, compile=True) == Mode.INFERENCE | Mode.COMPILE
    m = Mode.INFERENCE | Mode.COMPILE
    assert (m.training, m.compile, m.execution, str(m)) == (False, True, "compile", "compile inference")
    # An axis left out takes its default: training, eager.
    assert Mode.COMPILE.training and not Mode.INFERENCE.compile
    assert Mode.COMPILE.filled() == Mode.TRAINING | Mode.COMPILE
    assert Mode.INFERENCE.filled() == Mode.INFERENCE | Mode.EAGER
    assert Mode.of().execution == "eager"


@pytest.mark.parametrize("make", [
    lambda: Mode.TRAINING | Mode.INFERENCE,
    lambda: Mode.TRAINING | Mode.COMPILE | Mode.INFERENCE,
    lambda: Mode((Mode.TRAINING | Mode.EAGER).value | Mode.INFERENCE.value),
])
def test_mode_refuses_training_and_inference_together(make):
    with pytest.raises(ValueError, match=r"Mode TRAINING \| INFERENCE contradicts itself: a run is training .* or "
                                         r"inference .*, not both; keep one of Mode.TRAINING, Mode.INFERENCE"):
        make()


@pytest.mark.parametrize("make", [
    lambda: Mode.EAGER | Mode.COMPILE,
    lambda: Mode.INFERENCE | Mode.EAGER | Mode.COMPILE,
    lambda: Mode(Mode.EAGER.value | Mode.COMPILE.value),
])
def test_mode_refuses_eager_and_compile_together(make):
    with pytest.raises(ValueError, match=r"Mode EAGER \| COMPILE contradicts itself: a model runs eagerly or under "
                                         r"torch.compile, not both; keep one of Mode.EAGER, Mode.COMPILE"):
        make()


def test_plan_mode_is_a_mode_and_its_json_says_eager_or_compile(core_registry):
    needs = {"swiglu": ["standard"]}
    plan = resolve(OpsConfig(), "cpu", registry=core_registry, needs=needs, training=False, compile=True)
    assert plan.mode == Mode.INFERENCE | Mode.COMPILE and plan.compile
    assert json.loads(plan.to_json())["mode"] == "compile"
    assert "mode compile (torch.compile" in plan.table().splitlines()[0]
    eager = resolve(OpsConfig(), "cpu", registry=core_registry, needs=needs)
    assert eager.mode == Mode.of() and not eager.compile and eager.to_dict()["mode"] == "eager"


# ----------------------------------------------------------------------------------------
# Target
# ----------------------------------------------------------------------------------------


def test_target_normalises_what_it_is_given():
    t = Target("cuda:9.0", dtype="bfloat16", mode=Mode.COMPILE, needs={"rms_norm": ["standard", ("offset",)]},
               features={"attention": ["softcap"]}, parallel={"attention": ("sp",)})
    assert t.device == parse_device("cuda:9.0")
    assert t.mode == Mode.TRAINING | Mode.COMPILE
    assert t.needs == {"rms_norm": (Need(("standard",)), Need(("offset",)))}
    assert t.features == {"attention": frozenset({"softcap"})} and t.parallel == {"attention": frozenset({"sp"})}
    assert not t.leaves_to_model
    assert Target("cpu") == Target(parse_device("cpu"), mode=Mode.TRAINING | Mode.EAGER)


@pytest.mark.parametrize("kw, error, match", [
    (dict(needs={"rmsnorm": ["standard"]}), ValueError, r"unknown op\(s\) in needs: \['rmsnorm'\]; known: rms_norm"),
    (dict(features={"attn": ["softcap"]}), ValueError, r"unknown op\(s\) in features: \['attn'\]"),
    (dict(needs={"rms_norm": ["gemma"]}), ValueError, r"op rms_norm has no variant 'gemma'; its variants: standard, "
                                                      r"offset"),
    (dict(needs={"rms_norm": [()]}), ValueError, r"a need of op rms_norm names no variant"),
    (dict(mode="compile"), TypeError, r"Target\(mode=...\) takes a veomni_ops.Mode \(e.g. Mode.TRAINING \| "
                                      r"Mode.COMPILE\), got 'compile'"),
])
def test_target_refuses_what_it_cannot_mean(kw, error, match):
    with pytest.raises(error, match=match):
        Target("cpu", **kw)


def test_resolve_for_a_target_is_resolve_with_its_parts(toy_registry):
    target = Target("cuda:9.0", dtype="float32", mode=Mode.INFERENCE, needs=STD)
    by_target = resolve(OpsConfig(), target, registry=toy_registry, load=False)
    by_parts = resolve(OpsConfig(), "cuda:9.0", registry=toy_registry, load=False, needs=STD, dtype="float32",
                       training=False)
    assert by_target == by_parts and by_target.get("rms_norm", "standard").kernel == "hopper"


@pytest.mark.parametrize("kw", [dict(compile=True), dict(training=False), dict(needs=STD), dict(dtype="float32")])
def test_resolve_with_a_target_refuses_its_parts_beside_it(toy_registry, kw):
    name = next(iter(kw))
    with pytest.raises(TypeError, match=rf"resolve\(config, target\) takes {name} from the Target; pass "
                                        rf"Target\(\.\.\., {name}=\.\.\.\)"):
        resolve(OpsConfig(), Target("cpu", needs=STD), registry=toy_registry, **kw)


# ----------------------------------------------------------------------------------------
# What a target asks beside variants
# ----------------------------------------------------------------------------------------


def test_the_reference_cross_entropy_tries_logits_first(core_registry):
    """The reference means what transformers does (the logits, then the loss): resolution tries its
    logits variant first where the model accepts both; any other kernel keeps the model's order."""
    needs = {"cross_entropy": [("fused_linear", "logits")]}
    eager = resolve({"cross_entropy_loss_implementation": "eager"}, "cpu", needs=needs, registry=core_registry)
    assert [e.variant for e in eager.entries] == ["logits"]
    chunked = resolve({"cross_entropy_loss_implementation": "chunked"}, "cpu", needs=needs, registry=core_registry)
    assert [(e.kernel, e.variant) for e in chunked.entries] == [("chunked", "fused_linear")]
    auto = resolve({}, "cpu", needs=needs, registry=core_registry)
    assert [(e.kernel, e.variant) for e in auto.entries] == [("chunked", "fused_linear")]


def test_a_need_may_prefer_a_kernel_over_autos_choice(core_registry):
    wanted = Need(("standard",), prefer="eager", why="the model asked for its own attention")
    plan = resolve({}, Target("cpu", needs={"attention": [wanted]}), registry=core_registry)
    e = plan.get("attention", "standard")
    assert (e.kernel, e.requested, e.reason) == ("eager", "auto", "the model asked for its own attention")
    # Where auto takes that kernel anyway, its own reason stands; a kernel the config names wins.
    swiglu = resolve({}, Target("cpu", needs={"swiglu": [Need(("standard",), prefer="eager", why="x")]}),
                     registry=core_registry).get("swiglu", "standard")
    assert swiglu.kernel == "eager" and swiglu.reason.startswith("auto: highest priority usable here")
    named = resolve({"attn_implementation": "sdpa"}, Target("cpu", needs={"attention": [wanted]}),
                    registry=core_registry)
    assert named.get("attention", "standard").kernel == "sdpa"


def test_a_need_falls_back_where_the_named_kernel_cannot_serve_it(core_registry):
    logits = Need(("logits",), fallback="eager", why="the logits path takes the reference")
    needs = {"cross_entropy": [("fused_linear",), logits]}
    plan = resolve({"cross_entropy_loss_implementation": "chunked"}, Target("cpu", needs=needs),
                   registry=core_registry)
    assert plan.get("cross_entropy", "fused_linear").kernel == "chunked"
    assert plan.get("cross_entropy", "logits").kernel == "eager"
    assert plan.notes == ("cross_entropy: chunked has no logits variant; the logits path takes the reference",)
    # No fallback for auto, nor without one: the named kernel is refused as ever.
    assert resolve({}, Target("cpu", needs=needs), registry=core_registry).notes == ()
    with pytest.raises(ResolutionError, match="kernel 'chunked' provides variant\\(s\\) fused_linear of "
                                              "cross_entropy, but this needs logits"):
        resolve({"cross_entropy_loss_implementation": "chunked"}, "cpu", needs={"cross_entropy": ["logits"]},
                registry=core_registry)


def test_a_target_that_leaves_to_the_model_lists_what_auto_found_nothing_for():
    # Only a Hopper kernel for rms_norm: on the CPU auto has nothing, and the model's own code runs it.
    hopper = KernelSpec(name="hopper", op="rms_norm", variant="standard", factory="math:floor", priority=9,
                        hardware=HardwareRequirement(("cuda",), min_capability=(9, 0)))
    portable = KernelSpec(name="portable", op="swiglu", variant="standard", factory="math:ceil")
    reg = build_registry([("toy", make_plugin("toy", rms_norm=[hopper], swiglu=[portable]))],
                         include_entry_points=False, env={})
    needs = {"rms_norm": ["standard"], "swiglu": ["standard"]}
    with pytest.raises(ResolutionError, match="no registered kernel is usable here"):  # as ever, without it
        resolve({}, Target("cpu", needs=needs), registry=reg)
    plan = resolve({}, Target("cpu", needs=needs, leaves_to_model=True), registry=reg)
    assert [op for op, _ in plan.left] == ["rms_norm"]
    assert plan.left[0][1].startswith("no registered kernel is usable here: hopper (needs a cuda device")
    assert plan.for_op("rms_norm") == [] and plan.get("swiglu", "standard").kernel == "portable"
    with pytest.raises(ResolutionError, match="rms_norm_implementation='hopper'"):  # a named kernel is still refused
        resolve({"rms_norm_implementation": "hopper"}, Target("cpu", needs=needs, leaves_to_model=True),
                registry=reg)

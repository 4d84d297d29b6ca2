"""Issue 24: ``auto`` under a memory budget. A kernel's ``extra_memory`` (what it allocates beyond
its inputs and returned gradients) that does not fit the device's free memory is passed over for
the next usable kernel; a named kernel is taken as named; without a budget nothing changes.
The fused loss formulas are checked against the H100 measurement they were read against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_plugin
from veomni_ops import (
    HardwareRequirement,
    KernelSpec,
    MemoryBudget,
    Mode,
    OpsConfig,
    SpecError,
    Target,
    build_registry,
    resolve,
)
from veomni_ops.backends import reference
from veomni_ops.ops.cross_entropy.memory import chunked_extra, eager_extra, eager_logits_extra

GIB = 2**30
MEASURED = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h100-2026-11-26-issue24" / "callA"
            / "bench-flce.json")


def _formulas() -> dict[tuple[str, str, str], object]:
    table: dict[tuple[str, str, str], object] = {
        ("eager", "veomni-ops", "fused_linear"): eager_extra,
        ("chunked", "veomni-ops", "fused_linear"): chunked_extra,
        ("eager", "veomni-ops", "logits"): eager_logits_extra,
    }
    for dist, module in (("veomni-triton", "veomni_triton.memory"), ("veomni-liger", "veomni_liger.memory")):
        try:
            mod = __import__(module, fromlist=["fused_linear_extra"])
        except ImportError:
            continue
        table[(dist.split("-")[1], dist, "fused_linear")] = mod.fused_linear_extra
    return table


def test_formulas_reproduce_the_measured_extra_memory():
    rows = [r for r in json.loads(MEASURED.read_text())["rows"]
            if r["pass"] == "fwd+bwd" and r["dtype"] == "bfloat16" and r["extra_gib"] is not None]
    formulas = _formulas()
    checked = set()
    for r in rows:
        f = formulas.get((r["kernel"], r["distribution"], r["variant"]))
        if f is None:
            continue
        shapes = {"hidden": 2560, **r["shape"], "itemsize": 2}
        got = f(shapes) / GIB  # type: ignore[operator]
        assert got == pytest.approx(r["extra_gib"], rel=0.05), (r["kernel"], r["variant"], r["shape"], got)
        checked.add((r["kernel"], r["variant"], r["shape"]["tokens"]))
    # every formula met every measured size (8k, 16k, 32k tokens)
    assert {(k, v) for k, _, v in formulas} == {(k, v) for k, v, _ in checked}
    assert {n for _, _, n in checked} == {8192, 16384, 32768}


def test_the_core_specs_declare_their_formulas():
    from veomni_ops.ops.cross_entropy.reference import specs as core_specs

    specs = {(s.name, s.variant): s for s in core_specs()}
    assert specs[("eager", "fused_linear")].extra_memory is eager_extra
    assert specs[("chunked", "fused_linear")].extra_memory is chunked_extra
    assert specs[("eager", "logits")].extra_memory is eager_logits_extra


def test_extra_memory_must_be_callable():
    with pytest.raises(SpecError, match=r"kernel 'fat' \(cross_entropy/fused_linear\): extra_memory must be a "
                                        r"function of the op's shapes"):
        KernelSpec(name="fat", op="cross_entropy", variant="fused_linear", factory="m:f", extra_memory=3 * GIB)
    ok = KernelSpec(name="fat", op="cross_entropy", variant="fused_linear", factory="m:f",
                    extra_memory=lambda shapes: 3 * GIB)
    assert ok.to_dict()["extra_memory"].endswith("<lambda>")


def test_memory_budget_is_checked():
    with pytest.raises(ValueError, match="free_bytes must be a non-negative int"):
        MemoryBudget(-1)
    with pytest.raises(ValueError, match="unknown op"):
        MemoryBudget(GIB, shapes={"softmax": {"tokens": 1}})
    with pytest.raises(ValueError, match="non-negative int"):
        MemoryBudget(GIB, shapes={"cross_entropy": {"tokens": 1.5}})
    with pytest.raises(TypeError, match="MemoryBudget"):
        Target("cuda:9.0", memory=GIB)  # type: ignore[arg-type]


# -- resolution -------------------------------------------------------------------------------
SHAPES = {"cross_entropy": {"tokens": 32768, "hidden": 2560, "vocab": 151936, "itemsize": 2}}
NEEDS = {"cross_entropy": [("fused_linear", "logits")]}
_FACTORY = "veomni_ops.kernels.cross_entropy:chunked_fused_linear_cross_entropy_sum"
_CUDA = HardwareRequirement(("cuda",), min_capability=(8, 0))


def _registry(fast_gib: float = 3.043, lean_gib: float = 1.449):
    """The core's kernels, a fast compiling "triton" and a lean non-compiling "liger" (as the plugins)."""
    plugin = make_plugin("flce", cross_entropy=[
        KernelSpec(name="triton", op="cross_entropy", variant="fused_linear", factory=_FACTORY, priority=30,
                   supports_compile=True, hardware=_CUDA, extra_memory=lambda shapes: int(fast_gib * GIB)),
        KernelSpec(name="liger", op="cross_entropy", variant="fused_linear", factory=_FACTORY, priority=20,
                   hardware=_CUDA, extra_memory=lambda shapes: int(lean_gib * GIB)),
    ])
    return build_registry(modules=[("eager", reference), ("flce", plugin)], include_entry_points=False, env={})


def _plan(free_gib: float | None, compile: bool = False, config=None):
    memory = None if free_gib is None else MemoryBudget(int(free_gib * GIB), shapes=SHAPES)
    target = Target("cuda:9.0", dtype="bfloat16", mode=Mode.of(compile=compile), needs=NEEDS, memory=memory)
    plan = resolve(config or OpsConfig(), target, registry=_registry(), load=False)
    return plan.get("cross_entropy", "fused_linear") or plan.get("cross_entropy", "logits")


def test_auto_passes_over_the_fast_kernel_where_its_extra_memory_does_not_fit():
    e = _plan(2.0)
    assert e.kernel == "liger"
    assert "passed over triton (needs 3.04 GiB beyond its inputs at 32768 tokens; 2.00 GiB free on the device)" \
        in e.reason, e.reason
    # room enough: the fast one, said as without a budget
    roomy, none = _plan(4.0), _plan(None)
    assert roomy.kernel == none.kernel == "triton" and roomy.reason == none.reason


def test_compile_mode_passes_over_the_measured_choice_where_it_does_not_fit():
    e = _plan(2.0, compile=True)
    # liger does not compile; the compiled logits loss holds the [N, V] logits: the chunked kernel
    assert e.kernel == "chunked" and e.variant == "fused_linear"
    assert ("passed over the measured compile-mode choice triton (needs 3.04 GiB beyond its inputs at 32768 "
            "tokens; 2.00 GiB free on the device)") in e.reason, e.reason
    assert "the measured compile-mode choice eager (needs 55.64 GiB beyond its inputs at 32768 tokens, the " \
           "[N, V] logits the head makes for it included" in e.reason
    none = _plan(None, compile=True)
    assert none.kernel == "triton" and "by measurement" in none.reason


def test_a_named_kernel_is_taken_whatever_it_needs():
    e = _plan(0.5, config=OpsConfig(cross_entropy_loss_implementation="triton"))
    assert e.kernel == "triton" and e.reason == "requested by name"
    assert _plan(0.5).kernel != "triton"  # the budget is in force: auto would not take it


def test_where_nothing_fits_auto_takes_the_leanest():
    e = _plan(0.5)
    assert e.kernel == "liger" and e.variant == "fused_linear"
    assert e.reason.startswith("auto: no usable kernel fits the free device memory; took the one that needs least, "
                               "liger (needs 1.45 GiB")


def test_a_kernel_without_a_formula_is_never_passed_over():
    plugin = make_plugin("unknown", cross_entropy=[
        KernelSpec(name="fat", op="cross_entropy", variant="fused_linear", factory=_FACTORY, priority=50,
                   hardware=_CUDA, extra_memory=lambda shapes: GIB),
        KernelSpec(name="mystery", op="cross_entropy", variant="fused_linear", factory=_FACTORY, priority=40,
                   hardware=_CUDA)])
    reg = build_registry(modules=[("eager", reference), ("unknown", plugin)], include_entry_points=False, env={})
    target = Target("cuda:9.0", dtype="bfloat16", needs=NEEDS, memory=MemoryBudget(0, shapes=SHAPES))
    e = resolve(OpsConfig(), target, registry=reg, load=False).get("cross_entropy", "fused_linear")
    assert e.kernel == "mystery" and "passed over fat (needs 1.00 GiB" in e.reason


def test_a_formula_that_fails_names_its_kernel():
    plugin = make_plugin("bad", cross_entropy=[
        KernelSpec(name="picky", op="cross_entropy", variant="fused_linear", factory=_FACTORY, priority=40,
                   hardware=_CUDA, extra_memory=lambda shapes: shapes["sequence"])])
    reg = build_registry(modules=[("eager", reference), ("bad", plugin)], include_entry_points=False, env={})
    target = Target("cuda:9.0", dtype="bfloat16", needs=NEEDS, memory=MemoryBudget(GIB, shapes=SHAPES))
    with pytest.raises(SpecError, match=r"kernel 'picky' \(cross_entropy/fused_linear\): its extra memory could "
                                        r"not be computed .*KeyError: 'sequence'"):
        resolve(OpsConfig(), target, registry=reg, load=False)


# -- the train job's budget -------------------------------------------------------------------
def _job(b: int = 4, s: int = 1024) -> dict:
    return {"train": {"batch_size": b, "seq_len": s}}


def _model(meta: bool = False):
    import torch
    import transformers

    cfg = transformers.Qwen3Config(hidden_size=64, vocab_size=1000, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=32, head_dim=32)
    model = torch.nn.Linear(64, 1000, bias=False, device="meta" if meta else "cpu", dtype=torch.bfloat16)
    model.config = cfg
    return model


def test_train_job_budget_is_cuda_only_and_counts_one_ranks_tokens(monkeypatch):
    import torch
    from veomni_ops.train.loop import memory_budget

    assert memory_budget(_job(), "cpu", torch.bfloat16, _model()) is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (5 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * GIB)
    got = memory_budget(_job(), "cuda:0", torch.bfloat16, _model())
    assert got.free_bytes == 6 * GIB  # the driver's free, plus what PyTorch caches unused
    assert got.shapes == {"cross_entropy": {"tokens": 4096, "hidden": 64, "vocab": 1000, "itemsize": 2}}

    from veomni_ops.parallel import ParallelLayout

    class Runtime:
        layout = ParallelLayout(dp_shard=2, sp=4)

    ranked = memory_budget(_job(s=1023), "cuda:0", torch.bfloat16, _model(), Runtime())
    assert ranked.shapes["cross_entropy"]["tokens"] == 2 * 256  # its rows, its (padded) sequence slice
    Runtime.layout = ParallelLayout(dp_replicate=2, dp_shard=2)  # HSDP: the rows split over both
    ranked = memory_budget(_job(), "cuda:0", torch.bfloat16, _model(), Runtime())
    assert ranked.shapes["cross_entropy"]["tokens"] == 1 * 1024
    # built on the meta device: the weights still to come are not free
    meta = memory_budget(_job(), "cuda:0", torch.bfloat16, _model(meta=True))
    assert meta.free_bytes == 6 * GIB - 64 * 1000 * 2

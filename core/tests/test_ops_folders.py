"""One op, one folder: every table keyed by an op is read from ``veomni_ops/ops/<op>/``.

The toy-op test adds an op the way CONTRIBUTING says (one folder and one ``OpsConfig`` field) to
a copy of the package, and checks that the op is then everywhere the runtime looks: the op
table, the hookspecs, the reference backend, the binders, the conformance kit and its pytest
plugin, the bench, resolution and binding.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import veomni_ops
from veomni_ops.ops import OP_DEFS, OP_TABLE, conformance_class_name

#: A complete op folder: ``channel_scale``, ``x * w`` per channel (what LayerScale computes).
TOY_OP = {
    "__init__.py": '''
        """The ``channel_scale`` op: ``hidden_states * weight`` per channel, as LayerScale computes it."""

        from __future__ import annotations

        from ..base import OpDef, OpInfo

        CONTRACT = """Per-channel scaling: ``hidden_states * weight``.

        Kernel signature::

            kernel(hidden_states: Tensor[..., H], weight: Tensor[H]) -> Tensor[..., H]

        Output in the input dtype. Backward produces gradients for both inputs. Variant: ``standard``.
        """

        OP = OpDef("channel_scale", order=80, info=OpInfo(("standard",), "channel_scale_implementation"),
                   contract=CONTRACT, package=__name__)
        ''',
    "reference.py": '''
        from __future__ import annotations

        from ...backends.base import ELEMENTWISE_TOLERANCES, eager_spec
        from ...spec import KernelSpec


        def specs() -> list[KernelSpec]:
            return [eager_spec("channel_scale", "standard", "veomni_ops.ops.channel_scale.kernel:channel_scale",
                               ELEMENTWISE_TOLERANCES, "PyTorch hidden_states * weight")]
        ''',
    "kernel.py": '''
        from __future__ import annotations

        import torch

        __all__ = ["channel_scale"]


        def channel_scale(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return hidden_states * weight
        ''',
    "binder.py": '''
        from __future__ import annotations

        from torch import nn

        from ...binding.place import Binder, Place


        def _find(path, m, survey):
            weight = getattr(m, "weight", None)
            if type(m).__name__.endswith("LayerScale") and isinstance(weight, nn.Parameter) and weight.dim() == 1:
                return [Place("channel_scale", "standard", path, m)]
            return []


        def _bind(place, kernel, edits):
            def forward(self, hidden_states):
                return kernel(hidden_states, self.weight)

            edits.forwards.append((place.module, forward))


        BINDER = Binder("channel_scale", _find, _bind)
        ''',
    "cases.py": '''
        from __future__ import annotations

        from ...testing.cases.base import Case, OpHarness, pick, same_dtype


        def _cases(variant, size):
            small = [Case("2d-3x17", lambda b: {"x": b.randn(3, 17), "w": b.randn(17)}, ("x", "w"), "odd size")]
            full = [Case("2d-512x4096", lambda b: {"x": b.randn(512, 4096), "w": b.randn(4096)}, ("x", "w"))]
            return pick(size, small, full)


        HARNESS = OpHarness(op="channel_scale", out_names=("out",),
                            reference={"standard": "veomni_ops.ops.channel_scale.kernel:channel_scale"},
                            call=lambda fn, inp, reference: (fn(inp["x"], inp["w"]),),
                            out_dtypes=lambda dt: [same_dtype(dt)], cases=_cases)
        ''',
    "bench.py": '''
        from __future__ import annotations

        from ..base import OpWorkload


        def _bytes(sh, s, bwd):
            n, h = sh["tokens"], sh["hidden"]
            return ((4 if bwd else 2) * n * h + (2 if bwd else 1) * h) * s


        FORMULAS = {"channel_scale": ("fwd (2·N·H + H)·s; fwd+bwd (4·N·H + 2·H)·s", _bytes)}
        IN_PRESETS = {"cpu-small": [OpWorkload("standard", "float32", "bytes", dict(tokens=64, hidden=128))]}


        def build_inputs(w, d):
            return {"x": d.randn(w.shape["tokens"], w.shape["hidden"]), "w": d.randn(w.shape["hidden"])}, ("x", "w")
        ''',
}

#: What the copy with the toy op must show (run in a fresh interpreter, on the copy).
CHECK_TOY_OP = '''
import importlib, sys, warnings

import torch
from torch import nn

import veomni_ops
assert veomni_ops.__file__.startswith(sys.argv[1]), veomni_ops.__file__  # the copy, not the tree under test

from veomni_ops.ops import OP_TABLE, OPS
assert list(OP_TABLE)[-1] == "channel_scale" and OPS["channel_scale"] == ("standard",)
assert OP_TABLE["channel_scale"].config_field == "channel_scale_implementation"

from veomni_ops.hookspecs import OpHookspecs
assert "Per-channel scaling" in OpHookspecs.channel_scale.__doc__
assert 'op="channel_scale"' in OpHookspecs.channel_scale.__doc__  # the generated example

from veomni_ops.backends import reference
assert [s.name for s in reference.channel_scale()] == ["eager"]
from veomni_ops import OpsConfig, discover, resolve
reg = discover()
assert "eager" in reg.names("channel_scale"), reg.failures
plan = resolve(OpsConfig(channel_scale_implementation="eager"), "cpu", registry=reg, training=False)
fn = plan.kernel("channel_scale", "standard")
assert torch.equal(fn(torch.ones(2, 3), torch.full((3,), 2.0)), torch.full((2, 3), 2.0))

from veomni_ops.binding.binders import BINDERS, BY_OP, find_places
assert BY_OP["channel_scale"].op == "channel_scale" and "channel_scale" in [b.op for b in BINDERS]
class LayerScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 0.5))
    def forward(self, x):
        return x * self.weight
LayerScale.__module__ = "transformers_modules.toy"  # library code (a remote-code model): binding replaces only that
model = nn.Sequential(nn.Linear(4, 4), LayerScale())
places = [p for p in find_places(model) if p.op == "channel_scale"]
assert [(p.path, p.variant) for p in places] == [("1", "standard")]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    binding = veomni_ops.apply(model, {"channel_scale_implementation": "eager"})
assert binding.bound == (("1", "channel_scale", "standard", "eager"),), binding
assert torch.equal(model[1](torch.ones(2, 4)), torch.full((2, 4), 0.5))

from veomni_ops.testing.pytest_plugin import OPS as PLUGIN_OPS
assert "channel_scale" in PLUGIN_OPS
from veomni_ops.testing import ChannelScaleConformance
assert ChannelScaleConformance.op == "channel_scale"
from veomni_ops.testing.cases import harness
assert harness("channel_scale").op == "channel_scale"
from veomni_ops.testing.runner import run_checks
report = run_checks(reg, backend="eager", op="channel_scale", device="cpu", size="small", dtypes=["float32"])
assert [k.status for k in report.kernels] == ["pass"], report.table()

workloads = importlib.import_module("veomni_ops.bench.workloads")
(w,) = workloads.workloads(["cpu-small"], op="channel_scale")
assert "channel_scale" in workloads.FORMULAS and w.amount("fwd") == (2 * 64 * 128 + 128) * 4
inputs, diff = workloads.build_inputs(w, "cpu")
assert inputs["x"].shape == (64, 128) and diff == ("x", "w")
print("ok")
'''


def _with_toy_op(root: Path) -> Path:
    """A copy of the installed package at ``root`` plus the toy op: its folder and its config field."""
    pkg = root / "veomni_ops"
    shutil.copytree(Path(veomni_ops.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    folder = pkg / "ops" / "channel_scale"
    folder.mkdir()
    for name, text in TOY_OP.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    config = pkg / "config.py"
    last = "    load_balancing_loss_implementation: str = AUTO\n"
    text = config.read_text()
    assert last in text, "OpsConfig's last op field moved: update this test"
    config.write_text(text.replace(last, last + "    channel_scale_implementation: str = AUTO\n"))
    return pkg


def test_a_new_op_is_one_folder_and_one_config_field(tmp_path):
    _with_toy_op(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", CHECK_TOY_OP, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_a_folder_without_its_op_is_refused_at_import(tmp_path):
    pkg = tmp_path / "veomni_ops"
    shutil.copytree(Path(veomni_ops.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "ops" / "half_done").mkdir()
    (pkg / "ops" / "half_done" / "__init__.py").write_text('"""An op folder that forgot its OP."""\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", "import veomni_ops.ops"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "veomni_ops.ops.half_done: an op folder defines OP = veomni_ops.ops.base.OpDef(...)" in done.stderr


def test_every_table_is_a_view_of_the_folders():
    from veomni_ops.bench import FORMULAS, PRESETS, workloads
    from veomni_ops.binding.binders import BINDERS
    from veomni_ops.compile_policy import COMPILE_PREFERENCES
    from veomni_ops.config import FIELD_TO_OP, LEGACY_VALUES
    from veomni_ops.hookspecs import OpHookspecs
    from veomni_ops.parallel.layout import ParallelLayout
    from veomni_ops.testing import conformance
    from veomni_ops.testing.cases import HARNESSES
    from veomni_ops.testing.pytest_plugin import OPS as PLUGIN_OPS

    ops = list(OP_TABLE)
    assert ops == list(OP_DEFS) == list(PLUGIN_OPS) == list(HARNESSES)
    assert sorted(FIELD_TO_OP.values()) == sorted(ops)
    assert sorted(b.op for b in BINDERS) == sorted(ops)
    for op, d in OP_DEFS.items():
        assert getattr(OpHookspecs, op).__doc__.startswith(d.contract)
        assert getattr(conformance, conformance_class_name(op)).op == op
        assert LEGACY_VALUES.get(op, {}) == dict(d.legacy)
        assert all(COMPILE_PREFERENCES[(op, dev)] == prefs for dev, prefs in d.compile_preferences.items())
        assert {w.op for w in workloads(["cpu-small"], op=op)} == {op}  # every op has a cpu-small workload
        assert any(k == op or k.startswith(f"{op}/") for k in FORMULAS)
    assert set(PRESETS) >= {"seed", "host", "cpu-small"}
    # a parallel layout needs, per op, the modes the op offers and the layout uses
    assert ParallelLayout(dp_shard=2, sp=2, ep=2).needs() == {"moe_experts": ("ep",), "attention": ("sp",)}
    assert ParallelLayout(dp_shard=2).needs() == {}


#: The core's own kernels, per op and variant: what the reference backend must register (an op
#: folder's ``reference.py``). Written out, not derived from the folders, so that a kernel dropped
#: from a folder's specs fails here instead of vanishing from every plan and check.
CORE_KERNELS = {
    ("rms_norm", "standard"): {"eager"},
    ("rms_norm", "offset"): {"eager"},
    ("residual_rms_norm", "standard"): {"eager"},
    ("rotary", "full"): {"eager"},
    ("rotary", "partial"): {"eager"},
    ("swiglu", "standard"): {"eager"},
    ("cross_entropy", "logits"): {"eager"},
    ("cross_entropy", "fused_linear"): {"eager", "chunked"},
    ("moe_router", "standard"): {"eager"},
    ("moe_experts", "standard"): {"eager", "grouped_mm"},
    ("load_balancing_loss", "standard"): {"eager"},
    ("attention", "standard"): {"eager", "sdpa", "flex_attention"},
}


def test_the_core_registers_its_kernels_from_the_folders():
    """The installed core's entry point registers exactly :data:`CORE_KERNELS`, each from its op's
    folder (factory ``veomni_ops.ops.<op>.kernel:<fn>``, a function that exists), ``eager`` for
    every variant of every op."""
    import importlib

    from veomni_ops.discovery import build_registry
    from veomni_ops.registry import CORE_DISTRIBUTION

    reg = build_registry(env={})  # the installed entry points, as a process builds them (no switches set)
    assert not [f for f in reg.failures if f.provenance.distribution == CORE_DISTRIBUTION], reg.failures
    core = [rk for rk in reg if rk.provenance.distribution == CORE_DISTRIBUTION]
    got: dict[tuple[str, str], set[str]] = {}
    for rk in core:
        got.setdefault((rk.spec.op, rk.spec.variant), set()).add(rk.spec.name)
    assert got == CORE_KERNELS
    assert set(CORE_KERNELS) == {(op, v) for op, d in OP_DEFS.items() for v in d.info.variants}
    for rk in core:
        module, _, attr = rk.spec.factory.partition(":")
        assert module == f"veomni_ops.ops.{rk.spec.op}.kernel", rk.spec.factory
        assert callable(getattr(importlib.import_module(module), attr)), rk.spec.factory

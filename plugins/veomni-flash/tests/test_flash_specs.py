"""Specs, hardware gating, metadata, name mapping, and what importing costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pluggy
import pytest
import veomni_flash
from packaging.requirements import Requirement
from veomni_flash import NAME_TO_VERSION, PACKAGES, VEOMNI_NAMES, specs, version_for
from veomni_ops.hookspecs import PROJECT, OpHookspecs
from veomni_ops.spec import KernelSpec

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.dirname(HERE)
SRC = os.path.join(PLUGIN, "src")
CORE_SRC = os.path.join(os.path.dirname(os.path.dirname(PLUGIN)), "core", "src")
FA4_ONLY = os.path.join(HERE, "standins", "fa4_only")
STANDINS = os.path.join(HERE, "standins")


def all_specs() -> dict[str, KernelSpec]:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(OpHookspecs)
    pm.register(specs)
    pm.check_pending()  # no misspelt hook
    out = {}
    for group in pm.hook.attention():
        for s in group:
            out[s.name] = s
    return out


def test_three_attention_specs():
    got = all_specs()
    assert set(got) == {"flash_attention_2", "flash_attention_3", "flash_attention_4"}
    for name, s in got.items():
        v = int(name[-1])
        assert (s.op, s.variant) == ("attention", "standard")
        assert s.factory == f"veomni_flash.kernels.fa{v}:flash_attention_{v}"
        assert s.dtypes == ("bfloat16", "float16")
        assert s.supports_backward is True
        assert s.supports_compile is False
        assert s.hardware.device_types == ("cuda",)
        assert [Requirement(r).name for r in s.requires] == [PACKAGES[v].distribution]
        assert PACKAGES[v].distribution in s.install_hint or "pip install" in s.install_hint
        assert s.tolerance("bfloat16").atol > s.tolerance("float16").atol
    assert [got[f"flash_attention_{v}"].priority for v in (4, 3, 2)] == [40, 35, 5]


def test_fa2_ranks_below_sdpa_and_above_eager():
    """Measured on an H100 (2026-11-26): sdpa 1.55x faster than FA2 fwd+bwd, so auto prefers sdpa; FA2 still
    beats eager for the layers sdpa cannot serve (softcap)."""
    from veomni_ops.backends import reference

    core = {s.name: s.priority for s in reference.attention()}
    fa2 = all_specs()["flash_attention_2"]
    assert core["eager"] < fa2.priority < core["sdpa"] < all_specs()["flash_attention_4"].priority
    assert "softcap" in fa2.features and "softcap" not in next(s for s in reference.attention() if s.name == "sdpa").features
    assert Requirement(fa2.requires[0]).specifier.contains("2.8.3.post2")


def test_fa4_requirement_admits_the_beta_it_was_written_for():
    # 4.0.0b36 is a pre-release: ">=4.0" would refuse it.
    req = Requirement(all_specs()["flash_attention_4"].requires[0])
    assert req.specifier.contains("4.0.0b36")
    assert not req.specifier.contains("4.0.0b35")


@pytest.mark.parametrize(
    "name,device,ok",
    [
        ("flash_attention_2", "cuda:7.5", False),
        ("flash_attention_2", "cuda:8.0", True),
        ("flash_attention_2", "cuda:12.0", True),
        ("flash_attention_3", "cuda:8.6", True),
        ("flash_attention_3", "cuda:9.0", True),
        ("flash_attention_3", "cuda:10.0", False),
        ("flash_attention_4", "cuda:8.0", False),  # forward only on sm8x: its backward asserts 9.x+
        ("flash_attention_4", "cuda:9.0", True),
        ("flash_attention_4", "cuda:10.0", True),
        ("flash_attention_4", "cuda:12.1", True),
        ("flash_attention_4", "cpu", False),
        ("flash_attention_4", "npu", False),
    ],
)
def test_hardware_gating(name, device, ok):
    from veomni_ops.device import check_hardware, parse_device

    why = check_hardware(all_specs()[name].hardware, parse_device(device))
    assert (why is None) == ok, why


def test_core_registry_accepts_the_specs():
    from veomni_ops.discovery import build_registry

    reg = build_registry([("veomni-flash", specs)], include_entry_points=False, env={})
    assert not reg.failures
    assert sorted(reg.names("attention")) == ["flash_attention_2", "flash_attention_3", "flash_attention_4"]


def test_resolution_refuses_fa4_on_ampere_and_explains():
    from veomni_ops.discovery import build_registry
    from veomni_ops.resolve import ResolutionError, resolve

    reg = build_registry([("veomni-flash", specs)], include_entry_points=False, env={})
    with pytest.raises(ResolutionError) as ei:
        resolve({"attn_implementation": "flash_attention_4"}, "cuda:8.0", needs={"attention": ["standard"]},
                registry=reg, load=False)
    assert "9.0" in str(ei.value)


def test_name_mapping():
    assert NAME_TO_VERSION == {
        "flash_attention_2": 2,
        "flash_attention_3": 3,
        "flash_attention_4": 4,
        "veomni_flash_attention_2_with_sp": 2,
        "veomni_flash_attention_3_with_sp": 3,
        "veomni_flash_attention_4_with_sp": 4,
    }
    assert set(VEOMNI_NAMES) == {n for n in NAME_TO_VERSION if n.startswith("veomni_")}
    assert version_for("veomni_flash_attention_3_with_sp") == 3
    with pytest.raises(KeyError, match="known: flash_attention_2"):
        version_for("flash_attention_5")
    assert {p.module for p in PACKAGES.values()} == {"flash_attn", "flash_attn_interface", "flash_attn.cute"}
    assert {p.distribution for p in PACKAGES.values()} == {"flash-attn", "flash-attn-3", "flash-attn-4"}


def test_pyproject_metadata():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(PLUGIN, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    proj = meta["project"]
    assert proj["name"] == "veomni-flash" and proj["version"] == veomni_flash.__version__ == "0.1.0"
    deps = [Requirement(d) for d in proj["dependencies"]]
    assert [d.name for d in deps] == ["veomni-ops"]  # no flash package is a hard dependency
    extras = proj["optional-dependencies"]
    for p in PACKAGES.values():
        assert p.distribution in {Requirement(r).name for r in extras[p.extra]}
    assert proj["entry-points"]["veomni_ops.backends"] == {"flash": "veomni_flash.specs"}


def _run(code: str, extra_path: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(extra_path or []), CORE_SRC, SRC])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_discovery_imports_no_flash_package_and_no_torch():
    code = (
        "import json, sys\n"
        "import veomni_flash.specs as s\n"
        "specs = s.attention()\n"
        "heavy = [m for m in ('torch', 'transformers', 'flash_attn', 'flash_attn.cute', 'flash_attn_interface',"
        " 'cutlass', 'triton', 'veomni_flash.kernels') if m in sys.modules]\n"
        "print(json.dumps({'n': len(specs), 'heavy': heavy}))\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"n": 3, "heavy": []}


def test_missing_package_is_an_import_error_naming_it():
    # One interpreter for all cases (importing torch dominates the cost).
    code = (
        "import importlib, json\n"
        "from veomni_flash import transformers_adapter as ta\n"
        "out = {}\n"
        "for v in (2, 3, 4):\n"
        "    try:\n"
        "        importlib.import_module(f'veomni_flash.kernels.fa{v}')\n"
        "    except ImportError as e:\n"
        "        out[v] = str(e)\n"
        "try:\n"
        "    ta.register_flash_attention(3)\n"
        "except ImportError as e:\n"
        "    out['register'] = str(e)\n"
        "print(json.dumps(out))\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for v in (2, 3, 4):
        msg = got[str(v)]
        assert f"flash_attention_{v} needs the {PACKAGES[v].distribution!r} package" in msg, msg
        assert "Install it:" in msg and "pip install" in msg, msg
    assert got["register"].startswith("flash_attention_3 needs the 'flash-attn-3' package")


def test_fa4_alone_as_namespace_package():
    """flash-attn-4 installed alone: `flash_attn` is a namespace holding only `cute`."""
    code = (
        "import flash_attn, json\n"
        "from veomni_flash.kernels.fa4 import BACKEND\n"
        "out = {'ns': getattr(flash_attn, '__file__', None) is None, 'fa4': BACKEND.flash_attn_func.__name__}\n"
        "try:\n"
        "    import veomni_flash.kernels.fa2\n"
        "except ImportError as e:\n"
        "    out['fa2'] = str(e)\n"
        "print(json.dumps(out))\n"
    )
    r = _run(code, [FA4_ONLY, STANDINS])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ns"] is True and got["fa4"] == "fa4_func"
    assert "'flash-attn' package" in got["fa2"] and "namespace package" in got["fa2"]


def _fake_fa4_metadata(root, init_bytes: bytes) -> None:
    """A flash-attn-4 dist-info whose RECORD hashes flash_attn/cute/__init__.py as ``init_bytes``."""
    import base64
    import hashlib

    info = root / "flash_attn_4-4.0.0b36.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn-4\nVersion: 4.0.0b36\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(init_bytes).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"flash_attn/cute/__init__.py,sha256={digest},{len(init_bytes)}\n"
                                 "flash_attn_4-4.0.0b36.dist-info/RECORD,,\n")


@pytest.mark.parametrize("overwritten", [False, True])
def test_fa4_refuses_flash_attn_cute_overwritten_by_fa2(tmp_path, overwritten):
    """flash-attn 2.8.3's wheel ships an older flash_attn/cute (seen in the H100 build, 2026-11-26):
    installed after flash-attn-4 it replaces FA4's files; the kernel then refuses to load."""
    init = os.path.join(FA4_ONLY, "flash_attn", "cute", "__init__.py")
    with open(init, "rb") as f:
        data = f.read()
    _fake_fa4_metadata(tmp_path, data + b"# flash-attn 2.x's copy\n" if overwritten else data)
    code = (
        "import json\n"
        "try:\n"
        "    from veomni_flash.kernels.fa4 import BACKEND\n"
        "    print(json.dumps({'ok': BACKEND.flash_attn_func.__name__}))\n"
        "except ImportError as e:\n"
        "    print(json.dumps({'error': str(e)}))\n"
    )
    r = _run(code, [str(tmp_path), FA4_ONLY, STANDINS])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if overwritten:
        assert "is not flash-attn-4 4.0.0b36's file" in got["error"], got
        assert "pip install --force-reinstall --no-deps flash-attn-4" in got["error"]
    else:
        assert got == {"ok": "fa4_func"}

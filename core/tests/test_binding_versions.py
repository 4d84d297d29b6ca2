"""The transformers range binding supports: declared once, checked by ``apply``, explained when outside."""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest
from veomni_ops.binding import versions
from veomni_ops.binding.versions import UnsupportedTransformersError, check_transformers, support_problem

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_the_range_binding_checks():
    """core's ``models``/``test`` extras, veomni-flash's extras and the binding module name one range."""
    want = f"transformers{versions.SUPPORTED}"
    for path, extras in [(ROOT / "core/pyproject.toml", ("models", "test")),
                         (ROOT / "plugins/veomni-flash/pyproject.toml", ("transformers", "test"))]:
        deps = tomllib.loads(path.read_text())["project"]["optional-dependencies"]
        for extra in extras:
            got = [d for d in deps[extra] if d.startswith("transformers")]
            assert got == [want], f"{path.name} [{extra}] says {got}, the binding module {want}"


def test_constraints_pin_a_release_inside_the_range():
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    assert support_problem(pins["transformers"]) is None


@pytest.mark.parametrize(("version", "side"), [("5.16.1", "older"), ("5.25.0", "newer"), ("6.0.0", "newer")])
def test_outside_the_range_is_refused_with_version_range_and_fix(version, side):
    with pytest.raises(UnsupportedTransformersError) as ei:
        check_transformers(type("Qwen3ForCausalLM", (), {}), version=version, env={})
    msg = str(ei.value)
    assert f"transformers {version}" in msg and "cannot bind Qwen3ForCausalLM" in msg
    assert versions.SUPPORTED in msg
    assert f'pip install "transformers{versions.SUPPORTED}"' in msg
    assert f"is {side} than the range" in msg
    assert f"VEOMNI_OPS_ALLOW_TRANSFORMERS={version}" in msg


def test_allow_variable_turns_exactly_that_version_into_a_warning():
    with pytest.warns(RuntimeWarning, match="binding anyway"):
        check_transformers(None, version="5.30.0", env={"VEOMNI_OPS_ALLOW_TRANSFORMERS": "5.30.0"})
    with pytest.raises(UnsupportedTransformersError):  # another version is still refused
        check_transformers(None, version="5.31.0", env={"VEOMNI_OPS_ALLOW_TRANSFORMERS": "5.30.0"})


def test_inside_the_range_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_transformers(None, version=versions.MIN_TRANSFORMERS, env={})
        check_transformers(None, version="5.24.0", env={})

"""``veomni-ops new-backend``: the copy of the backend template it writes carries the new names
everywhere (no ``template`` left, in a path or a line), loads as a backend, and does not take
``auto``; bad names and folders are refused before anything is written. The copy is built,
installed and tested by its own ci.sh in the template session (noxfile.py)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from veomni_ops import OpsConfig, build_registry, resolve
from veomni_ops.backends import reference
from veomni_ops.cli import main
from veomni_ops.new_backend import names_for, template_files, write_backend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    out = tmp_path_factory.mktemp("new") / "veomni-backend-my-fast"
    assert main(["new-backend", "my_fast", str(out)]) == 0
    return out


def test_the_copy_has_no_template_name_left(copy):
    files = sorted(p for p in copy.rglob("*") if p.is_file())
    assert len(files) == len(list(template_files())) >= 10
    left = [f"{p.relative_to(copy)}:{i}: {line}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search("template", line, re.I)]
    left += [str(p.relative_to(copy)) for p in files if re.search("template", str(p.relative_to(copy)), re.I)]
    assert not left, "\n".join(left)


def test_the_copy_is_renamed_in_every_place_a_backend_names_itself(copy):
    project = tomllib.loads((copy / "pyproject.toml").read_text())["project"]
    assert project["name"] == "veomni-backend-my-fast"
    assert project["entry-points"]["veomni_ops.backends"] == {"my_fast": "veomni_backend_my_fast.specs"}
    package = copy / "src" / "veomni_backend_my_fast"
    assert {p.name for p in package.rglob("*.py")} == {"__init__.py", "specs.py", "_common.py", "swiglu.py"}
    assert (copy / "tests" / "test_my_fast.py").is_file()
    assert "class TestMyFastSwiglu(SwigluConformance):" in (copy / "tests" / "test_conformance.py").read_text()
    assert 'CHECKS = BackendChecks("my_fast",' in (package / "kernels" / "_common.py").read_text()
    assert "swiglu_mlp_implementation: my_fast" in (copy / "example-config.yaml").read_text()
    assert (copy / "ci.sh").stat().st_mode & 0o111


def test_the_copy_loads_resolves_by_name_and_does_not_take_auto(copy, monkeypatch):
    """Its spec module as a plugin (from its source: the install is the template session's): the
    kernel resolves by its new name, and `auto` keeps the core's eager (priority 0, a tie the
    core wins; the template's old 5 took swiglu's auto on every CPU)."""
    monkeypatch.syspath_prepend(str(copy / "src"))
    import veomni_backend_my_fast.specs as specs

    try:
        reg = build_registry([("veomni-ops", reference), ("veomni-backend-my-fast", specs)],
                             include_entry_points=False, env={})
        named = resolve(OpsConfig(swiglu_mlp_implementation="my_fast"), "cpu", needs={"swiglu": ["standard"]},
                        registry=reg).get("swiglu", "standard")
        assert (named.kernel, named.reason) == ("my_fast", "requested by name")
        auto = resolve(OpsConfig(), "cpu", needs={"swiglu": ["standard"]}, registry=reg).get("swiglu", "standard")
        assert (auto.kernel, auto.distribution) == ("eager", "veomni-ops"), auto
        assert "tie at priority 0 with my_fast@veomni-backend-my-fast" in auto.reason, auto.reason
    finally:
        for name in [m for m in sys.modules if m.startswith("veomni_backend_my_fast")]:
            del sys.modules[name]


@pytest.mark.parametrize("argv, words", [
    (["My-Fast"], "NAME 'My-Fast': a kernel name starts with a lower-case letter"),
    (["eager"], "NAME 'eager' is reserved"),
    (["auto"], "NAME 'auto' is reserved"),
    (["ok", "--distribution", "My_Dist"], "--distribution 'My_Dist'"),
    (["ok", "--distribution", "veomni-ops"], "--distribution veomni-ops is the core's own name"),
])
def test_bad_names_are_refused_naming_the_fix_and_nothing_is_written(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    assert main(["new-backend", argv[0], str(out), *argv[1:]]) == 1
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_every_problem_of_the_names_in_one_error():
    with pytest.raises(ValueError, match=r"NAME 'Bad Name'.*; --distribution 'X Y'"):
        names_for("Bad Name", "X Y")


def test_a_folder_that_is_not_empty_is_refused_and_left_as_it_was(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("mine")
    assert main(["new-backend", "ok", str(tmp_path)]) == 1
    assert f"{tmp_path} exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(write_backend(names_for("ok"), empty)) == len(list(template_files()))


def test_the_template_the_core_ships_is_the_one_in_examples():
    shipped = {rel for rel, _ in template_files()}
    example = ROOT / "examples" / "backend-template"
    in_example = {str(p.relative_to(example)) for p in example.rglob("*") if p.is_file()
                  and "__pycache__" not in p.parts and ".pytest_cache" not in p.parts}
    assert shipped == in_example

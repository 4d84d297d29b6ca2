"""pytest plugin: run transformers' own model test suites with every model bound by veomni-ops.

Loaded with ``-p veomni_bind_plugin`` (this folder on ``PYTHONPATH``) into a pytest run of
transformers' ``tests/`` tree (see ``run.sh``). It does three things, the first two in both
modes so that the plain and the bound runs test the very same configurations:

* ``hidden_act`` is set to ``silu`` on every model tester the collected test classes use
  (transformers' causal-LM testers default to ``gelu``, which has no SwiGLU place and no
  SiLU experts): ``VEOMNI_HF_ACT`` overrides the value, ``VEOMNI_HF_ACT=keep`` leaves the
  testers alone.
* A name the test tree imports from ``transformers.testing_utils`` that the installed
  release no longer has is supplied from ``VEOMNI_HF_COMPAT`` (a JSON object, name -> value,
  that ``run.sh`` reads out of the same transformers ref the tests come from).
* ``VEOMNI_HF_BIND=1``: every model the tests build (directly, ``from_config`` or
  ``from_pretrained``) is bound with ``veomni_ops.apply(model, {}, device="cpu")`` (the all-``auto``
  plan) when its outermost ``PreTrainedModel.__init__`` finishes, i.e. in the ``post_init``
  that no enclosing model's ``__init__`` is still running around. A refusal is raised into
  the test (it fails there). Each binding is logged, one JSON line per model, to
  ``VEOMNI_HF_BIND_LOG`` when set.
* ``VEOMNI_HF_APPLY_CTX=cpu`` (a diagnostic, off by default): ``apply`` runs inside
  ``with torch.device("cpu")``, so that tensors it makes while a model is being built under
  ``with torch.device("meta")`` (``from_pretrained``, ``from_config`` on meta) are made on the CPU.
  It shows what fails behind a binding that does not survive that context.

No transformers code is copied here: the plugin wraps transformers' classes at run time.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import pytest

_STATE: dict[str, Any] = {"test": None, "log": None, "bound": 0, "refused": 0}


def _bind_mode() -> bool:
    return os.environ.get("VEOMNI_HF_BIND", "0") not in ("", "0", "false", "no")


def _act() -> str | None:
    act = os.environ.get("VEOMNI_HF_ACT", "silu")
    return None if act in ("", "keep") else act


def _log(entry: dict[str, Any]) -> None:
    fh = _STATE["log"]
    if fh is not None:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()


# ----------------------------------------------------------------------------------------
# compatibility names for transformers.testing_utils
# ----------------------------------------------------------------------------------------


def _install_compat_names() -> list[str]:
    path = os.environ.get("VEOMNI_HF_COMPAT")
    if not path or not os.path.exists(path):
        return []
    import transformers.testing_utils as tu

    with open(path) as fh:
        names = json.load(fh)
    added = []
    for name, value in names.items():
        if not hasattr(tu, name):
            setattr(tu, name, value)
            added.append(name)
    return added


# ----------------------------------------------------------------------------------------
# binding every outermost model
# ----------------------------------------------------------------------------------------


def _inside_other_model_init(model: Any) -> bool:
    """Is an ``__init__`` of another PreTrainedModel still running further up the stack (so
    ``model`` is a sub-model under construction, e.g. ``LlamaModel`` inside ``LlamaForCausalLM``)?"""
    from transformers import PreTrainedModel

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            other = frame.f_locals.get("self")
            if other is not model and isinstance(other, PreTrainedModel):
                return True
        frame = frame.f_back
    return False


def _bind(model: Any) -> None:
    import veomni_ops

    entry: dict[str, Any] = {"test": _STATE["test"], "model": type(model).__name__,
                             "hidden_act": getattr(getattr(model, "config", None), "hidden_act", None)}
    ctx = os.environ.get("VEOMNI_HF_APPLY_CTX")
    try:
        if ctx:
            import torch

            with torch.device(ctx):
                binding = veomni_ops.apply(model, {}, device="cpu")
        else:
            binding = veomni_ops.apply(model, {}, device="cpu")
    except Exception as e:
        _STATE["refused"] += 1
        entry.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        _log(entry)
        raise
    _STATE["bound"] += 1
    entry.update(ok=True, summary=binding.summary())
    _log(entry)


def _install_binding() -> None:
    from transformers import PreTrainedModel

    original = PreTrainedModel.post_init
    if getattr(original, "_veomni_wrapped", False):
        return

    @functools.wraps(original)
    def post_init(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if not _inside_other_model_init(self):
            _bind(self)
        return out

    post_init._veomni_wrapped = True  # type: ignore[attr-defined]
    PreTrainedModel.post_init = post_init  # type: ignore[method-assign]


# ----------------------------------------------------------------------------------------
# silu on every model tester
# ----------------------------------------------------------------------------------------


def _force_act(tester_cls: type, act: str) -> None:
    if tester_cls.__dict__.get("_veomni_act") == act:
        return
    original = tester_cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if getattr(self, "hidden_act", None) is not None:
            self.hidden_act = act

    tester_cls.__init__ = __init__  # type: ignore[method-assign]
    tester_cls._veomni_act = act  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------
# pytest hooks
# ----------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    _STATE["compat"] = _install_compat_names()
    log = os.environ.get("VEOMNI_HF_BIND_LOG")
    if log:
        _STATE["log"] = open(log, "a")  # noqa: SIM115  # closed in pytest_unconfigure
    if _bind_mode():
        _install_binding()


def pytest_report_header(config: pytest.Config) -> list[str]:
    import transformers
    import veomni_ops

    lines = [f"veomni_bind_plugin: mode={'bound (veomni_ops.apply(model, {}, device=cpu))' if _bind_mode() else 'plain'}"
             f", hidden_act={_act() or 'as the testers set it'}, transformers {transformers.__version__}",
             f"veomni_bind_plugin: veomni_ops from {os.path.dirname(veomni_ops.__file__)}"
             f" {os.environ.get('VEOMNI_HF_REF', '(as installed)')}"
             + (f", apply inside torch.device({os.environ['VEOMNI_HF_APPLY_CTX']!r})"
                if os.environ.get("VEOMNI_HF_APPLY_CTX") else "")]
    if _STATE.get("compat"):
        lines.append(f"veomni_bind_plugin: testing_utils names supplied from the test ref: {', '.join(_STATE['compat'])}")
    return lines


def pytest_collection_finish(session: pytest.Session) -> None:
    act = _act()
    if act is None:
        return
    for item in session.items:
        tester = getattr(getattr(item, "cls", None), "model_tester_class", None)
        if isinstance(tester, type):
            _force_act(tester, act)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _STATE["test"] = item.nodeid


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _bind_mode():
        terminalreporter.write_line(
            f"veomni_bind_plugin: {_STATE['bound']} model(s) bound, {_STATE['refused']} refused by apply")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _STATE["log"] is not None:
        _STATE["log"].close()
        _STATE["log"] = None

"""Where ``residual_rms_norm`` lives in a model: a pre-norm decoder layer (``input_layernorm``,
``self_attn``, ``post_attention_layernorm``, ``mlp``) whose forward is transformers' plain pattern::

    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(...)
    hidden_states = residual + hidden_states          # } one kernel:
    residual = hidden_states                          # } hidden_states, residual =
    hidden_states = self.post_attention_layernorm(hidden_states)  # } kernel(h, residual, w, eps)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states

The forward is matched by its syntax tree (docstring and comments aside), with the attention
call's arguments abstracted: their names differ between transformers releases (``cache``,
``past_key_values``). Both norms must be RMSNorms the ``rms_norm`` op recognises, in its
``standard`` form (``w * x̂``). The bound forward is the library's own, recompiled with those
three statements replaced by the kernel call; everything else, the decorators and the
``input_layernorm`` module call (bound by ``rms_norm``) included, is unchanged.

The rule with ``rms_norm``: where this op binds a layer with a kernel, it takes over that
layer's ``post_attention_layernorm``: its weight and eps go to the fused kernel, the layer no
longer calls the module, and ``rms_norm`` does not bind it (the binding lists it as skipped,
saying which layer's kernel computes it; ``Edits.taken``). Where the plan's kernel is
``eager``, the layer is left as it is: the model's own add and norm are what the eager kernel
computes, bit for bit, and the ``post_attention_layernorm`` module stays ``rms_norm``'s. The
rule does not depend on the order of the ops: a layer's places are bound before its children's.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
import types
from collections.abc import Callable

from torch import nn

from ...binding.functions import copy_with_globals, library_method
from ...binding.place import Binder, Edits, NotBindable, Place, Survey
from ...registry import REFERENCE
from ..rms_norm.binder import find_rms_norm

_PATTERN = """
def forward(self, hidden_states):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn()
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states
"""
#: Where the fused statements are in the pattern's body: [first, end).
_FUSED = (3, 6)
#: What replaces them; the kernel and eps are globals of the bound forward's copy.
_KERNEL, _EPS = "_veomni_ops_residual_rms_norm", "_veomni_ops_residual_rms_norm_eps"
_CALL = f"hidden_states, residual = {_KERNEL}(hidden_states, residual, self.post_attention_layernorm.weight, {_EPS})"


class _AttentionArgs(ast.NodeTransformer):
    """Drops the arguments of ``self.self_attn(...)``: the one call whose names vary by release."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "self_attn" and isinstance(f.value, ast.Name) \
                and f.value.id == "self":
            return ast.Call(func=f, args=[], keywords=[])
        return self.generic_visit(node)


def _body(fn_def: ast.FunctionDef) -> list[ast.stmt]:
    """The statements of a function, its docstring aside."""
    body = fn_def.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _normal(stmts: list[ast.stmt]) -> list[str]:
    return [ast.dump(_AttentionArgs().visit(copy.deepcopy(s))) for s in stmts]


_WANTED = _normal(_body(ast.parse(_PATTERN).body[0]))  # type: ignore[arg-type]


@functools.cache
def _parse(fn: Callable) -> tuple[ast.Module, ast.FunctionDef] | str:
    """The module holding ``fn``'s source and its definition, or why they cannot be read."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        return f"its forward's source cannot be read ({type(e).__name__})"
    tree = ast.parse(src)
    d = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(d, ast.FunctionDef):
        return "its forward is not a plain function"
    return tree, d


@functools.cache
def _mismatch(fn: Callable) -> str | None:
    """Why ``fn`` (an innermost forward) is not the pattern (``None``: it is)."""
    parsed = _parse(fn)
    if isinstance(parsed, str):
        return parsed
    if fn.__code__.co_freevars:
        return "its forward is a closure"
    got = _normal(_body(parsed[1]))
    if got == _WANTED:
        return None
    at = next((i for i, (a, b) in enumerate(zip(got, _WANTED)) if a != b), min(len(got), len(_WANTED)))
    stmts = _body(parsed[1])
    what = ast.unparse(stmts[at]).splitlines()[0] if at < len(stmts) else "(its end)"
    return (f"its forward is not the pre-norm residual pattern (statement {at + 1}: {what!r}); the fused kernel "
            "would skip or reorder what it computes")


@functools.cache
def _fused_code(fn: Callable) -> types.CodeType:
    """``fn``'s code with the residual add and the norm after it replaced by the kernel call."""
    parsed = _parse(fn)
    assert not isinstance(parsed, str)
    tree = copy.deepcopy(parsed[0])  # the cached tree stays the library's
    d = tree.body[0]
    assert isinstance(d, ast.FunctionDef)
    skip = len(d.body) - len(_body(d))
    first, end = (skip + i for i in _FUSED)
    d.body[first:end] = ast.parse(_CALL).body
    d.decorator_list = []  # the decorators' own code stays the library's (copy_with_globals keeps it)
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    module = compile(tree, fn.__code__.co_filename, "exec")
    return next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == fn.__name__)


def _norm_problem(path: str, layer: nn.Module, name: str, survey: Survey) -> tuple[str | None, float]:
    """Why the layer's norm ``name`` cannot go into the kernel (``None``: it can), and its eps."""
    m = getattr(layer, name, None)
    if not isinstance(m, nn.Module):
        return f"it has no {name} module", 0.0
    try:
        found = find_rms_norm(f"{path}.{name}", m, survey)
    except NotBindable:
        found = []
    if not found:
        return f"{name} is a {type(m).__name__}, not an RMSNorm the rms_norm op recognises", 0.0
    if found[0].variant != "standard":
        return f"{name} is an {found[0].variant} RMSNorm; the fused kernel computes the standard w * x̂", 0.0
    return None, found[0].info["eps"]


def _find(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    if not all(isinstance(getattr(m, n, None), nn.Module) for n in ("input_layernorm", "post_attention_layernorm")):
        return []

    def left(why: str) -> list[Place]:
        return [Place("residual_rms_norm", "standard", path, m, left=f"{type(m).__name__}: {why}")]

    missing = [n for n in ("self_attn", "mlp") if not isinstance(getattr(m, n, None), nn.Module)]
    if missing:
        return left(f"it has no {' or '.join(missing)} module")
    eps = 0.0
    for name in ("input_layernorm", "post_attention_layernorm"):
        problem, eps = _norm_problem(path, m, name, survey)
        if problem:
            return left(problem)
    try:
        fn = inspect.unwrap(library_method(type(m), "forward"))
    except (AttributeError, ValueError):
        return left("its forward is not a Python function")
    why = _mismatch(fn) if isinstance(fn, types.FunctionType) else "its forward is not a Python function"
    if why:
        return left(why)
    return [Place("residual_rms_norm", "standard", path, m, {"eps": eps})]


def _bind(place: Place, kernel: Callable, edits: Edits) -> None:
    if place.info["kernel_name"] == REFERENCE:
        return  # eager: the model's own add and norm (see the module docstring)
    original = library_method(type(place.module), "forward")
    code = _fused_code(inspect.unwrap(original))
    overrides = edits.shared(("residual_rms_norm", id(kernel), place.info["eps"]),
                             lambda: {_KERNEL: kernel, _EPS: place.info["eps"]})
    edits.forwards.append((place.module, copy_with_globals(original, overrides, edits.memo, code=code)))
    norm = place.module.post_attention_layernorm
    edits.taken[id(norm)] = (f"computed by residual_rms_norm's {place.info['kernel_name']} kernel in "
                             f"{place.path or '<model>'}, which no longer calls this module")


BINDER = Binder("residual_rms_norm", _find, _bind)

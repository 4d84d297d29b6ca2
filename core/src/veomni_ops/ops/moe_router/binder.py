"""Where ``moe_router`` lives in a model: a top-k softmax router module (transformers v5's
``Qwen3MoeTopKRouter`` and the routers written the same way), whose forward is the contract's
code, checked by its syntax tree; the projection stays ``F.linear``, the rest is the kernel.

A module shaped like a router (a ``[E, H]`` ``weight`` Parameter, ``top_k`` and ``num_experts``)
whose attributes or code differ (a bias, Mixtral's router, which keeps float32 weights and always
renormalises, a subclass with its own forward) is a place left to the model's own code, with why."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...binding.functions import function_globals
from ...binding.place import Binder, Edits, Place, Survey

#: The forward a router must have, as transformers v5 writes it (qwen3_moe, qwen2_moe, olmoe,
#: qwen3_next), or as VeOmni's generated modeling writes it (below): compared by syntax tree, so
#: comments, spacing and local names do not matter.
CONTRACT_FORWARD = """
def forward(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
    if self.norm_topk_prob:
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    router_top_value = router_top_value.to(router_logits.dtype)
    router_scores = router_top_value
    return router_logits, router_scores, router_indices
"""


class _Locals(ast.NodeTransformer):
    """Renames the function's arguments and locals to ``v0, v1, ...`` in order of appearance."""

    def __init__(self, names: set[str]):
        self.names = names
        self.seen: dict[str, str] = {}

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            node.id = self.seen.setdefault(node.id, f"v{len(self.seen)}")
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.seen.setdefault(node.arg, f"v{len(self.seen)}")
        node.annotation = None
        return node


def _shape(source: str) -> str | None:
    """The function's syntax tree without its name, docstring, annotations and local names."""
    try:
        fn = ast.parse(textwrap.dedent(source)).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(fn, ast.FunctionDef):
        return None
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(
        getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    assigned = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    fn.name, fn.body, fn.decorator_list, fn.returns = "f", body, [], None
    return ast.dump(_Locals(assigned | {a.arg for a in fn.args.args}).visit(fn))


#: VeOmni's generated router (``veomni.models.transformers.qwen3_moe``'s patched modeling): the same
#: computation, written with ``torch.nn.functional.linear`` and without the ``router_scores`` alias.
VEOMNI_FORWARD = """
def forward(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)
    routing_weights = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
    router_top_value, router_indices = torch.topk(routing_weights, self.top_k, dim=-1)
    if self.norm_topk_prob:
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    router_top_value = router_top_value.to(router_logits.dtype)
    return router_logits, router_top_value, router_indices
"""

#: transformers' form (which names ``F``) and VeOmni's (which spells torch.nn.functional out).
_TRANSFORMERS, _VEOMNI = _shape(CONTRACT_FORWARD), _shape(VEOMNI_FORWARD)


def code_problem(forward: Callable) -> str | None:
    """Why ``forward`` is not the contract's router code (``None``: it is)."""
    name = getattr(forward, "__qualname__", repr(forward))
    try:
        source = inspect.getsource(inspect.unwrap(forward))
    except (OSError, TypeError):
        return f"the source of its forward ({name}) is not available to check against the contract's router code"
    shape = _shape(source)
    if shape not in (_TRANSFORMERS, _VEOMNI):
        return (f"its forward ({name}) is not the contract's router code (softmax in float32, topk, renormalised "
                "when norm_topk_prob, cast to the logits' dtype), so a router kernel would change what it computes")
    globs = function_globals(forward)
    if globs.get("torch") is not torch or (shape == _TRANSFORMERS and globs.get("F") is not F):
        return f"its forward ({name}) names F and torch that are not torch.nn.functional and torch"
    return None


def _attributes_problem(m: nn.Module, weight: torch.Tensor) -> str | None:
    e, h = weight.shape
    top_k, hidden, norm = getattr(m, "top_k", None), getattr(m, "hidden_dim", None), getattr(m, "norm_topk_prob", None)
    if getattr(m, "bias", None) is not None:
        return "it has a bias, which the contract's router (F.linear without bias) does not add"
    if not isinstance(norm, bool):
        return f"its norm_topk_prob is {norm!r}, not a bool (the router renormalises when it is set)"
    if m.num_experts != e or not (isinstance(hidden, int) and hidden == h):
        return f"its weight {tuple(weight.shape)} is not [num_experts={m.num_experts}, hidden_dim={hidden!r}]"
    if not (isinstance(top_k, int) and not isinstance(top_k, bool) and 1 <= top_k <= e):
        return f"its top_k {top_k!r} is not an int in [1, num_experts={e}]"
    return None


def _find_router(path: str, m: nn.Module, survey: Survey) -> list[Place]:
    weight = getattr(m, "weight", None)
    if not (isinstance(weight, nn.Parameter) and weight.dim() == 2 and hasattr(m, "top_k")
            and isinstance(getattr(m, "num_experts", None), int)):
        return []
    why = _attributes_problem(m, weight) or code_problem(type(m).forward)
    return [Place("moe_router", "standard", path, m, left=why)]


def _bind_router(place: Place, kernel: Callable, edits: Edits) -> None:
    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
        weights, indices = kernel(router_logits, self.top_k, self.norm_topk_prob)
        return router_logits, weights, indices

    edits.forwards.append((place.module, forward))


BINDER = Binder("moe_router", _find_router, _bind_router)

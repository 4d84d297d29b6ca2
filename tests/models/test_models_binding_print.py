"""``print(binding)``: a readable table of what ``apply`` bound, and of what it left alone."""

from __future__ import annotations

import transformers as T
import veomni_ops
from models_support import build


class OwnLossQwen3(T.Qwen3ForCausalLM):
    """A user's causal LM with its own forward: the loss place is left to it."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


def test_print_binding_is_a_table(registry, capsys):
    base = build("qwen3")
    model = OwnLossQwen3(base.config)
    binding = veomni_ops.apply(model, {}, registry=registry, device="cpu")
    print(binding)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (f"Binding for cpu, mode eager: {len(binding.bound)} place(s) bound, "
                        "1 left to the model's own code")
    assert lines[1].split() == ["path", "op", "variant", "kernel"]
    rows = {tuple(line.split()[:4]) for line in lines[3:]}
    for path, op, variant, kernel in binding.bound:
        assert (path or "<model>", op, variant, kernel) in rows
    e = binding.plan.get("rms_norm", "standard")
    assert any(line.split()[:5] == ["model.layers.0.input_layernorm", "rms_norm", "standard", e.kernel,
                                    f"({e.distribution})"] for line in lines)
    i = lines.index("left to the model's own code:")
    assert lines[i + 1].split() == ["path", "op", "why"]
    assert lines[i + 3].split()[:2] == ["<model>", "cross_entropy"]
    assert lines[i + 3].endswith(f"user code: {__name__}.OwnLossQwen3.forward")
    assert str(binding) == binding.table() == out.rstrip("\n")
    assert binding.summary()["rms_norm"] == sum(1 for b in binding.bound if b[1] == "rms_norm")

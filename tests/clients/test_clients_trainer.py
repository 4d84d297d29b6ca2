"""transformers' ``Trainer``: ``train()``, ``evaluate()`` with ``compute_metrics`` on the
logits, and a checkpoint resumed, on a bound model against the unbound one.

The Trainer reads the model's ``forward`` signature (the columns it keeps, whether the model
takes ``num_items_in_batch``), trains with labels (the bound head's fused loss), evaluates
under ``no_grad`` in eval mode (the logits, which ``compute_metrics`` needs), saves with
``save_pretrained`` and reloads the weights to resume.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch
import transformers as T
from clients_support import (
    BF16_LOSS,
    FP32_GRAD_LATER,
    FP32_LOSS,
    MODELS,
    Rows,
    assert_binds_the_head,
    assert_grads_close,
    assert_losses_close,
    batches,
    bound_pair,
    describe,
    grad_recorder,
    model_kwargs,
    modules_with_instance_forward,
)
from models_support import build

STEPS = 6


class OutputSpy:
    """Per call of the model: (training, grad enabled, logits is None)."""

    def __init__(self, model):
        self.calls: list[tuple[bool, bool, bool]] = []
        model.register_forward_hook(self.hook)

    def hook(self, module, args, out):
        self.calls.append((module.training, torch.is_grad_enabled(), getattr(out, "logits", None) is None))


class Metrics:
    """Token accuracy from the logits; records the structure of what the Trainer gathered."""

    def __init__(self):
        self.structures: list[object] = []

    def preprocess(self, logits, labels):
        self.structures.append(describe(logits))
        if isinstance(logits, tuple):  # MoE with router logits: (aux_loss, logits, router_logits)
            logits = next(x for x in logits if isinstance(x, torch.Tensor) and x.dim() == 3)
        return logits.argmax(-1)

    def __call__(self, pred):
        preds, labels = pred.predictions[:, :-1], pred.label_ids[:, 1:]
        keep = labels != -100
        return {"accuracy": float((preds[keep] == labels[keep]).mean())}


def _trainer(model, out_dir, *, steps=STEPS, bf16=False, save_steps=None, callbacks=()):
    args = T.TrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=2, per_device_eval_batch_size=4, max_steps=steps,
        learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True, bf16=bf16,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
    )
    metrics = Metrics()
    trainer = T.Trainer(model=model, args=args, train_dataset=Rows(16, seed=0), eval_dataset=Rows(8, seed=1),
                        compute_metrics=metrics, preprocess_logits_for_metrics=metrics.preprocess,
                        callbacks=list(callbacks))
    return trainer, metrics


def _losses(trainer, after_step=0) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h and h["step"] > after_step]


def _grad_norms(trainer) -> list[float]:
    return [h["grad_norm"] for h in trainer.state.log_history if "loss" in h]


def _train_and_evaluate(model, out_dir, bf16=False):
    rec = grad_recorder()
    spy = OutputSpy(model)
    trainer, metrics = _trainer(model, out_dir, bf16=bf16, callbacks=[rec])
    trainer.train()
    ev = trainer.evaluate()
    return trainer, rec, spy, metrics, ev


@pytest.mark.parametrize("name", MODELS)
def test_trainer_keeps_the_same_columns_for_the_bound_model(name, tmp_path):
    """The Trainer keeps the dataset columns that ``inspect.signature(model.forward)`` names
    and drops the rest: a bound forward must show the signature it replaced, or the batches
    lose ``input_ids``."""
    unbound, bound, _ = bound_pair(name)
    assert inspect.signature(bound.forward) == inspect.signature(unbound.forward), (
        f"bound forward{inspect.signature(bound.forward)} is not the unbound forward{inspect.signature(unbound.forward)}")
    keys = []
    for m, d in ((unbound, "unbound"), (bound, "bound")):
        trainer, _ = _trainer(m, tmp_path / d)
        keys.append(sorted(next(iter(trainer.get_train_dataloader()))))
        keys.append(sorted(next(iter(trainer.get_eval_dataloader()))))
    assert keys[2:] == keys[:2] == [["attention_mask", "input_ids", "labels"]] * 2, (
        f"batch keys the Trainer built (train, eval): bound {keys[2:]}, unbound {keys[:2]}")


@pytest.mark.parametrize("name", MODELS)
def test_trainer_train_and_evaluate_match_unbound(name, tmp_path):
    unbound, bound, _ = bound_pair(name)
    tu, ru, spy_u, mu, ev_u = _train_and_evaluate(unbound, tmp_path / "unbound")
    tb, rb, spy_b, mb, ev_b = _train_and_evaluate(bound, tmp_path / "bound")

    assert_losses_close(_losses(tu), _losses(tb), FP32_LOSS, f"Trainer.train() of {name}")
    assert len(_losses(tb)) == STEPS, f"Trainer logged {len(_losses(tb))} losses for {STEPS} steps"
    assert_losses_close(_grad_norms(tu), _grad_norms(tb), FP32_GRAD_LATER, f"Trainer's logged grad_norm of {name}")
    assert len(rb.grads) == len(ru.grads) == STEPS
    for i, (gu, gb) in enumerate(zip(ru.grads, rb.grads)):
        assert_grads_close(gu, gb, f"Trainer.train() of {name}, step {i + 1}", step=i)

    # The bound head took the fused loss while training, and gave logits for evaluation.
    train_calls = [c for c in spy_b.calls if c[0]]
    eval_calls = [c for c in spy_b.calls if not c[0]]
    assert train_calls and all(c == (True, True, True) for c in train_calls), (
        f"training calls of the bound {name} (training, grad enabled, logits is None): {train_calls}; "
        "the fused loss (no logits) should run in every training step")
    assert eval_calls and all(c == (False, False, False) for c in eval_calls), (
        f"evaluation calls of the bound {name} (training, grad enabled, logits is None): {eval_calls}; "
        "evaluation needs the logits, as the unbound model returns them")
    assert all(not c[2] for c in spy_u.calls if not c[0])

    assert mb.structures == mu.structures, (
        f"what Trainer.evaluate() gathered from the model differs:\n bound   {mb.structures}\n unbound {mu.structures}")
    assert set(ev_b) == set(ev_u), f"evaluate() metrics: bound {sorted(ev_b)}, unbound {sorted(ev_u)}"
    assert_losses_close([ev_u["eval_loss"]], [ev_b["eval_loss"]], FP32_LOSS, f"Trainer.evaluate() eval_loss of {name}")
    assert ev_b["eval_accuracy"] == ev_u["eval_accuracy"], (
        f"compute_metrics token accuracy: bound {ev_b['eval_accuracy']}, unbound {ev_u['eval_accuracy']}")


@pytest.mark.parametrize("name", MODELS)
def test_trainer_bf16_autocast_matches_unbound(name, tmp_path):
    """``bf16=True``: accelerate runs the forward under CPU autocast (bfloat16)."""
    unbound, bound, _ = bound_pair(name)
    tu, ru, _, mu, ev_u = _train_and_evaluate(unbound, tmp_path / "unbound", bf16=True)
    tb, rb, _, mb, ev_b = _train_and_evaluate(bound, tmp_path / "bound", bf16=True)
    assert_losses_close(_losses(tu), _losses(tb), BF16_LOSS, f"Trainer.train(), bf16, of {name}")
    assert len(_losses(tb)) == STEPS
    for i, (gu, gb) in enumerate(zip(ru.grads, rb.grads)):
        assert_grads_close(gu, gb, f"Trainer.train(), bf16, of {name}, step {i + 1}", step=i, bf16=True)
    assert mb.structures == mu.structures
    assert_losses_close([ev_u["eval_loss"]], [ev_b["eval_loss"]], BF16_LOSS, f"evaluate() eval_loss, bf16, {name}")


@pytest.mark.parametrize("name", MODELS)
def test_trainer_resume_from_checkpoint_matches_uninterrupted(name, tmp_path):
    """Save every 3 steps; a fresh bound model resumed from checkpoint-3 logs the losses the
    uninterrupted run logged for steps 4-6."""
    _, full, _ = bound_pair(name)
    t_full, _ = _trainer(full, tmp_path / "run", save_steps=3)
    t_full.train()
    ckpt = tmp_path / "run" / "checkpoint-3"
    assert (ckpt / "config.json").is_file(), f"no checkpoint written: {sorted(p.name for p in ckpt.parent.iterdir())}"

    fresh = build(name, **model_kwargs(name))
    import veomni_ops

    assert_binds_the_head(name, veomni_ops.apply(fresh, {}, device="cpu"))
    t_res, _ = _trainer(fresh, tmp_path / "resumed", save_steps=3)
    t_res.train(resume_from_checkpoint=str(ckpt))
    assert_losses_close(_losses(t_full, after_step=3), _losses(t_res, after_step=3), FP32_LOSS,
                        f"{name} resumed from checkpoint-3 vs uninterrupted, steps 4-{STEPS}")
    assert len(_losses(t_res, after_step=3)) == STEPS - 3
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == full.config.model_type


@pytest.mark.parametrize("name", MODELS)
def test_save_pretrained_of_a_bound_model_writes_what_the_unbound_model_writes(name, tmp_path):
    """Trainer's checkpoints (and users) call ``save_pretrained``: the same config.json and
    weights as the unbound model; ``from_pretrained`` of them is transformers' own model
    (nothing bound) and gives the unbound model's outputs."""
    from safetensors.torch import load_file

    unbound, bound, _ = bound_pair(name)
    unbound.save_pretrained(tmp_path / "unbound")
    bound.save_pretrained(tmp_path / "bound")
    cu, cb = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("unbound", "bound"))
    diff = {k: (cb.get(k), cu.get(k)) for k in cu.keys() | cb.keys() if cb.get(k) != cu.get(k)}
    assert not diff, f"config.json of the bound {name} differs from the unbound one's (bound, unbound): {diff}"
    wu, wb = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("unbound", "bound"))
    assert wb.keys() == wu.keys(), f"saved tensors differ: {sorted(wb.keys() ^ wu.keys())}"
    assert all(torch.equal(wb[k], wu[k]) for k in wu), "saved weights differ"

    loaded = type(unbound).from_pretrained(str(tmp_path / "bound"))
    assert modules_with_instance_forward(loaded) == [], "from_pretrained of a bound model's checkpoint is bound"
    b = batches(1, seed=5)[0]
    loaded.eval(), unbound.eval()
    with torch.no_grad():
        ol, ou = loaded(**b), unbound(**b)
    torch.testing.assert_close(ol.logits, ou.logits, rtol=0, atol=0,
                               msg=lambda m: f"the model loaded from the bound {name}'s checkpoint: {m}")

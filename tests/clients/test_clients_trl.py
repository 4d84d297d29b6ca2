"""TRL's ``SFTTrainer`` with ``padding_free=True``: each batch's examples packed into one row
without padding, their boundaries given by ``position_ids`` restarting at 0 (no attention
mask), on a bound model against the unbound one.

TRL's collator flattens the batch; the unbound model (sdpa) finds the packed sequences from
``position_ids`` and masks attention across them (transformers' masking utilities); the bound
model must do the same through veomni-ops' attention. TRL's defaults are kept where a user
gets them: its loss (``loss_type="nll"``: TRL adds a fused LM head to the model, which takes
the decoder's hidden states and returns per-token log-probabilities, so the bound loss head is
bypassed; the decoder, attention included, is ours), gradient checkpointing on, and
``bf16=True`` (CPU autocast). Compared: the batch TRL builds (one packed row, ``position_ids``
restarting per example), 6 steps of logged losses and grad norms, and every gradient before
each optimizer step, at the tolerances of ``clients_support.py``: in float32 the first step's
gradients elementwise within 1e-4 of each tensor's largest entry, later steps 1e-3 per
parameter in norm, losses 1e-4 relative (measured: bitwise equal); under bf16 autocast losses
2e-2, the gradient as one vector 5e-2 in norm. Attention leaking across the packed examples
moves the first step's float32 gradients by about 1 (relative), far beyond either.

The release: ``constraints.txt``'s trl (1.16.0) in the ``clients`` session's oldest run (with
transformers 5.17.0), the newest release in its newest run. trl 1.13.0 read ``outputs.logits``
in training (for its metrics) under ``loss_type="nll"``, which the bound head's fused loss does
not return (``logits is None``): the bound model failed there with a ``TypeError``.
"""

from __future__ import annotations

import datasets
import pytest
import torch
import transformers as T
import trl
from clients_support import (
    BF16_LOSS,
    FP32_GRAD_LATER,
    FP32_LOSS,
    MODELS,
    assert_grads_close,
    assert_losses_close,
    bound_pair,
    grad_recorder,
)
from models_support import VOCAB

STEPS = 6
BATCH = 3


def tokenizer() -> T.PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny models' vocabulary (no download): SFTTrainer wants a
    processing class with a pad token, and the data below is token ids already."""
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<pad>": VOCAB - 2, "<eos>": VOCAB - 1}
    return T.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                     pad_token="<pad>", eos_token="<eos>")


def examples(n: int, seed: int) -> datasets.Dataset:
    """``n`` token-id examples of lengths 5 to 17 (so a packed row holds sequences of several lengths)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 18, (n,), generator=g).tolist()
    return datasets.Dataset.from_dict({"input_ids": [torch.randint(0, VOCAB - 2, (k,), generator=g).tolist()
                                                     for k in lengths]})


def sft(model, out_dir, *, bf16: bool, callbacks=()):
    args = trl.SFTConfig(
        output_dir=str(out_dir), per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=1e-3,
        logging_steps=1, report_to=[], use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
        disable_tqdm=True, save_strategy="no", padding_free=True, packing=False, max_length=None, bf16=bf16,
    )
    return trl.SFTTrainer(model=model, args=args, train_dataset=examples(BATCH * STEPS, seed=0),
                          processing_class=tokenizer(), callbacks=list(callbacks))


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("name", MODELS)
def test_sft_trainer_padding_free_matches_unbound(name, bf16, tmp_path):
    unbound, bound, _ = bound_pair(name)
    runs = []
    for model, where in ((unbound, "unbound"), (bound, "bound")):
        rec = grad_recorder()
        trainer = sft(model, tmp_path / where, bf16=bf16, callbacks=[rec])
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.train()
        logged = [h for h in trainer.state.log_history if "loss" in h]
        runs.append((batch, [h["loss"] for h in logged], [h["grad_norm"] for h in logged], rec.grads))
    (bu, lu, nu, gu), (bb, lb, nb, gb) = runs
    what = f"SFTTrainer(padding_free=True{', bf16=True' if bf16 else ''}).train() of {name}"

    # What TRL built: one packed row per batch, no padding and no mask, position_ids restarting per example.
    assert sorted(bb) == sorted(bu) and "attention_mask" not in bb, sorted(bb)
    assert bb["input_ids"].shape[0] == 1 and torch.equal(bb["input_ids"], bu["input_ids"])
    starts = (bb["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert len(starts) == BATCH and starts[0] == 0, bb["position_ids"]

    assert len(lb) == len(lu) == STEPS and len(gb) == len(gu) == STEPS
    assert_losses_close(lu, lb, BF16_LOSS if bf16 else FP32_LOSS, what)
    if not bf16:
        assert_losses_close(nu, nb, FP32_GRAD_LATER, f"logged grad_norm of {what}")
    for i, (u, b) in enumerate(zip(gu, gb)):
        assert_grads_close(u, b, f"{what}, step {i + 1}", step=i, bf16=bf16)

"""Packed documents in the train job (issue 35; :mod:`veomni_ops.train.data`).

A packed batch is the same training signal as its documents trained one by one: each document
its own row, unpacked, every predicted token weighted the same (the loss is the mean over every
counted token of the batch). That is checked in float32 for the loss and every gradient, with
the kernels the job binds for attention (``eager``, ``sdpa``) and the job's own call
(:func:`veomni_ops.train.loop.step_inputs`); then under ``parallel: {sp: 2}`` and ``{dp_shard:
2}`` (2 gloo processes, marked ``parallel``) against the one-process packed run. And the batches
themselves: restarting positions, -100 on each document's first token, deterministic from the
seed and the step (resume), and without ``data:`` bitwise the rows of every job before it.

``flex_attention`` is not among the kernels compared: the resolver refuses it on the CPU (it
needs a CUDA device) and PyTorch's FlexAttention has no backward on the CPU
(:func:`test_flex_attention_cannot_train_on_the_cpu`, which fails the day either changes).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
yaml = pytest.importorskip("yaml")

from veomni_ops import apply  # noqa: E402
from veomni_ops.resolve import ResolutionError  # noqa: E402
from veomni_ops.train import build_model, load_job, synthetic_batches, train_one  # noqa: E402
from veomni_ops.train.data import IGNORE_INDEX, doc_len, job_batches, packed_batch  # noqa: E402
from veomni_ops.train.loop import step_inputs  # noqa: E402

TRAIN = {"batch_size": 2, "seq_len": 64, "steps": 3, "lr": 1e-3, "dtype": "float32", "device": "cpu", "seed": 0,
         "threads": 1}
DATA = {"packing": True, "doc_len": {"mean": 12, "min": 2}}
#: float32, packed against one by one: the same tokens through the same weights, but each
#: matmul, softmax and loss sum taken over other shapes (rows of 64 against rows of a few
#: tokens; the masked keys of a packed row add exact zeros). Measured on this CPU (2 cores,
#: torch 2.13, the three steps of the job below, eager and sdpa alike): the loss differs by at
#: most 6.6e-8 relative, a parameter's gradient by at most 9.7e-7 of its largest element. 1e-5
#: leaves room for other CPUs' summation orders and fails on any real leak: positions that do
#: not restart (attention across boundaries) move the loss by 8e-4..4.5e-3 relative and the
#: gradients by more than their size; labels that predict each document's first token from the
#: previous document move the loss by 2e-4..8e-4.
LOSS_TOL = 1e-5
GRAD_TOL = 1e-5


def job_dict(tmp_path: Path, data: dict | None = DATA, name: str = "job", **train) -> dict:
    body = {"model": {"architecture": "qwen3", "size": "tiny"}, "train": {**TRAIN, **train}}
    if data is not None:
        body["data"] = data
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return load_job(str(path))


# ----------------------------------------------------------------------------------------
# the batches
# ----------------------------------------------------------------------------------------


def test_without_data_the_batches_are_bitwise_those_of_before(tmp_path):
    for data in (None, {"packing": False}):
        job = job_dict(tmp_path, data)
        got = list(job_batches(job, 2048, "cpu"))
        want = list(synthetic_batches(2048, 2, 64, 3, 0, "cpu"))
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert set(g) == {"input_ids", "labels"}
            assert torch.equal(g["input_ids"], w) and g["labels"] is g["input_ids"]
            # the job's call: what the loop always gave the model
            assert set(step_inputs(g)) == {"input_ids", "labels", "use_cache"}


def test_packed_rows_restart_positions_and_predict_no_token_across_a_boundary(tmp_path):
    job = job_dict(tmp_path)
    batches = list(job_batches(job, 2048, "cpu"))
    for b in batches:
        ids, labels, pos = b["input_ids"], b["labels"], b["position_ids"]
        assert ids.shape == labels.shape == pos.shape == (2, 64)
        starts = pos == 0
        assert starts[:, 0].all()  # every row starts a document (or a split one's rest)
        # positions count up by one inside a document, and restart at 0 at the next
        assert ((pos[:, 1:] == pos[:, :-1] + 1) | starts[:, 1:]).all()
        assert torch.equal(labels == IGNORE_INDEX, starts)  # each document's first token, and only it
        assert torch.equal(labels[~starts], ids[~starts])
        assert b["documents"] == starts.sum(dim=1).tolist() and min(b["documents"]) >= 2
        lengths = torch.diff(torch.nonzero(torch.cat([starts, torch.ones(2, 1, dtype=torch.bool)], 1)
                                           .flatten()).flatten())
        assert int(lengths.max()) <= 64
    # the job's call in one process: the packed inputs as they are, no mask
    call = step_inputs(batches[0])
    assert set(call) == {"input_ids", "labels", "position_ids", "use_cache"} and "attention_mask" not in call
    # each step its own documents, a function of the seed and the step alone: a resumed run's are those of the
    # run never stopped, and another seed gives others
    again = list(job_batches(job, 2048, "cpu", start=2))
    assert len(again) == 1 and all(torch.equal(again[0][k], batches[2][k]) for k in ("input_ids", "labels",
                                                                                        "position_ids"))
    assert not torch.equal(batches[0]["position_ids"], batches[1]["position_ids"])
    other = list(job_batches(job_dict(tmp_path, seed=1, name="seed1"), 2048, "cpu"))
    assert not torch.equal(other[0]["input_ids"], batches[0]["input_ids"])


def test_document_lengths_follow_the_skewed_distribution_within_min_and_max():
    lengths = doc_len({"doc_len": {"mean": 40, "min": 8, "max": 200}}, 256)
    got = [packed_batch(4096, 8, 256, 3, step, lengths) for step in range(20)]
    pieces = []
    for b in got:
        starts = (b["position_ids"] == 0).flatten().tolist() + [True]
        at = [i for i, s in enumerate(starts) if s]
        pieces += [(b2 - a, a % 256 == 0 or b2 % 256 == 0) for a, b2 in zip(at, at[1:])]
    whole = [n for n, at_edge in pieces if not at_edge]  # documents not split by a row's end
    assert min(whole) >= 8 and max(n for n, _ in pieces) <= 200
    mean = sum(whole) / len(whole)
    median = sorted(whole)[len(whole) // 2]
    assert 25 < mean < 50 and median < mean  # log-normal: skewed, a long tail above the median
    assert len(set(whole)) > 30


def test_defaults_follow_the_row():
    assert doc_len({"packing": True}, 2048) == {"mean": 512, "min": 16, "max": 2048, "sigma": 1.0}
    assert doc_len({"packing": True}, 8) == {"mean": 8, "min": 8, "max": 8, "sigma": 1.0}
    assert doc_len({"doc_len": {"max": 100}}, 1000) == {"mean": 100, "min": 16, "max": 100, "sigma": 1.0}
    assert doc_len({"doc_len": {"mean": 4.5, "max": 8}}, 64) == {"mean": 4.5, "min": 4, "max": 8, "sigma": 1.0}


# ----------------------------------------------------------------------------------------
# packed = the documents one by one
# ----------------------------------------------------------------------------------------


def _model(tmp_path, attn: str):
    job = job_dict(tmp_path, name=f"model-{attn}")
    model = build_model(job)
    binding = apply(model, {"attn_implementation": attn})
    assert binding.plan.get("attention", "standard").kernel == attn
    return job, model


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def one_by_one(model, batch) -> tuple[float, dict[str, torch.Tensor]]:
    """Each document of ``batch`` its own row (positions 0..L-1, no packing), its mean loss
    weighted by its share of the batch's predicted tokens: the packed batch's loss, token for
    token. Returns that loss and its gradients."""
    ids, starts = batch["input_ids"], batch["position_ids"] == 0
    counted = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    total = 0.0
    for r in range(ids.shape[0]):
        at = torch.nonzero(starts[r]).flatten().tolist() + [ids.shape[1]]
        for a, b in zip(at, at[1:]):
            if b - a < 2:
                continue  # a one-token piece (a split document's end) predicts nothing in either form
            doc = ids[r:r + 1, a:b]
            loss = model(input_ids=doc, labels=doc, use_cache=False).loss * ((b - a - 1) / counted)
            loss.backward()
            total += float(loss.detach())
    return total, _grads(model)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_packed_batch_trains_as_its_documents_one_by_one(tmp_path, attn):
    job, model = _model(tmp_path, attn)
    batch = next(job_batches(job, model.config.vocab_size, "cpu"))
    assert sum(batch["documents"]) >= 8  # several documents in each row, one split across the rows
    out = model(**step_inputs(batch))  # the job's call
    out.loss.backward()
    packed, packed_grads = float(out.loss.detach()), _grads(model)
    want, want_grads = one_by_one(model, batch)
    assert abs(packed - want) <= LOSS_TOL * abs(want), (packed, want)
    assert set(packed_grads) == set(want_grads) and len(want_grads) > 10
    for name, w in want_grads.items():
        scale = float(w.abs().max())
        err = float((packed_grads[name] - w).abs().max())
        assert scale > 0 and err <= GRAD_TOL * scale, f"{attn}: {name} differs by {err:.3g} (scale {scale:.3g})"
    # and the check has teeth: the same rows without their positions (one document a row) are another loss
    leak = model(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss.detach()
    assert abs(float(leak) - want) > 100 * LOSS_TOL * abs(want)
    across = model(**{**step_inputs(batch), "labels": batch["input_ids"]}).loss.detach()  # boundaries predicted
    assert abs(float(across) - want) > 10 * LOSS_TOL * abs(want)
    model.zero_grad(set_to_none=True)


def test_flex_attention_cannot_train_on_the_cpu(tmp_path):
    """Why the comparison above leaves flex_attention out (see the module's docstring)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    model = build_model(job_dict(tmp_path, name="flex"))
    with pytest.raises(ResolutionError, match="flex_attention.*needs a cuda device"):
        apply(model, {"attn_implementation": "flex_attention"})
    q = torch.randn(1, 2, 16, 16, requires_grad=True)
    mask = create_block_mask(lambda b, h, i, j: i >= j, 1, 1, 16, 16, device="cpu")
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q, block_mask=mask).sum().backward()


# ----------------------------------------------------------------------------------------
# the job
# ----------------------------------------------------------------------------------------


def test_a_packed_job_trains_and_says_its_packing(tmp_path):
    job = job_dict(tmp_path, steps=2)
    out = io.StringIO()
    result = train_one(job, out=out)
    text = out.getvalue()
    first = next(job_batches(job, 2048, "cpu"))
    per_row = sum(first["documents"]) / 2
    assert (f"data: packed documents, lengths log-normal (mean 12, sigma 1.0) clipped to [2, 64], laid into rows of "
            f"64 tokens (a document over a row's end is split; position_ids restart at each, its first token is not "
            f"predicted); step 1: {per_row:.1f} documents per row, mean length {64 / per_row:.1f} tokens") in text
    data = result["data"]
    assert data["packing"] is True and data["rows"] == 4 and data["doc_len"] == {"mean": 12, "min": 2, "max": 64,
                                                                                 "sigma": 1.0}
    assert data["documents_per_row"] == data["documents"] / 4 and data["mean_doc_len"] == 4 * 64 / data["documents"]
    assert f"data: {data['documents']} packed documents in 4 rows" in text
    assert len(result["losses"]) == 2 and all(x == x for x in result["losses"])
    # the same job unpacked trains other data: another loss, and no data report
    plain = train_one(job_dict(tmp_path, None, name="plain", steps=2), out=io.StringIO())
    assert "data" not in plain and plain["losses"][0] != result["losses"][0]
    # the comparison report says which run trained on packed documents
    from veomni_ops.train.report import print_report, report

    table = io.StringIO()
    print_report([result, plain], report([result, plain], [1], None), table)
    assert (f"  (job.yaml: packed documents, {data['documents_per_row']:.1f} per row, mean length "
            f"{data['mean_doc_len']:.1f} tokens)\n") in table.getvalue()
    assert "plain.yaml: packed" not in table.getvalue()


# ----------------------------------------------------------------------------------------
# 2 processes (gloo): sp 2 and dp_shard 2 against the one-process packed run
# ----------------------------------------------------------------------------------------


@pytest.mark.parallel
def test_packed_documents_under_sp2_and_dp_shard2_match_one_process(tmp_path):
    import test_parallel as P

    data = {"packing": True, "doc_len": {"mean": 6, "min": 2}}
    scenarios = [
        # an odd row: sp pads it; boundaries fall anywhere in the two slices
        P._scenario("packed_sp2", "qwen3", {"sp": 2}, seq=33, data=data, steps=2),
        P._scenario("packed_sp2_eager", "qwen3", {"sp": 2}, ops=P.EAGER_ATTN, seq=32, data=data, steps=2),
        P._scenario("packed_dp2", "qwen3", {"dp_shard": 2}, seq=32, data=data, steps=2),
    ]
    got = P.run_scenarios(2, scenarios, tmp_path)
    for sc in scenarios:
        P.assert_same_as_one_process(sc, got[sc["name"]])

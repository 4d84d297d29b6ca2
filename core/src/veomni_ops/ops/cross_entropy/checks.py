"""``cross_entropy``'s input checks (heavy: imports torch): the labels (:func:`check_labels`), the
label-range rule (:func:`check_label_values`), a chunked kernel's ``chunk_size`` and the ``fused_linear``
variant's inputs. Public for backend authors, who import them from :mod:`veomni_ops.kernels.checks` (or
bound to their backend, :class:`~veomni_ops.kernels.checks.BackendChecks`).
"""

from __future__ import annotations

from functools import partial

import torch

from ...kernels.tensor_checks import (
    TensorCheck,
    can_read_values,
    check_float,
    check_index_range,
    check_integer,
    check_ndim,
    check_same_device,
    check_same_dtype,
    where,
)

__all__ = ["check_chunk_size", "check_label_values", "check_labels", "check_linear_cross_entropy_inputs"]


def check_labels(
    labels: torch.Tensor,
    n: int,
    ignore_index: int,
    *,
    backend: str | None = None,
    integer_check: TensorCheck | None = None,
) -> None:
    """``cross_entropy`` labels: an integer tensor ``[N]`` with ``N = n`` tokens, and a Python int ``ignore_index``.

    Shapes only; the range of the values is :func:`check_label_values`.
    """
    op = "cross_entropy"
    if integer_check is None:
        integer_check = partial(check_integer, backend=backend)
    integer_check(labels, "labels", op)
    check_ndim(labels, 1, "labels", op, "[N] (flatten it and shift it first)", backend=backend)
    if labels.shape[0] != n:
        raise ValueError(
            f"{where(op, backend)}: labels has {labels.shape[0]} entries but there are {n} tokens; they must match"
        )
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"{where(op, backend)}: ignore_index must be a Python int, got {ignore_index!r}")


def check_label_values(
    labels: torch.Tensor,
    vocab_size: int,
    ignore_index: int,
    *,
    backend: str | None = None,
    always: bool = False,
    consequence: str = "the loss would index outside the logits",
) -> None:
    """Every label in ``[0, V)`` or equal to ``ignore_index``, else ``ValueError`` naming the op and the label.

    One reduction (``aminmax``) and one host synchronisation. Runs when ``always`` (a kernel
    that synchronises anyway) or when :func:`can_read_values` allows (CPU tensors;
    ``VEOMNI_OPS_CHECK_VALUES=1``); otherwise returns without reading anything.
    """
    if always or can_read_values(labels):
        check_index_range(labels, vocab_size, "labels", "cross_entropy", f"the vocabulary size V = {vocab_size}",
                          ignore=ignore_index, backend=backend, consequence=consequence)


def check_chunk_size(chunk_size: object, *, backend: str | None = None) -> None:
    """A chunked ``cross_entropy`` kernel's ``chunk_size`` (tokens per chunk): a positive int."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"{where('cross_entropy', backend)}: chunk_size must be a positive int, got {chunk_size!r}")


def check_linear_cross_entropy_inputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    *,
    backend: str | None = None,
    float_check: TensorCheck | None = None,
    integer_check: TensorCheck | None = None,
    always: bool = False,
    consequence: str = "the loss would index outside the logits",
) -> None:
    """Check the ``fused_linear`` variant of ``cross_entropy``: ``hidden [N, H]``, ``weight [V, H]``,
    ``bias [V]`` or ``None``, ``labels [N]`` (:func:`check_labels`), one dtype, one device, and the
    label values (:func:`check_label_values`, with ``always`` and ``consequence``)."""
    op = "cross_entropy"
    if float_check is None:
        float_check = partial(check_float, backend=backend)
    float_check(hidden, "hidden", op)
    float_check(weight, "weight", op)
    check_ndim(hidden, 2, "hidden", op, "[N, H] (flatten leading dimensions with .view(-1, H))", backend=backend)
    check_ndim(weight, 2, "weight", op, "[V, H] (the lm_head weight)", backend=backend)
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"{where(op, backend)}: weight {tuple(weight.shape)} must be [V, H] with H = hidden.shape[1] = "
            f"{hidden.shape[1]}"
        )
    if bias is not None:
        float_check(bias, "bias", op)
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise ValueError(
                f"{where(op, backend)}: bias must have shape [V] = [{weight.shape[0]}], got {tuple(bias.shape)}"
            )
    check_same_dtype(op, backend=backend, hidden=hidden, weight=weight, bias=bias)
    check_labels(labels, hidden.shape[0], ignore_index, backend=backend, integer_check=integer_check)
    check_same_device(op, backend=backend, hidden=hidden, weight=weight, labels=labels, bias=bias)
    check_label_values(labels, weight.shape[0], ignore_index, backend=backend, always=always, consequence=consequence)

"""The memory bound of a job (see :mod:`veomni_ops.train.job`): the least one rank needs for one
training step, from the model's shape and the train and parallel fields, checked against the
device's memory before anything is built."""

from __future__ import annotations

from typing import Any

from .errors import TrainConfigError
from .job_model import read_config_file
from .job_schema import DTYPE_BYTES, SIZES
from .job_train import device_problem, resolve_device

#: More memory than any one machine has (64 TiB; the largest shared-memory servers have about 48):
#: a step that needs more on each rank is refused wherever the job is meant to run, here or not.
MAX_STEP_BYTES = 64 * 2**40


def model_shape(job: dict[str, Any]) -> dict[str, int] | None:
    """The job model's ``hidden_size``, ``num_hidden_layers`` and ``vocab_size`` (its preset's or
    config file's, a multimodal file's ``text_config``'s, then ``model.config``'s), read without
    transformers; None where one is not a whole number > 0 (a mistake said elsewhere)."""
    if job["config_file"]:
        try:
            fields = read_config_file(job["config_file"])
        except TrainConfigError:
            return None
        text = fields.get("text_config")
        fields = {**(text if isinstance(text, dict) else {}), **fields}
    elif job["size"] in SIZES:
        fields = dict(SIZES[job["size"]])
    else:
        return None
    fields.update(job["overrides"])
    shape = {k: fields.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape.values()):
        return None
    return shape  # type: ignore[return-value]


def min_step_bytes(job: dict[str, Any]) -> tuple[int, str] | None:
    """A lower bound of the memory one rank needs for one training step of the job, and what it
    counts: each decoder layer's input, kept for its backward (the rank's tokens x hidden x
    layers, in train.dtype), and the input embedding's weights (vocab x hidden, sharded over
    ``dp_shard``). Every model and kernel needs at least these, so a job over its device's memory
    can never run; None where the job's shapes are mistakes of their own."""
    t, shape = job["train"], model_shape(job)
    fields_ok = all(isinstance(t[k], int) and not isinstance(t[k], bool) and t[k] >= 1 for k in ("batch_size", "seq_len"))
    if shape is None or not fields_ok or t["dtype"] not in DTYPE_BYTES:
        return None
    from ..parallel.layout import world_from_env

    layout = job["parallel"]  # without one, torchrun's processes are data-parallel ranks (one: no torchrun)
    dp, sp = (layout.dp_shard, layout.sp) if layout is not None else (world_from_env(), 1)
    tokens = -(-t["batch_size"] // (dp * (layout.dp_replicate if layout else 1))) * -(-t["seq_len"] // sp)
    hidden, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    size = DTYPE_BYTES[t["dtype"]]
    need = tokens * hidden * layers * size + -(-vocab * hidden * size // dp)
    return need, (f"each layer's input kept for the backward, {tokens:,} tokens x hidden {hidden:,} x {layers:,} "
                  f"layers x {size} bytes, and the embedding, vocab {vocab:,} x hidden {hidden:,}"
                  + (f" / dp_shard {dp}" if dp > 1 else ""))


def _step_memory(job: dict[str, Any], here: bool) -> list[str]:
    """One problem where a training step cannot fit: its lower bound (:func:`min_step_bytes`) over
    the memory of train.device (``here``: a CUDA GPU's or, on the CPU, the machine's), or over
    :data:`MAX_STEP_BYTES` anywhere. Checked before anything is built or allocated."""
    found = min_step_bytes(job)
    if found is None:
        return []
    need, what = found
    t = job["train"]
    memory, where = MAX_STEP_BYTES, f"any one machine has ({_gib(MAX_STEP_BYTES)})"
    device = t["device"]
    if here and device_problem(device) is None:
        from ..parallel.fsdp import device_memory_bytes

        device = resolve_device(device)
        if device.split(":")[0] in ("cpu", "cuda"):  # elsewhere the host's memory says nothing of the device's
            have = device_memory_bytes(device)
            if 0 < have < memory:
                memory = have
                where = (f"this machine's memory ({_gib(have)})" if device == "cpu" else
                         f"the memory of {device} here ({_gib(have)})")
    if need <= memory:
        return []
    return [f"train.seq_len {t['seq_len']:,} and batch_size {t['batch_size']:,}: one training step needs at least "
            f"{_gib(need)} on each rank ({what}), more than {where}: lower seq_len or batch_size, or split the batch "
            "over more ranks (parallel.dp_shard, parallel.sp)"]


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"

"""Client tests: transformers' Trainer, PEFT, gradient checkpointing, generate, torch.compile,
a user's FSDP2 loop and (de)serialisation, each on a bound model against the unbound one."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# clients_support.py sits beside this file, models_support.py (the tiny models) in ../models.
sys.path.insert(0, str(HERE.parent / "models"))
sys.path.insert(0, str(HERE))

"""What binding raises when a plan and a model do not fit (:class:`BindingError`), and the
transformers range its messages point at."""

from __future__ import annotations


class BindingError(ValueError):
    """The plan and the model do not fit together."""


def version_hint() -> str:
    """The transformers versions this release supports, for a refusal that may come from another one."""
    from .versions import describe_support

    return describe_support()

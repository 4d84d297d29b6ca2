"""veomni-flash: flash-attention 2, 3 and 4 as attention backends of veomni-ops.

Importing this package is cheap: it imports no torch, no transformers and no flash package.
The kernels live in :mod:`veomni_flash.kernels` (imported when a config selects one), the
transformers glue in :mod:`veomni_flash.transformers_adapter`.
"""

from .packages import NAME_TO_VERSION, PACKAGES, VEOMNI_NAMES, FlashPackage, version_for

__version__ = "0.1.0"

__all__ = ["FlashPackage", "NAME_TO_VERSION", "PACKAGES", "VEOMNI_NAMES", "__version__", "version_for"]

"""Which flash-attention package backs which name. Light: standard library only.

Three generations of flash-attention ship as three distributions with three import paths:

=======  =====================  ========================  ==========================================
version  distribution           import                    how it is installed
=======  =====================  ========================  ==========================================
FA2      ``flash-attn``         ``flash_attn``            PyPI sdist, compiles from source (CUDA)
FA3      ``flash-attn-3``       ``flash_attn_interface``  not on PyPI: build ``hopper/`` of the repo
FA4      ``flash-attn-4``       ``flash_attn.cute``       PyPI, pure Python (CuTe DSL, JIT-compiled)
=======  =====================  ========================  ==========================================

FA3's ``hopper/setup.py`` names its distribution ``flash_attn_3`` (normalised: ``flash-attn-3``)
and installs the single module ``flash_attn_interface``; transformers checks for the same
name. FA4's wheel ships ``flash_attn/cute`` without ``flash_attn/__init__.py``, so with FA4 alone
``flash_attn`` is a namespace package that holds only ``cute``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlashPackage:
    version: int
    distribution: str
    requirement: str
    module: str
    extra: str
    install: str

    @property
    def kernel_name(self) -> str:
        return f"flash_attention_{self.version}"

    @property
    def veomni_name(self) -> str:
        return f"veomni_flash_attention_{self.version}_with_sp"


PACKAGES: dict[int, FlashPackage] = {
    2: FlashPackage(
        version=2,
        distribution="flash-attn",
        requirement="flash-attn>=2.8.3",  # the release run on the H100 (2.8.3.post2); softcap needs >= 2.6
        module="flash_attn",
        extra="fa2",
        install=(
            'pip install "flash-attn>=2.8.3" --no-build-isolation  (compiles from source against your torch/CUDA; '
            "veomni-flash's gpu/build_fa2.sh builds sm90 only)"
        ),
    ),
    3: FlashPackage(
        version=3,
        distribution="flash-attn-3",
        requirement="flash-attn-3>=3.0.0",
        module="flash_attn_interface",
        extra="fa3",
        install=(
            "build it from source: git clone https://github.com/Dao-AILab/flash-attention && "
            "cd flash-attention/hopper && pip install . --no-build-isolation  (no wheel on PyPI)"
        ),
    ),
    4: FlashPackage(
        version=4,
        distribution="flash-attn-4",
        requirement="flash-attn-4>=4.0.0b36",
        module="flash_attn.cute",
        extra="fa4",
        install='pip install "veomni-flash[fa4]"  (or: pip install "flash-attn-4>=4.0.0b36")',
    ),
}

#: Every attention-implementation name this plugin serves -> flash-attention version.
#: The bare names are transformers' own; the ``veomni_*_with_sp`` names are VeOmni's.
NAME_TO_VERSION: dict[str, int] = {
    **{p.kernel_name: v for v, p in PACKAGES.items()},
    **{p.veomni_name: v for v, p in PACKAGES.items()},
}

#: VeOmni's private names only (the ones transformers would otherwise send to the kernel hub).
VEOMNI_NAMES: dict[str, int] = {p.veomni_name: v for v, p in PACKAGES.items()}


def version_for(name: str) -> int:
    """The flash-attention version behind an implementation name; ``KeyError`` names the known ones."""
    try:
        return NAME_TO_VERSION[name]
    except KeyError:
        raise KeyError(
            f"{name!r} is not a veomni-flash attention name; known: {', '.join(sorted(NAME_TO_VERSION))}"
        ) from None

"""Adapters from the veomni-ops kernel contracts to Quack's API.

Each submodule imports the Quack module it needs when it is imported, so a plan that
selects only ``rms_norm`` never imports ``quack.linear_cross_entropy`` (which failed to
import against nvidia-cutlass-dsl 4.8.1 in one measured environment). Nothing here is
imported at package import.
"""

"""The heavy side of veomni-flash: one module per flash-attention generation.

``fa2`` / ``fa3`` / ``fa4`` each import their flash package when imported (an ImportError
naming the package if it is missing); this package itself imports none of them.
"""

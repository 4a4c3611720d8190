"""effecthost: one portable seam for durable concurrent effects.

The public surface lives in :mod:`effecthost.contract` (types, errors, the controller
base), :mod:`effecthost.combinators` (``race``, ``any_``, ``all_``, ``all_settled``),
:mod:`effecthost.hosts` (the tiers) and :mod:`effecthost.conformance` (the suite).
"""

__version__ = "0.1.0"

"""Broken SQL hosts for the mutant catalog, loaded by the SQLite deployment process
(``host_class="sql_mutants:…"``). Each breaks one rule that needs a real restart to see.
Importing this module also registers them in the catalog (pytest side only)."""

from __future__ import annotations

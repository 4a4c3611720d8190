"""A module whose import fails, as a factory's module may."""

raise ImportError("this module cannot be imported")

"""The store's exceptions, in a module of their own so that the core and every
dialect can raise them without importing each other."""

from __future__ import annotations


class StoreError(Exception):
    """Something about the state database itself is wrong."""


class NotFound(StoreError, LookupError):
    """No job / attempt / incident / device with that id."""


class SchemaTooNew(StoreError):
    """The database was written by a newer trainguard than this one."""


__all__ = ["NotFound", "SchemaTooNew", "StoreError"]

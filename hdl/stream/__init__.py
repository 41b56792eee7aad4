"""Shared stream building blocks (``amaranth.lib.stream`` interfaces)."""

from .register_slice import RegisterSlice

__all__ = ["RegisterSlice"]

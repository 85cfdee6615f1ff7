"""`async def` tests here run as tests/controller's do: on a fresh event loop each, no plugin."""

from __future__ import annotations

from tests.controller.conftest import pytest_pyfunc_call

__all__ = ["pytest_pyfunc_call"]

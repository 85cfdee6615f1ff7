"""`async def` tests here run on a fresh event loop each, as in tests/controller (the same hook)."""

from tests.controller.conftest import pytest_pyfunc_call

__all__ = ["pytest_pyfunc_call"]

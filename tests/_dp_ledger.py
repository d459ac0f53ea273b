"""Shared by the private-training tests: a fresh ledger of training calls and σ cache per test, and exact-message
matching of the budget refusals."""

from __future__ import annotations

import re

import pytest

from clbench.privacy import step
from clbench.privacy.accountant import PrivacyBudgetError, noise_multiplier


@pytest.fixture(autouse=True)
def _ledger(monkeypatch):
    """Each test starts with an empty ledger of training calls (a process-wide dict) and an empty σ cache (a
    cached σ from another test, or from mutmut's first pass, would hide a change to the search)."""
    monkeypatch.setattr(step, "LEDGER", {})
    noise_multiplier.cache_clear()


def exact(message: str) -> str:
    """A pattern matching exactly ``message``."""
    return f"^{re.escape(message)}$"


def refused(message: str):
    return pytest.raises(PrivacyBudgetError, match=exact(message))

"""The framework tests' shared torchrun launches (tests/integrations/_launches.py)."""

from __future__ import annotations

import pytest
from tests.integrations._launches import Launches, shared


@pytest.fixture(scope="session")
def launches(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Launches:
    """Every selected module's ``launch_jobs``, in one launch per phase (once for all xdist
    workers)."""
    return shared(request, tmp_path_factory)

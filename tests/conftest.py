"""Shared fixtures. GPU tests (marker ``gpu``) skip where torch sees no GPU."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no GPU visible to torch (run on the lent H200: scripts/gpu_run.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_jit_cache(tmp_path_factory, monkeypatch):
    """Each test session compiles into its own cache unless MONO_CACHE_DIR is set."""
    import os

    if "MONO_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("MONO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "jit-cache"))

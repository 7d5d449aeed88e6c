"""Eval tests share the CPU with other suites: one torch thread keeps them predictable."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    torch.set_num_threads(1)

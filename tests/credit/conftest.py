"""One torch thread per test: the tensors here are tiny, and on a shared 2-core machine spin-waiting threads
make them several times slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Suite-wide test settings."""

import os
from pathlib import Path

import pytest
import torch

# Tests never touch the network: wandb stays offline, hub libraries read only local caches.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Subprocesses the tests start (training runs, DDP workers) inherit this: on a 2-core CI machine two
# processes of two threads each oversubscribe the cores and stall.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Scripts the tests start (`python scripts/...`, `python train.py`) import this checkout's package,
# whichever checkout an editable install in the environment points at.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH")]))


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tests run many tiny ops: one torch thread is several times faster than two on a 2-core CI
    machine (no oversubscription stalls). Subprocesses pick their own thread counts."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped, with the reason, where no CUDA device exists."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The tiny prepared datasets the training tests share (demo corpus, chat SFT, long context)."""
    from _train_helpers import tiny_datasets

    return tiny_datasets(tmp_path_factory.getbasetemp() / "train_data")

"""Suite-wide test settings."""

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from filelock import FileLock

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


@contextmanager
def shared_folder(tmp_path_factory, name: str):
    """A folder of this test session that every pytest-xdist worker shares (each worker has its own
    base folder; their parent is the session's), held under a lock while the caller fills it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    with FileLock(str(base / f"{name}.lock")):
        yield base / name


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The tiny prepared datasets the training tests share (demo corpus, chat SFT, long context)."""
    from _train_helpers import tiny_datasets

    with shared_folder(tmp_path_factory, "train_data") as base:
        return tiny_datasets(base)


@pytest.fixture(scope="session")
def reference(data, tmp_path_factory) -> Path:
    """The uninterrupted run (_train_helpers.REFERENCE) that the kill / stop / resume tests compare
    their resumed runs with, trained once per test session: its run folder."""
    from anchormass.runs.layout import finished_run
    from anchormass.runs.train import train

    from _train_helpers import REFERENCE, compose_train

    with shared_folder(tmp_path_factory, "reference") as out:
        if not finished_run(out):
            train(compose_train([*REFERENCE, f"data_dir={data['pretrain']}"], out))
        return out

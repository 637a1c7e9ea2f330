"""DataModules: same seed -> same batches; world size, workers, interruption never change the order;
a resume on different data is refused."""

import pytest
import torch

from anchormass.data.datamodule import PretrainDataModule, SFTDataModule
from anchormass.data.testing import tiny_pretrain
from anchormass.errors import DataError

SEQ, GBS = 32, 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_pretrain(tmp_path_factory.mktemp("tiny") / "tiny")


def take(dm, n_batches, **_):
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(n_batches)]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in ("input_ids", "targets"))


def test_batch_format_and_next_token_targets(data_dir):
    dm = PretrainDataModule(data_dir, SEQ, GBS, seed=1)
    b = take(dm, 1)[0]
    assert set(b) == {"input_ids", "targets"}
    assert b["input_ids"].shape == b["targets"].shape == (GBS, SEQ) and b["input_ids"].dtype == torch.long
    assert torch.equal(b["input_ids"][:, 1:], b["targets"][:, :-1])
    assert int(b["input_ids"].max()) < dm.vocab_size


def test_same_seed_same_batches_different_seed_different(data_dir):
    a = take(PretrainDataModule(data_dir, SEQ, GBS, seed=1), 6)
    b = take(PretrainDataModule(data_dir, SEQ, GBS, seed=1), 6)
    c = take(PretrainDataModule(data_dir, SEQ, GBS, seed=2), 6)
    assert same(a, b) and not same(a, c)


@pytest.mark.parametrize("world,acc", [(2, 1), (2, 2), (1, 4)])
def test_simulated_ranks_and_accumulation_give_the_same_global_batches(data_dir, world, acc):
    ref = take(PretrainDataModule(data_dir, SEQ, GBS, seed=5), 5)
    per_rank = [take(PretrainDataModule(data_dir, SEQ, GBS, seed=5, world_size=world, rank=r,
                                        accumulate_grad_batches=acc), 5 * acc) for r in range(world)]
    for step in range(5):
        parts = [per_rank[r][step * acc + m] for r in range(world) for m in range(acc)]
        glued = {k: torch.cat([p[k] for p in parts]) for k in ("input_ids", "targets")}
        assert parts[0]["input_ids"].shape[0] == GBS // (world * acc)
        assert same([glued], [ref[step]])


def test_interrupted_and_resumed_equals_uninterrupted(data_dir, tmp_path):
    full = take(PretrainDataModule(data_dir, SEQ, GBS, seed=9), 10)
    first = PretrainDataModule(data_dir, SEQ, GBS, seed=9)
    head = take(first, 4)
    state = first.state_dict()
    assert state["next_step"] == 4
    torch.save(state, tmp_path / "state.pt")  # as in a checkpoint
    fresh = PretrainDataModule(data_dir, SEQ, GBS, seed=9)
    fresh.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert same(head + take(fresh, 6), full)


def test_resume_with_accumulation_counts_optimizer_steps(data_dir):
    kw = dict(seed=9, accumulate_grad_batches=2)
    full = take(PretrainDataModule(data_dir, SEQ, GBS, **kw), 8)
    first = PretrainDataModule(data_dir, SEQ, GBS, **kw)
    take(first, 5)  # 2 whole steps + half a step: that half is redone after the resume
    state = first.state_dict()
    assert state["next_step"] == 2
    fresh = PretrainDataModule(data_dir, SEQ, GBS, **kw)
    fresh.load_state_dict(state)
    assert same(take(fresh, 4), full[4:8])


def test_workers_do_not_change_the_order(data_dir):
    a = take(PretrainDataModule(data_dir, SEQ, GBS, seed=4, num_workers=0), 7)
    b = take(PretrainDataModule(data_dir, SEQ, GBS, seed=4, num_workers=2), 7)
    assert same(a, b)


def test_resume_on_different_data_refused_unless_allowed(data_dir, tmp_path):
    state = PretrainDataModule(data_dir, SEQ, GBS, seed=1).state_dict()
    other = tiny_pretrain(tmp_path / "other", seed=4)
    with pytest.raises(DataError, match="resuming on different data.*allow_data_change"):
        PretrainDataModule(other, SEQ, GBS, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="order settings differ"):
        PretrainDataModule(data_dir, SEQ * 2, GBS, seed=1).load_state_dict(state)
    dm = PretrainDataModule(other, SEQ, GBS, seed=1, allow_data_change=True)
    dm.load_state_dict({**state, "next_step": 3})
    assert dm.next_step == 3


def test_val_loader_is_fixed_and_shared_out_by_rank(data_dir):
    dm = PretrainDataModule(data_dir, SEQ, GBS, seed=1, val_samples=6)
    a, b = list(dm.val_dataloader()), list(dm.val_dataloader())
    assert sum(len(x["input_ids"]) for x in a) == 6 and same(a, b)
    rows = {tuple(r.tolist()) for x in a for r in x["input_ids"]}
    shares = [{tuple(r.tolist()) for x in PretrainDataModule(data_dir, SEQ, GBS, seed=1, val_samples=6, world_size=2,
                                                              rank=k).val_dataloader() for r in x["input_ids"]}
              for k in (0, 1)]
    assert shares[0] | shares[1] == rows and not shares[0] & shares[1]


def test_wrong_kind_and_missing_folder(data_dir, tmp_path):
    with pytest.raises(DataError, match="needs 'sft'"):
        SFTDataModule(data_dir, SEQ, GBS)
    with pytest.raises(DataError, match="not a prepared dataset"):
        PretrainDataModule(tmp_path, SEQ, GBS)
    with pytest.raises(DataError, match="fewer than one sequence"):
        PretrainDataModule(data_dir, 10**7, GBS)

"""The data order under a real Lightning Trainer: resuming from a mid-run checkpoint (with gradient
accumulation, across Lightning epoch boundaries) feeds exactly the batches the uninterrupted run fed.
(The training helper's test does the same with the real model; this one isolates the data side.)"""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from anchormass.data.datamodule import PretrainDataModule
from anchormass.data.testing import tiny_pretrain

GBS, ACC, MAX_STEPS, CKPT_STEP = 4, 2, 9, 6
SEQ = 64  # the DDP test; the resume test picks its own so that an epoch is 4 steps


class Recorder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["input_ids"].clone())
        return self.w * batch["input_ids"].float().mean() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def seq_for_short_epochs(data_dir, steps_per_epoch=4):
    """A seq_len giving steps_per_epoch optimizer steps per pass (one partial batch at the end)."""
    n_tokens = PretrainDataModule(data_dir, 8, GBS).data.meta["splits"]["train"]["tokens"]
    return (n_tokens - 1) // (steps_per_epoch * GBS - 2)


def fit(data_dir, root, ckpt_path=None):
    dm, model = PretrainDataModule(data_dir, seq_for_short_epochs(data_dir), GBS, seed=42), Recorder()
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=3, save_top_k=-1, filename="{step}")
    trainer = L.Trainer(max_steps=MAX_STEPS, accumulate_grad_batches=ACC, accelerator="cpu", devices=1,
                        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[ckpt],
                        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=root)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return dm, model.seen


@pytest.mark.slow
def test_lightning_resume_continues_the_global_order(tmp_path):
    data_dir = tiny_pretrain(tmp_path / "tiny")
    dm, full = fit(data_dir, tmp_path / "a")
    # the run crosses Lightning epoch boundaries and the checkpoint is taken mid-epoch
    assert dm.order.steps_per_epoch < CKPT_STEP < MAX_STEPS and CKPT_STEP % dm.order.steps_per_epoch
    assert len(full) == MAX_STEPS * ACC
    ckpt = tmp_path / "a" / "ckpt" / f"step={CKPT_STEP}.ckpt"
    state = torch.load(ckpt, weights_only=False)["PretrainDataModule"]
    assert state["next_step"] == CKPT_STEP
    _, resumed = fit(data_dir, tmp_path / "b", ckpt_path=ckpt)
    assert len(resumed) == (MAX_STEPS - CKPT_STEP) * ACC
    assert all(torch.equal(a, b) for a, b in zip(resumed, full[CKPT_STEP * ACC:]))
    # and the uninterrupted run itself followed the global order, step by step
    ref = PretrainDataModule(data_dir, seq_for_short_epochs(data_dir), GBS, seed=42)
    for step in range(MAX_STEPS):
        glued = torch.cat(full[step * ACC:(step + 1) * ACC])
        want = torch.stack([torch.from_numpy(ref.train_samples.get(int(i))[0]) for i in ref.order.global_batch(step)])
        assert torch.equal(glued, want)


class RankRecorder(L.LightningModule):
    """Saves every micro-batch it trains on to out/rank<r>_<i>.pt (runs in spawned processes)."""

    def __init__(self, out):
        super().__init__()
        self.out = str(out)
        self.w = torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):
        torch.save(batch["input_ids"], f"{self.out}/rank{self.global_rank}_{batch_idx}.pt")
        return self.w * batch["input_ids"].float().mean() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.slow
def test_two_process_ddp_ranks_take_slices_of_the_same_global_batches(tmp_path):
    data_dir = tiny_pretrain(tmp_path / "tiny")
    steps = 3
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                        default_root_dir=tmp_path)
    trainer.fit(RankRecorder(tmp_path), datamodule=PretrainDataModule(data_dir, SEQ, GBS, seed=42))
    ref = PretrainDataModule(data_dir, SEQ, GBS, seed=42)
    for step in range(steps):
        glued = torch.cat([torch.load(tmp_path / f"rank{r}_{step}.pt") for r in (0, 1)])
        want = torch.stack([torch.from_numpy(ref.train_samples.get(int(i))[0]) for i in ref.order.global_batch(step)])
        assert glued.shape[0] == GBS and torch.equal(glued, want)

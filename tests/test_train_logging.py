"""What a tiny run logs, read back from its TensorBoard event file as TensorBoard reads it: the
gradient norm before clipping, the learning rate per named parameter group, val/ppl beside val/loss,
tokens/s, and the run record (resolved config, git commit, data fingerprint) in the HPARAMS tab."""

import math

import pytest
import torch

from anchormass.data.dataset_dir import fingerprint
from anchormass.runs.train import train
from anchormass.training.device_peak import known_peak_tflops
from anchormass.training.optim import grad_norm
from anchormass.utils import git_commit

from _train_helpers import FAST, compose_train

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

CLIP = 1e-3  # far below a random-init model's gradient norm: a norm logged after clipping would be <= it


def read_events(folder):
    (events,) = folder.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
               for k, v in start.session_start_info.hparams.items()}
    metrics = [m.name.tag for m in experiment.experiment.metric_infos]
    return scalars, hparams, metrics


def test_tensorboard_has_the_usual_tags_and_the_run_record(data, tmp_path):
    out = tmp_path / "run"
    # The trainer preset's own logging cadence (no log_every_n_steps override): a 2-step run logs every step.
    train(compose_train([f"data_dir={data['pretrain']}", *FAST, "logger=tensorboard",
                         f"trainer.gradient_clip_val={CLIP}", "optim.weight_decay=0.05"], out))
    scalars, hparams, metrics = read_events(out / "tensorboard")

    assert {"train/loss", "train/grad_norm", "lr/decay", "lr/no_decay", "val/loss", "val/ppl",
            "perf/tokens_per_s"} <= set(scalars)
    assert not [tag for tag in scalars if tag.startswith("lr-")]
    assert [step for step, _ in scalars["train/grad_norm"]] == [0, 1]  # every logged step
    assert all(norm > 10 * CLIP for _, norm in scalars["train/grad_norm"])  # before clipping
    (val_step, val_loss), = scalars["val/loss"]
    assert scalars["val/ppl"] == [(val_step, pytest.approx(math.exp(val_loss), rel=1e-5))]
    assert scalars["lr/no_decay"] == scalars["lr/decay"]  # one schedule, two groups
    assert [step for step, _ in scalars["lr/decay"]] == [0, 1]  # from the first step on
    assert scalars["train/tokens_seen"] == [(0, 2 * 64), (1, 4 * 64)]  # 2 rows of 64 tokens a step

    assert hparams["optim.weight_decay"] == pytest.approx(0.05) and hparams["output_dir"] == str(out)
    assert hparams["model.vocab_size"] == 400  # the model trained: its vocabulary comes from the data
    assert hparams["git_commit"] == git_commit() and hparams["data_fingerprint"] == fingerprint(data["pretrain"])
    assert {"val/loss", "val/ppl"} <= set(metrics)
    assert not [tag for tag in scalars if tag == "hp_metric"]


def test_grad_norm_is_the_global_l2_norm():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model(torch.randn(5, 3)).square().sum().backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert grad_norm(model).item() == pytest.approx(flat.norm().item(), rel=1e-6)


def test_known_device_peaks():
    assert known_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and known_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert known_peak_tflops("NVIDIA H200") == 989.0 and known_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert known_peak_tflops("NVIDIA L4") == 121.0 and known_peak_tflops("NVIDIA L40") is None
    assert known_peak_tflops("NVIDIA GeForce RTX 3060") is None

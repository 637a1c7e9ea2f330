"""Layer-local attention transfer and attention-only training (anchormass/training/objectives.py):
the loss is zero when the student computes the teacher's attention, each layer's error depends on
its own attention alone, and a stage trained with it moves the attention projections and nothing else."""

from __future__ import annotations

import pytest
import torch

from anchormass.errors import CheckpointError, ConfigError
from anchormass.models import build_model, load_model_config
from anchormass.runs.train import train
from anchormass.training.checkpoint import read_checkpoint
from anchormass.training.objectives import attention_transfer_loss, check_objective, check_same_shapes

from _train_helpers import FAST, compose_train

ATTN = (".q_proj.", ".k_proj.", ".v_proj.", ".o_proj.")


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    teacher = build_model(load_model_config("standard_tiny")).eval()
    student = build_model(load_model_config("anchormass_tiny"))
    student.load_state_dict(teacher.state_dict())
    return teacher, student


def test_the_loss_is_zero_for_the_teacher_itself_and_not_for_compressed_attention():
    teacher, student = _pair()
    ids = torch.randint(0, teacher.cfg.vocab_size, (2, 192))  # past one window (64): compression bites
    same, per_layer = attention_transfer_loss(teacher, teacher, ids)
    assert same.item() == 0.0 and per_layer.shape == (teacher.cfg.n_layers,)
    loss, per_layer = attention_transfer_loss(student, teacher, ids)
    assert loss.item() > 1e-6 and (per_layer > 0).all()


def test_each_layer_learns_from_its_own_error_only():
    """Changing layer 0's attention changes layer 0's error and no other layer's (the student's layer l
    reads the teacher's layer-l input), and the gradient reaches only attention projections."""
    teacher, student = _pair()
    ids = torch.randint(0, teacher.cfg.vocab_size, (1, 160))
    loss, before = attention_transfer_loss(student, teacher, ids)
    loss.backward()
    for name, p in student.named_parameters():
        assert (p.grad is not None) == any(k in name for k in ATTN), name
    with torch.no_grad():
        student.blocks[0].attn.q_proj.weight.mul_(1.5)
    _, after = attention_transfer_loss(student, teacher, ids)
    assert after[0] != before[0] and torch.equal(after[1:], before[1:])


def test_bad_objectives_and_teachers_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="stage.objective must be"):
        check_objective({"kind": "distill"}, "all")
    with pytest.raises(ConfigError, match="stage.trainable must be one of"):
        check_objective(None, "mlp")
    teacher = load_model_config("standard_tiny").to_dict()
    with pytest.raises(CheckpointError, match="teacher t.ckpt has other shapes.*d_model: 64 vs 128"):
        check_same_shapes({**teacher, "d_model": 64}, load_model_config("anchormass_tiny").to_dict(), "teacher t.ckpt")


def test_an_attention_transfer_stage_moves_attention_only(data, tmp_path):
    """AnchorMass started from a Standard checkpoint and trained two steps by attention transfer:
    the teacher defaults to the start checkpoint (recorded, resolved), the attention projections
    move, embeddings, norms and MLPs stay bitwise as they were; without a teacher it is refused."""
    ckpt = train(compose_train(["model=standard_tiny", f"data_dir={data['pretrain']}", *FAST],
                               tmp_path / "std"))["last_checkpoint"]
    over = ["model=anchormass_tiny", f"data_dir={data['pretrain']}", *FAST, "stage.seq_len=160", "stage.lr=1e-2",
            "stage.objective.kind=attention_transfer"]
    with pytest.raises(ConfigError, match="attention_transfer needs a teacher"):
        train(compose_train(over, tmp_path / "none"))
    out = train(compose_train([*over, f"init_from={ckpt}", "init_across_arch=true"], tmp_path / "am"))
    start, end = read_checkpoint(ckpt), read_checkpoint(out["last_checkpoint"])
    assert end["hyper_parameters"]["objective"] == {"kind": "attention_transfer", "teacher": str(ckpt)}
    assert end["hyper_parameters"]["trainable"] == "attention"
    moved = {k for k, v in end["state_dict"].items() if not torch.equal(v, start["state_dict"][k])}
    assert moved and all(any(a in k for a in ATTN) for k in moved), sorted(moved)


def test_trainable_attention_freezes_the_rest_under_the_lm_loss(data, tmp_path):
    """stage.trainable=attention: the LM loss reaches every parameter, but only the attention
    projections are handed to the optimizer."""
    over = ["model=standard_tiny", f"data_dir={data['pretrain']}", *FAST, "stage.lr=1e-2"]
    first = train(compose_train(over, tmp_path / "a"))["last_checkpoint"]
    out = train(compose_train([*over, f"init_from={first}", "stage.trainable=attention"], tmp_path / "b"))
    start, end = read_checkpoint(first)["state_dict"], read_checkpoint(out["last_checkpoint"])["state_dict"]
    moved = {k for k, v in end.items() if not torch.equal(v, start[k])}
    assert moved and all(any(a in k for a in ATTN) for k in moved), sorted(moved)


def test_a_run_recorded_before_the_objective_existed_is_the_same_run_under_the_defaults():
    """Stages recorded before stage.objective / stage.trainable were settings ran the LM loss on every
    parameter: against today's defaults they are unchanged; against attention transfer they differ."""
    from anchormass.runs.run_settings import setting_differences

    old = {"stage.lr": 1e-3}
    now = {"stage.lr": 1e-3, "stage.objective.kind": "lm", "stage.objective.teacher": None, "stage.trainable": "all"}
    assert setting_differences(old, now) == []
    assert setting_differences(old, {**now, "stage.objective.kind": "attention_transfer"}) == [
        "stage.objective.kind: lm -> attention_transfer"]


def test_a_learned_outlier_scorer_is_trained_by_attention_transfer():
    """model.outlier_scorer=learned (§2.3): attention transfer reaches the scorer (straight-through),
    and freezing all but attention keeps it trainable."""
    from anchormass.training.objectives import freeze_all_but_attention

    teacher, _ = _pair()
    student = build_model(load_model_config("anchormass_tiny").replace(outlier_scorer="learned"))
    missing, _ = student.load_state_dict(teacher.state_dict(), strict=False)
    assert missing and all(k.endswith("attn.outlier_score") for k in missing)
    freeze_all_but_attention(student)
    assert all(b.attn.outlier_score.requires_grad for b in student.blocks)
    loss, _ = attention_transfer_loss(student, teacher, torch.randint(0, teacher.cfg.vocab_size, (1, 192)))
    loss.backward()
    assert all(b.attn.outlier_score.grad.abs().sum() > 0 for b in student.blocks)

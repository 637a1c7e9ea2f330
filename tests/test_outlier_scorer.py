"""outlier_scorer=learned (docs/method.md §2.3, issue 45): a per-layer scorer on the values picks the
token of each group that stays exact, trained straight-through. Parallel forward == chunked prefill +
decoding with a random scorer is tests/test_equivalence.py's anchormass_tiny_learned case."""

import pytest
import torch

from anchormass.errors import CheckpointError, ConfigError
from anchormass.eval.suites.retrofit.slot_probe import LayerQKV, LayerView
from anchormass.models import build_model, load_model_config
from anchormass.models.accounting import count_parameters, param_count
from anchormass.models.attention_anchormass import AnchorMassAttention
from anchormass.models.compression import compress_blocks, group_decisions, outlier_scores
from anchormass.models.config import ModelConfig, available_presets
from anchormass.models.kernels.block_sdpa import BlockSdpaKernel
from anchormass.models.kernels.flex import FlexKernel
from anchormass.models.reference import reference_anchormass_attention
from anchormass.runs.start_module import check_same_architecture
from anchormass.runs.train import train
from anchormass.training.checkpoint import load_weights, read_checkpoint

from _train_helpers import FAST, compose_train


def _learned(**changes) -> ModelConfig:
    return load_model_config("anchormass_tiny").replace(outlier_scorer="learned", **changes)


def _kv(n: int = 64, heads: int = 2, d: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, n, d, generator=g), torch.randn(1, heads, n, d, generator=g)


def test_rule_is_the_default_and_a_bad_value_is_one_line():
    cfg = load_model_config("anchormass_tiny")
    assert cfg.outlier_scorer == "rule"
    old = {k: v for k, v in cfg.to_dict().items() if k != "outlier_scorer"}  # a checkpoint older than the field
    assert ModelConfig.from_dict(old).outlier_scorer == "rule"
    with pytest.raises(ConfigError, match=r"^model config 'anchormass_tiny': outlier_scorer must be one of") as err:
        cfg.replace(outlier_scorer="oracle")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", available_presets())
def test_presets_keep_their_parameters(name):
    with torch.device("meta"):
        model = build_model(name)
    assert model.cfg.outlier_scorer == "rule"
    assert not model.may_start_without() and count_parameters(model) == param_count(model.cfg)


def test_the_scorer_counts_as_parameters():
    with torch.device("meta"):
        rule = build_model("anchormass_158m")
        learned = build_model(load_model_config("anchormass_158m").replace(outlier_scorer="learned"))
    extra = learned.cfg.n_layers * learned.cfg.n_global_kv_heads * learned.cfg.head_dim
    assert count_parameters(learned) == param_count(learned.cfg) == count_parameters(rule) + extra


def test_every_group_emits_its_highest_scoring_token():
    cfg = _learned()
    k, v = _kv()
    scorer = torch.randn(2, 32, generator=torch.Generator().manual_seed(1))
    idx, emit = group_decisions(v, cfg, scorer=scorer)
    assert emit.all() and torch.equal(idx, outlier_scores(v, scorer, 8).argmax(dim=-1))
    assert len(set(idx.flatten().tolist())) > 1  # a random scorer does not pick one position everywhere
    zero_idx, _ = group_decisions(v, cfg, scorer=torch.zeros(2, 32))
    assert (zero_idx == 0).all()  # ties (the zero init): the lowest index
    sk, sv, sm = compress_blocks(k, v, cfg, scorer=scorer)
    kg, vg = k.view(1, 2, 8, 8, 32), v.view(1, 2, 8, 8, 32)
    for j in range(8):  # the outlier slot is the chosen token exactly; the background the other 7
        i = int(idx[0, j])
        assert torch.equal(sk[0, :, 2 * j + 1], kg[0, :, j, i]) and torch.equal(sv[0, :, 2 * j + 1], vg[0, :, j, i])
        rest = [x for x in range(8) if x != i]
        assert torch.allclose(sv[0, :, 2 * j], vg[0, :, j, rest].mean(dim=1), atol=1e-6)
        assert sm[0, 2 * j:2 * j + 2].tolist() == [7.0, 1.0]
    assert compress_blocks(k, v, cfg.replace(outliers=False), scorer=scorer)[2][0, 1::2].eq(0).all()


def test_forced_oracle_overrides_the_scorer():
    cfg = _learned()
    _, v = _kv()
    scorer = torch.randn(2, 32, generator=torch.Generator().manual_seed(1))
    forced = torch.zeros(1, 64, dtype=torch.bool)
    forced[0, 8 + 3] = True  # group 1, token 3
    idx, emit = group_decisions(v, cfg, forced=forced, scorer=scorer)
    free, _ = group_decisions(v, cfg, scorer=scorer)
    assert emit.all() and int(idx[0, 1]) == 3
    assert torch.equal(idx[0, [0, *range(2, 8)]], free[0, [0, *range(2, 8)]])


def test_a_scorer_exactly_when_the_config_asks_for_one():
    k, v = _kv()
    with pytest.raises(ValueError, match="needs the layer's scorer"):
        compress_blocks(k, v, _learned())
    with pytest.raises(ValueError, match="takes no scorer"):
        compress_blocks(k, v, load_model_config("anchormass_tiny"), scorer=torch.zeros(2, 32))


def test_straight_through_moves_the_choice_on_a_toy_objective():
    """Learn to keep token 5 of every group exact: its values share one direction. The forward
    is the hard choice (token 0 at the zero init), the backward the softmax."""
    cfg = _learned()
    k, v = _kv()
    direction = torch.nn.functional.normalize(torch.randn(32, generator=torch.Generator().manual_seed(2)), dim=0)
    v.view(1, 2, 8, 8, 32)[:, :, :, 5] += 3.0 * direction
    target = v.view(1, 2, 8, 8, 32)[:, :, :, 5]  # [1, Hg, ng, D]
    scorer = torch.nn.Parameter(torch.zeros(2, 32))
    opt = torch.optim.Adam([scorer], lr=0.1)
    assert (group_decisions(v, cfg, scorer=scorer.detach())[0] == 0).all()
    losses = []
    for _ in range(10):
        _, sv, _ = compress_blocks(k, v, cfg, scorer=scorer)
        loss = ((sv[:, :, 1::2] - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        assert losses or scorer.grad.abs().max() > 0  # the first step's gradient (later ones reach 0)
        opt.step()
        losses.append(loss.item())
    assert (group_decisions(v, cfg, scorer=scorer.detach())[0] == 5).all()
    assert losses[0] > 1.0 and losses[-1] == 0.0  # the outlier slots are now token 5, exactly


def test_a_training_step_reaches_every_layers_scorer():
    torch.manual_seed(0)
    model = build_model(_learned(attn_impl="block_sdpa"))
    ids = torch.randint(0, model.cfg.vocab_size, (2, 160))  # two compressed blocks past the 16 sinks
    logits = model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    for block in model.blocks:
        grad = block.attn.outlier_score.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0


def _small_learned(**changes) -> ModelConfig:
    return _learned(block_size=16, group_size=4, n_sinks=5, window=8, **changes)


@pytest.mark.parametrize("changes", [{}, {"n_kv_heads": 2}, {"background_key": "mean"}])
def test_block_sdpa_equals_the_reference_forward_and_backward(changes):
    cfg = _small_learned(**changes)
    g = torch.Generator().manual_seed(3)
    q0 = torch.randn(2, 4, 90, 32, generator=g)
    k0, v0 = (torch.randn(2, cfg.kv_heads, 90, 32, generator=g) for _ in range(2))
    s0 = torch.randn(cfg.n_global_kv_heads, 32, generator=g)
    results = []
    for kernel in (BlockSdpaKernel(cfg, query_chunk=32), None):
        q, k, v, s = (x.clone().requires_grad_() for x in (q0, k0, v0, s0))
        if kernel is None:
            out = reference_anchormass_attention(q, k, v, cfg, scorer=s)
        else:
            attn = AnchorMassAttention(cfg, layer_idx=0)
            attn.kernel, attn.outlier_score = kernel, torch.nn.Parameter(s)
            out = attn.parallel_attention(q, k, v)
            s = attn.outlier_score
        (out * torch.linspace(-1, 1, 90 * 32).view(90, 32)).sum().backward()
        results.append((out, q.grad, k.grad, v.grad, s.grad))
    for got, want in zip(*results):
        assert (got - want).abs().max().item() <= 1e-4
    assert results[0][-1].abs().max() > 0


def test_flex_forward_uses_the_scorer():
    cfg = _small_learned()
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 70, 32, generator=g) for _ in range(3))
    scorer = torch.randn(2, 32, generator=g)
    want = BlockSdpaKernel(cfg).global_attention(q, k, v, scorer)
    assert (FlexKernel(cfg, compiled=False).global_attention(q, k, v, scorer) - want).abs().max() <= 1e-5
    assert (BlockSdpaKernel(cfg).global_attention(q, k, v, -scorer) - want).abs().max() > 1e-3


def _checkpoint(model) -> dict:
    return {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}


def test_a_learned_model_starts_from_a_standard_checkpoint():
    """init_from (load_weights fresh_start=True): the scorers keep their zero init, everything else
    is copied; any other missing or unexpected key, or a plain load, is still refused in one line."""
    torch.manual_seed(0)
    standard = build_model("standard_tiny")
    learned = build_model(_learned())
    ckpt = _checkpoint(standard)
    load_weights(learned, ckpt, "std.ckpt", fresh_start=True)
    state = learned.state_dict()
    assert all(torch.equal(state[k], v) for k, v in standard.state_dict().items())
    assert all((block.attn.outlier_score == 0).all() for block in learned.blocks)
    with pytest.raises(CheckpointError, match=r"std.ckpt does not fit the model: .*outlier_score"):
        load_weights(learned, ckpt, "std.ckpt")  # evaluation loads stay strict
    lacking = {"state_dict": {k: v for k, v in ckpt["state_dict"].items() if k != "model.norm.weight"}}
    with pytest.raises(CheckpointError, match=r"Missing key.*norm\.weight"):
        load_weights(learned, lacking, "std.ckpt", fresh_start=True)
    extra = {"state_dict": {**ckpt["state_dict"], "model.extra": torch.zeros(1)}}
    with pytest.raises(CheckpointError, match=r"Unexpected key.*extra"):
        load_weights(learned, extra, "std.ckpt", fresh_start=True)
    with pytest.raises(CheckpointError, match=r"Unexpected key.*outlier_score"):  # learned -> rule drops nothing
        load_weights(build_model("anchormass_tiny"), _checkpoint(learned), "learned.ckpt", fresh_start=True)


def test_train_starts_a_learned_model_from_a_standard_checkpoint(data, tmp_path):
    """train.py init_from=<Standard> init_across_arch=true model.outlier_scorer=learned: the run starts
    (the scorers are the only keys the checkpoint lacks) and its training moves the scorers."""
    over = [f"data_dir={data['pretrain']}", *FAST]
    std = train(compose_train(["model=standard_tiny", *over], tmp_path / "std"))["last_checkpoint"]
    out = train(compose_train(["model=anchormass_tiny", "model.outlier_scorer=learned", *over, "stage.seq_len=160",
                               f"init_from={std}", "init_across_arch=true"], tmp_path / "learned"))
    state = read_checkpoint(out["last_checkpoint"])["state_dict"]
    scorers = [v for k, v in state.items() if k.endswith(".attn.outlier_score")]
    assert len(scorers) == 2 and all(s.abs().max() > 0 for s in scorers)  # zero at the start, moved by 2 steps


def test_the_slot_probe_refuses_a_learned_model_in_one_line():
    x = torch.zeros(1, 4, 100, 32)
    with pytest.raises(ConfigError, match="^the slot probe reads the rule's choice only"):
        LayerView(_learned(), LayerQKV(x, x, x))


def test_changing_the_scorer_is_crossing_architectures():
    """A resume (or init_from without init_across_arch=true) that changes outlier_scorer is refused
    in one line: a resume must restore every tensor, and the rule's checkpoint has no scorers."""
    rule = load_model_config("anchormass_tiny").to_dict()
    with pytest.raises(CheckpointError, match=r"outlier_scorer: rule in checkpoint vs learned\); init_across_arch"):
        check_same_architecture(rule, _learned(), "rule.ckpt")
    check_same_architecture(rule, _learned(), "rule.ckpt", across_arch=True)

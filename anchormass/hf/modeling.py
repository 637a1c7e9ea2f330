"""`transformers` classes for an exported AnchorMass checkpoint: they delegate to this package.

An exported folder's `modeling_anchormass.py` only re-exports these, so loading it with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` runs our model, kernels and
session cache, not a re-implementation. Works for either architecture (the Standard export
normally goes to LlamaForCausalLM instead; this wrapper is what lm-evaluation-harness runs
when asked to evaluate a checkpoint through our own cache).

Generation: `generate()` opens one of our session caches behind the `Cache` interface
(cache_adapter.py). The stage-2 slot policy and budget come, first found wins, from
`generate(..., slot_policy=, slot_budget=)`, the generation config's `slot_policy` /
`slot_budget`, or the model config (default: the checkpoint's own). Positions are per session
(the RoPE base is fixed from the prompt length, docs/method.md §1), so generation and any
forward through a cache take unpadded, equal-length prompts: an attention mask with zeros is
refused there. A cache-free forward (scoring, as lm-evaluation-harness does) accepts a
right-padded batch: the mask's row sums are the sequence lengths, each sequence gets its own
RoPE base, and its real positions score as they would alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from anchormass.hf.cache_adapter import AnchorMassHFCache
from anchormass.inference.generate import prefill
from anchormass.models import LanguageModel
from anchormass.models.config import ModelConfig
from anchormass.models.rope import ntk_base


class AnchorMassHFConfig(PreTrainedConfig):
    """`model_config`: our ModelConfig as a dict; the usual `transformers` fields mirror it."""

    model_type = "anchormass"

    model_config: dict | None = None
    slot_policy: str | None = None  # stage-2 default for generate(); None: model_config's
    slot_budget: int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        mc = ModelConfig.from_dict(self.model_config or {})  # validates: a bad config fails on load
        self.model_config = mc.to_dict()
        # What generic code (harness, pipelines) reads; derived, so not stored separately.
        self.vocab_size, self.hidden_size = mc.vocab_size, mc.d_model
        self.num_hidden_layers, self.num_attention_heads = mc.n_layers, mc.n_heads
        self.num_key_value_heads, self.tie_word_embeddings = mc.kv_heads, mc.tie_embeddings
        # No max_position_embeddings: beyond the trained length the session RoPE base stretches
        # (docs/method.md §1), there is no fixed limit to advertise.
        super().__post_init__(**kwargs)


class AnchorMassForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AnchorMassHFConfig
    base_model_prefix = "model"
    # Applies when the config ties them (tie_embeddings): the folder then stores the matrix once.
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = False

    def __init__(self, config: AnchorMassHFConfig):
        super().__init__(config)
        # Parameter names are "model.<ours>": the same keys as a training checkpoint's state_dict.
        self.model = LanguageModel(ModelConfig.from_dict(config.model_config))
        self.post_init()

    def _init_weights(self, module):
        # Our own initialisation (docs/method.md §1), not transformers' generic one.
        if isinstance(module, LanguageModel):
            module.reset_parameters()

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.model.lm_head

    # ------------------------------------------------------------------ generation
    def _stage2_choice(self, generation_config, model_kwargs) -> tuple[str | None, int | None]:
        def first(key):
            for source in (model_kwargs.get(key), getattr(generation_config, key, None), getattr(self.config, key)):
                if source is not None:
                    return source
            return None

        return first("slot_policy"), first("slot_budget")

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        if model_kwargs.get("cache") is not None or generation_config.use_cache is False:
            return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if generation_config.num_beams and generation_config.num_beams > 1:
            raise ValueError("beam search is not supported: a fixed-budget cache cannot be reordered")
        policy, budget = self._stage2_choice(generation_config, model_kwargs)
        model_kwargs["cache"] = AnchorMassHFCache(self.model.cfg.n_layers, policy, budget)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                cache: AnchorMassHFCache | None = None, use_cache: bool | None = None,
                labels: torch.LongTensor | None = None, logits_to_keep: int | torch.Tensor = 0,
                slot_policy: str | None = None, slot_budget: int | None = None,
                inputs_embeds: torch.Tensor | None = None, position_ids: torch.LongTensor | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast:
        """Logits [B, T, V] (the last `logits_to_keep` positions when > 0).

        Without a cache: our parallel forward over the whole sequence. With one (or
        `use_cache=True`): the tokens are appended to the session; a fresh session is prefilled
        like `anchormass.inference.generate.prefill` (RoPE base from this prompt's length).
        `position_ids` are ignored: positions follow the session (unpadded sequences), or, without
        a cache, each row of a right-padded `attention_mask` (its row sum is the sequence's length).
        """
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("AnchorMass models take input_ids (inputs_embeds is not supported)")
        if cache is not None and not isinstance(cache, AnchorMassHFCache):
            raise TypeError(f"cache must be an AnchorMassHFCache, got {type(cache).__name__}")
        decoding = cache is not None and cache.session is not None and input_ids.shape[1] == 1
        # Decode steps only append ones to the mask: checking the prompt's is enough (no sync per token).
        lengths = None
        if attention_mask is not None and not decoding and attention_mask.dim() == 2 and not bool(attention_mask.all()):
            if cache is not None or use_cache is True:
                raise ValueError("padded batches are not supported with a cache (generate): positions are per "
                                 "session, so pass equal-length prompts (or one prompt per call)")
            lengths = _right_padded_lengths(attention_mask)
        if cache is None and use_cache is True:
            cache = AnchorMassHFCache(self.model.cfg.n_layers, slot_policy, slot_budget)

        keep = logits_to_keep
        if cache is None:
            hidden = self.model.forward_hidden(input_ids, lengths=lengths)
            logits = self.model.lm_head(_keep(hidden, keep))
        elif cache.session is None and keep == 1:
            # The prompt of a generate() call: exactly our engine's prefill (last position only).
            logits = prefill(self.model, input_ids, cache.start(self.model, input_ids.shape[0]))[:, None]
        elif cache.session is None:
            logits = self.model.lm_head(_keep(self._prefill_all(input_ids, cache), keep))
        else:
            logits = self.model.lm_head(_keep(self.model.forward_hidden(input_ids, cache=cache.session), keep))

        loss = None
        if labels is not None:
            if keep:
                raise ValueError("labels need the logits of every position (logits_to_keep=0)")
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def _prefill_all(self, input_ids: torch.Tensor, cache: AnchorMassHFCache) -> torch.Tensor:
        """Hidden states of every prompt position through a fresh session (chunked like prefill)."""
        cfg = self.model.cfg
        session = cache.start(self.model, input_ids.shape[0])
        session.rope_base = ntk_base(cfg.rope_theta, input_ids.shape[1], cfg.original_max_len, cfg.head_dim)
        parts = [self.model.forward_hidden(input_ids[:, s:s + cfg.prefill_chunk], cache=session)
                 for s in range(0, input_ids.shape[1], cfg.prefill_chunk)]
        session.end_prefill()
        return torch.cat(parts, dim=1)


def _right_padded_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Row sums of a right-padded mask (each row ones, then zeros); any other mask is refused."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, positions[None, :] < lengths[:, None]) or int(lengths.min()) < 1:
        raise ValueError("only right-padded batches are supported without a cache (each attention_mask row "
                         "ones, then zeros; tokenizer.padding_side='right')")
    return lengths.tolist()


def _keep(hidden: torch.Tensor, keep: int | torch.Tensor) -> torch.Tensor:
    """The positions `logits_to_keep` asks for: all (0), the last k (int k), or given indices."""
    if isinstance(keep, torch.Tensor):
        return hidden[:, keep]
    return hidden[:, -keep:] if keep else hidden

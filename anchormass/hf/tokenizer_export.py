"""Our SentencePiece tokenizer as an `AutoTokenizer` folder that gives the same ids.

The folder holds a `tokenizers` tokenizer.json built from the SentencePiece proto by
`transformers`' own SentencePiece converter, which follows the model's normaliser (NFKC
charsmap, whitespace handling, dummy prefix), its BPE/unigram vocabulary with byte fallback,
and keeps user-defined pieces whole. It adds no BOS/EOS on its own, like `Tokenizer.encode`.

Chat: the role markers are registered as special tokens, so text between them is tokenised
piece by piece, each with its own dummy prefix - exactly how `anchormass.data.sft` builds
chat ids (each turn's text encoded separately). A plain string containing role markers is
therefore tokenised like the chat format, unlike `Tokenizer.encode` of that whole string (which
gives the text right after a marker no dummy prefix); text without markers gets identical ids.
The chat template writes the SFT format:

    <s> [<|system|> system <|end|>] <|user|> user <|end|> <|assistant|> [answer <|end|> </s>]
"""

from __future__ import annotations

from pathlib import Path

from anchormass.data.tokenizer import ROLE_MARKERS
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.errors import DataError

# Turn contents are used as given, like chat_prompt (render_example strips them before).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% if message['content'] %}<|system|>{{ message['content'] }}<|end|>{% endif %}"
    "{% elif message['role'] == 'user' %}<|user|>{{ message['content'] }}<|end|>"
    "{% elif message['role'] == 'assistant' %}<|assistant|>{{ message['content'] }}<|end|>{{ eos_token }}"
    "{% else %}{{ raise_exception('unknown chat role: ' + message['role']) }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def hf_tokenizer(tok: TokenizerBase):
    """A `PreTrainedTokenizerFast` giving `tok`'s ids (see the module docstring); an imported
    Hugging Face tokenizer is one already and keeps its own chat template."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    if tok.kind == "huggingface":
        return PreTrainedTokenizerFast(
            tokenizer_object=tok.backend, chat_template=tok.chat_template, clean_up_tokenization_spaces=False,
            model_max_length=int(1e30), **{k: v for k, v in tok.special_tokens.items() if v})
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    proto = import_protobuf().ModelProto.FromString(tok.sp.serialized_model_proto())
    model_type = proto.trainer_spec.model_type  # 1 unigram, 2 bpe
    if model_type == 1:
        vocab = [(p.piece, p.score) for p in proto.pieces]
    elif model_type == 2:
        vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    else:
        raise DataError(f"tokenizer {tok.path}: only unigram and BPE SentencePiece models can be exported")
    backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    # The charsmap maps character by character: a half-width kana and its half-width (semi-)voiced
    # mark (ﾎﾞ) become ホ + a combining mark, which SentencePiece composes into ボ (NFKC). NFC after
    # it composes them too; on NFKC-normal text it changes nothing.
    backend.normalizer = normalizers.Sequence([backend.normalizer, normalizers.NFC()])
    piece = tok.id_to_piece
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=piece(tok.bos_id), eos_token=piece(tok.eos_id),
        unk_token=piece(tok.unk_id), pad_token=piece(tok.pad_id), extra_special_tokens=list(ROLE_MARKERS),
        chat_template=CHAT_TEMPLATE, add_bos_token=False, add_eos_token=False, clean_up_tokenization_spaces=False,
        model_max_length=int(1e30),
        padding_side="left",  # a decoder-only model generates after the prompt: pad before it
    )


def export_tokenizer(tok: TokenizerBase, out_dir: str | Path) -> None:
    hf_tokenizer(tok).save_pretrained(str(out_dir))

"""Chat SFT data: the chat template, Alpaca records, response-only loss masks.

The project's template (ids; role markers are single reserved tokens of the SentencePiece
tokenizer, see tokenizer.py):

    <s> [<|system|> system <|end|>] <|user|> instruction [\\n\\n input] <|end|> <|assistant|> output <|end|> </s>

A tokenizer with a chat template of its own (an imported model's, hf_tokenizer.py; SmolLM2:
`<|im_start|>role\\n...<|im_end|>\\n`) uses that instead: the prompt is its rendering with the
generation prompt, the response what the rendering with the answer adds to it.

Loss is taken on the response only: the output tokens and what closes the turn (here <|end|> and
the final </s>), so the model learns to stop. `chat_prompt` gives the prompt part for generation.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.errors import DataError

ALPACA_FIELDS = {"instruction": "instruction", "input": "input", "output": "output"}


def user_text(instruction: str, inp: str | None) -> str:
    return instruction.strip() + (f"\n\n{inp.strip()}" if inp and inp.strip() else "")


def _messages(user: str, system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _role_ids(tok: TokenizerBase) -> None:
    if not hasattr(tok, "system_id"):
        raise DataError(f"tokenizer {tok.path} has no chat template and no chat-role markers: it cannot write chats")


def chat_prompt(tok: TokenizerBase, user: str, system: str | None = None) -> list[int]:
    """<s> [system turn] <|user|> user <|end|> <|assistant|> (or the tokenizer's own template up to
    the assistant's turn): generation continues from here."""
    if tok.chat_template:
        return tok.encode(tok.apply_chat_template(_messages(user, system), add_generation_prompt=True))
    _role_ids(tok)
    ids = [tok.bos_id]
    if system:
        ids += [tok.system_id, *tok.encode(system), tok.end_id]
    return ids + [tok.user_id, *tok.encode(user), tok.end_id, tok.assistant_id]


def render_example(tok: TokenizerBase, instruction: str, inp: str | None, output: str,
                   system: str | None = None) -> tuple[list[int], list[int]]:
    """(ids, mask) of one Alpaca record; mask[t] = 1 where token t is a loss target (the response)."""
    if tok.chat_template:
        return _own_template_example(tok, user_text(instruction, inp), output.strip(), system)
    prompt = chat_prompt(tok, user_text(instruction, inp), system)
    response = [*tok.encode(output.strip()), tok.end_id, tok.eos_id]
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def _own_template_example(tok: TokenizerBase, user: str, output: str, system: str | None
                          ) -> tuple[list[int], list[int]]:
    messages = _messages(user, system)
    prompt_text = tok.apply_chat_template(messages, add_generation_prompt=True)
    full_text = tok.apply_chat_template(messages + [{"role": "assistant", "content": output}])
    if not full_text.startswith(prompt_text):  # then no cut separates the prompt from the answer
        raise DataError(f"tokenizer {tok.path}: its chat template does not write the answer after the "
                        f"generation prompt; the prompt cannot be masked")
    prompt, response = tok.encode(prompt_text), tok.encode(full_text[len(prompt_text):])
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def alpaca_records(rows: Iterable[Mapping[str, Any]], fields: Mapping[str, str] | None = None
                   ) -> Iterator[dict[str, str]]:
    """Normalise rows to {instruction, input, output}; a missing column is an error, a missing input is ''."""
    fields = {**ALPACA_FIELDS, **(fields or {})}
    for n, row in enumerate(rows):
        for role in ("instruction", "output"):
            if fields[role] not in row:
                raise DataError(f"instruction data: record {n} has no field '{fields[role]}' "
                                f"(fields: {sorted(row)})")
        yield {"instruction": str(row[fields["instruction"]] or ""),
               "input": str(row.get(fields["input"]) or ""),
               "output": str(row[fields["output"]] or "")}


def pack_examples(examples: Iterable[tuple[list[int], list[int]]], max_tokens: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Concatenate (ids, mask) pairs -> (tokens, mask, offsets [n+1], dropped); examples longer than
    max_tokens are dropped (cutting them would cut the response, the only part with loss)."""
    toks, masks, offsets, dropped = [], [], [0], 0
    for ids, mask in examples:
        if max_tokens and len(ids) > max_tokens:
            dropped += 1
            continue
        toks.append(np.asarray(ids, dtype=np.int64))
        masks.append(np.asarray(mask, dtype=np.uint8))
        offsets.append(offsets[-1] + len(ids))
    if not toks:
        raise DataError("no instruction examples left (empty input, or all longer than max_tokens)")
    return np.concatenate(toks), np.concatenate(masks), np.asarray(offsets, dtype=np.int64), dropped

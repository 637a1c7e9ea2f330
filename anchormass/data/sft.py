"""Chat SFT data: ONE chat template with role markers, Alpaca records, response-only loss masks.

Template (ids; role markers are single reserved tokens, see tokenizer.py):

    <s> [<|system|> system <|end|>] <|user|> instruction [\\n\\n input] <|end|> <|assistant|> output <|end|> </s>

Loss is taken on the response only: the output tokens, its closing <|end|> and the final </s>
(so the model learns to stop). `chat_prompt` gives the prompt part for generation (evaluation).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from anchormass.data.tokenizer import Tokenizer
from anchormass.errors import DataError

ALPACA_FIELDS = {"instruction": "instruction", "input": "input", "output": "output"}


def user_text(instruction: str, inp: str | None) -> str:
    return instruction.strip() + (f"\n\n{inp.strip()}" if inp and inp.strip() else "")


def chat_prompt(tok: Tokenizer, user: str, system: str | None = None) -> list[int]:
    """<s> [system turn] <|user|> user <|end|> <|assistant|>: generation continues from here."""
    ids = [tok.bos_id]
    if system:
        ids += [tok.system_id, *tok.encode(system), tok.end_id]
    return ids + [tok.user_id, *tok.encode(user), tok.end_id, tok.assistant_id]


def render_example(tok: Tokenizer, instruction: str, inp: str | None, output: str,
                   system: str | None = None) -> tuple[list[int], list[int]]:
    """(ids, mask) of one Alpaca record; mask[t] = 1 where token t is a loss target (the response)."""
    prompt = chat_prompt(tok, user_text(instruction, inp), system)
    response = [*tok.encode(output.strip()), tok.end_id, tok.eos_id]
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

"""The embedded demo corpus (`data=demo`): SYNTHETIC English text from a small grammar.

Deterministic (one `random.Random(seed)`), generated offline in about a second. Built so a tiny
model learns something measurable in a few CPU minutes and long-context evaluation has signal:
- narrative filler from a small grammar (local structure a tiny model picks up quickly);
- facts stated in the text (the code of a coloured object, a person's room, a person's count of
  things), each asked about later in the same document ("Question: What is the code of the red
  box? Answer: The code of the red box is 4821."), at
  distances from a few sentences to thousands of tokens;
- one passkey per document at most, in the phrasing of the classic needle test, and the classic
  filler sentences ("The grass is green. ...") now and then, so the demo tokenizer covers the
  passkey suite's words;
- the answer is only predictable from the earlier statement, so answer accuracy / loss on
  answer tokens measures recall, and it improves with the context the model can use.
`demo_instructions` makes a small Alpaca-format instruction set from the same world (chat SFT).
"""

from __future__ import annotations

import random
from typing import Iterator

NAMES = ("Alice", "Bob", "Carol", "Dan", "Emma", "Frank", "Grace", "Hugo", "Iris", "Jack", "Kate", "Leo",
         "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tina", "Victor")
OBJECTS = ("box", "door", "lamp", "book", "key", "boat", "cup", "chair", "bag", "clock", "coin", "map")
COLORS = ("red", "blue", "green", "yellow", "white", "black", "brown", "pink", "gray", "orange")
PLACES = ("garden", "kitchen", "market", "river", "forest", "school", "station", "library", "park", "harbor")
VERBS = ("found", "moved", "painted", "cleaned", "opened", "carried", "sold", "bought", "washed", "dropped")
ADJS = ("small", "large", "old", "new", "quiet", "bright", "heavy", "soft")
THINGS = ("apples", "stamps", "shells", "pencils", "marbles", "tickets")
TIMES = ("in the morning", "at noon", "in the evening", "at night", "on Monday", "on Friday", "after lunch")
WEATHER = ("cold", "warm", "windy", "rainy", "sunny", "quiet")
CLASSIC_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",)
COUNT_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


class _Fact:
    """One fact: the sentence that states it, the question about it, its answer (the value) and
    the reply: the fact restated, ending in the value. Restating lets a small model answer by
    copying what followed the same words earlier (an induction pattern it learns within minutes);
    pure key -> value binding from "Answer:" alone takes far longer to emerge."""

    def __init__(self, statement: str, question: str, answer: str, reply: str | None = None):
        self.statement, self.question, self.answer = statement, question, answer
        self.reply = reply or statement


def _new_fact(rng: random.Random, used: set) -> _Fact | None:
    for _ in range(20):
        kind = rng.randrange(4)
        if kind == 3:
            key = ("passkey",)
            code = f"{rng.randrange(1000, 10000)}"  # 4 digits, as the passkey suite asks
            fact = _Fact(f"The passkey is {code}. Remember it. {code} is the passkey.",
                         "What is the passkey?", code, f"The passkey is {code}.")
        elif kind == 0:
            key = (rng.choice(COLORS), rng.choice(OBJECTS))
            code = f"{rng.randrange(1000, 10000)}"
            fact = _Fact(f"The code of the {key[0]} {key[1]} is {code}.",
                         f"What is the code of the {key[0]} {key[1]}?", code)
        elif kind == 1:
            key = (rng.choice(NAMES), "room")
            room = f"{rng.randrange(100, 1000)}"
            fact = _Fact(f"{key[0]} lives in room {room}.", f"Which room does {key[0]} live in?", room)
        else:
            key = (rng.choice(NAMES), rng.choice(THINGS))
            n = f"{rng.randrange(2, 100)}"
            fact = _Fact(f"{key[0]} has {n} {key[1]}.", f"How many {key[1]} does {key[0]} have?", n)
        if key not in used:  # one value per key within a document, or the answer is ambiguous
            used.add(key)
            return fact
    return None


def _filler(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 6:
        # a random digit string said twice: the plainest copy task, where a small model first
        # learns the induction pattern it then uses to answer the questions
        digits = " ".join(str(rng.randrange(10)) for _ in range(rng.randrange(5, 10)))
        return f"The list is {digits}. Again, the list is {digits}."
    if kind == 5:
        return rng.choice(CLASSIC_FILLER)
    if kind == 0:
        return (f"{rng.choice(NAMES)} {rng.choice(VERBS)} a {rng.choice(ADJS)} {rng.choice(COLORS)} "
                f"{rng.choice(OBJECTS)} in the {rng.choice(PLACES)}.")
    if kind == 1:
        a, b = rng.sample(NAMES, 2)
        return f"{a} walked to the {rng.choice(PLACES)} with {b} {rng.choice(TIMES)}."
    if kind == 2:
        return f"The weather was {rng.choice(WEATHER)} {rng.choice(TIMES)}."
    if kind == 3:
        start = rng.randrange(0, 6)
        return f"{rng.choice(NAMES)} counted: {', '.join(COUNT_WORDS[start:start + 4])}."
    return f"The {rng.choice(COLORS)} {rng.choice(OBJECTS)} was {rng.choice(ADJS)} and {rng.choice(ADJS)}."


def demo_document(rng: random.Random, n_sentences: int) -> str:
    """Paragraphs of filler; new facts now and then; questions about earlier facts (recent or old)."""
    facts: list[_Fact] = []
    used: set = set()
    paragraphs, sentences = [], 0
    while sentences < n_sentences:
        para = []
        for _ in range(rng.randrange(4, 9)):
            r = rng.random()
            if r < 0.12 or not facts:
                fact = _new_fact(rng, used)
                if fact:
                    facts.append(fact)
                    para.append(fact.statement)
                    continue
            if r < 0.32 and facts:
                # most questions ask about one of the last two facts (frequent short-range copies
                # teach a small model to retrieve), the rest about any earlier one (long range)
                fact = rng.choice(facts[-2:]) if rng.random() < 0.7 else rng.choice(facts)
                para.append(f"Question: {fact.question} Answer: {fact.reply}")
                continue
            para.append(_filler(rng))
        paragraphs.append(" ".join(para))
        sentences += len(para)
    return "\n".join(paragraphs)


def copy_document(rng: random.Random) -> str:
    """A list of random words said twice: every token of the repeat is predictable only by finding
    the same words earlier (the induction pattern retrieval is built from), at a distance that
    varies from document to document."""
    words = [rng.choice(_COPY_WORDS) for _ in range(rng.randrange(6, 30))]
    text = " ".join(words)
    return f"The list is {text}. Again, the list is {text}."


def code_copy_document(rng: random.Random) -> str:
    """A random digit code said twice. Digits are single tokens, so copying the code in order
    needs the two-token match the passkey answer needs (keys repeat digits: 4841)."""
    code = "".join(str(rng.randrange(10)) for _ in range(rng.randrange(4, 9)))
    return f"The code is {code}. Again, the code is {code}."


def passkey_document(rng: random.Random, max_sentences: int = 6) -> str:
    """A short passkey haystack laid out as the passkey suite builds its prompts: pieces joined in
    token space, which in text is a double space after the needle and between filler groups, and
    the needle at any word of the filler. The answer restates the needle."""
    code = f"{rng.randrange(1000, 10000)}"
    classic = rng.random() < 0.6
    sentences = [CLASSIC_FILLER[0] if classic and rng.random() < 0.8 else _filler(rng)
                 for _ in range(rng.randrange(0, max_sentences + 1))]
    words = "  ".join(sentences).split(" ") if sentences else []
    at = rng.randrange(len(words) + 1)
    before, after = " ".join(words[:at]), " ".join(words[at:]).lstrip(" ")
    text = (before + " " if before else "") + f"The passkey is {code}. Remember it. {code} is the passkey."
    text += ("  " + after if after else "") + ("  " if rng.random() < 0.5 else " ")
    return text + f"Question: What is the passkey? Answer: The passkey is {code}."


_COPY_WORDS = tuple(w for group in (NAMES, OBJECTS, COLORS, PLACES, VERBS, ADJS, THINGS, WEATHER) for w in group)


def _recall_document(rng: random.Random, passkey_sentences: int) -> str:
    r = rng.random()
    if r < 0.25:
        return copy_document(rng)
    if r < 0.5:
        return code_copy_document(rng)
    return passkey_document(rng, passkey_sentences)


def demo_documents(n_docs: int = 340, seed: int = 42, min_sentences: int = 150,
                   max_sentences: int = 700, recall_docs: float = 0.0, recall_per_doc: int = 40,
                   passkey_sentences: int = 6) -> Iterator[str]:
    """`n_docs` grammar documents; with `recall_docs` > 0, that fraction of them is instead a run of
    `recall_per_doc` short retrieval documents (a quarter word lists and a quarter digit codes,
    each said twice, half passkey haystacks of up to `passkey_sentences` filler sentences), joined
    by blank lines: retrieval-dense text (docs/method.md §6 h)."""
    rng = random.Random(seed)
    for _ in range(n_docs):
        if recall_docs and rng.random() < recall_docs:
            yield "\n\n".join(_recall_document(rng, passkey_sentences) for _ in range(recall_per_doc))
            continue
        yield demo_document(rng, rng.randrange(min_sentences, max_sentences + 1))


# ------------------------------------------------------------------ instruction set (chat SFT)
def _instruction(rng: random.Random) -> dict[str, str]:
    kind = rng.randrange(5)
    if kind == 0:
        used: set = set()
        facts = [f for f in (_new_fact(rng, used) for _ in range(rng.randrange(2, 6))) if f]
        fact = rng.choice(facts)
        return {"instruction": fact.question, "input": " ".join(f.statement for f in facts),
                "output": fact.reply}
    if kind == 1:
        a, b = rng.randrange(0, 50), rng.randrange(0, 50)
        return {"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a} plus {b} is {a + b}."}
    if kind == 2:
        sentence = _filler(rng)
        return {"instruction": "Repeat the sentence.", "input": sentence, "output": sentence}
    if kind == 3:
        names = rng.sample(NAMES, rng.randrange(2, 7))
        return {"instruction": "How many names are in the list?", "input": ", ".join(names),
                "output": f"There are {len(names)} names."}
    words = rng.sample(COLORS, rng.randrange(2, 6))
    return {"instruction": "Write the words in reverse order.", "input": ", ".join(words),
            "output": ", ".join(reversed(words)) + "."}


def demo_instructions(n: int = 2_000, seed: int = 42) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [_instruction(rng) for _ in range(n)]

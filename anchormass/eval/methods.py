"""What the equal-memory comparisons share (baselines, recall_frontier; docs/method.md §3, §6 f, h):
a method (model + cache setting), the Standard token budget matched to a stored-bytes target, and
the prefill chunk a session uses."""

from __future__ import annotations

from dataclasses import dataclass

from anchormass.cache.kv_policies import KVPolicy
from anchormass.errors import ConfigError
from anchormass.eval.suite import EvalModel


@dataclass
class Method:
    """One column of the comparison: a model plus a cache setting (and, on the recall frontier, the
    budget level it belongs to: "full" or the AnchorMass slot budget as text)."""

    name: str  # baselines: "anchormass" | "full" | a kv policy; frontier: "<arch>/<policy or full>"
    model: EvalModel
    policy: object = None
    budget: int | None = None
    level: str = "full"


def matched_budget(policy: KVPolicy, target_tokens: float, fed: int) -> tuple[int, str | None]:
    """The per-head token budget whose stored tokens after the last one fed equal `target_tokens`,
    and why it cannot be reached (None when it can): a bounded policy keeps its budget; an
    unbounded one (SnapKV) keeps its budget of the prompt plus every token fed after it."""
    want = round(target_tokens) - (0 if policy.bounded else fed)
    last = f"the matched budget would be {want} tokens"
    for budget in range(max(1, want), max(1, want) + 100_000):
        try:
            policy.bind(budget)
        except ConfigError as err:
            last = str(err)
            continue
        return budget, None if budget == want else f"budget raised to {budget}: {last}"
    raise ConfigError(f"baselines: no valid budget for {policy.name} near {want}")


def prefill_chunk(chunk, m: EvalModel) -> int:
    """The configured prefill chunk (`chunk`; unset or 0: the model's own prefill_chunk)."""
    return int(chunk) if chunk else m.config.prefill_chunk

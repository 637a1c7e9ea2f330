"""`score_merge` (docs/method.md §2.6): `adaptive` without recent-window protection: every slot is a candidate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from anchormass.cache.slot_policies.adaptive import AdaptiveMerge


@dataclass
class ScoreMerge(AdaptiveMerge):
    name: ClassVar[str] = "score_merge"
    protects_recent: ClassVar[bool] = False

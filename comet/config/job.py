"""The training job: how many tokens the run must process (for time-to-train)."""

from __future__ import annotations

from dataclasses import dataclass, field

from comet.config.loader import positive


@dataclass(frozen=True)
class JobSpec:
    total_tokens: float = field(default=300e9, metadata=positive())   # GPT-3 was trained on 300B tokens

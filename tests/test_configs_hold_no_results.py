"""Configs hold settings and one-line reasons; measured results live under docs/results/. A recipe
that doubled as a lab notebook (`retrieved 15/15, 14/15 and 11/15`) went stale the day a rerun
changed a figure, so a count-of-trials result like "11/15" anywhere in configs/ is refused."""

from __future__ import annotations

import re
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# "<digits>/<digits>" standing alone: "11/15". Not part of a longer path or number (`${runs}/0/1`,
# `data/2k/3`, `2026/12/04`, `0.85/2.0`, `512/1K`, `1,024/2,048`), which a neighbouring word character,
# slash, dot, comma, `$`, `{` or `-` gives away, nor a list of lengths spaced out as `512 / 1,024`.
RESULT = re.compile(r"(?<![\w$./{},-])\d+/\d+(?![\w/.])")


def results_in(text: str) -> list[str]:
    return [m.group(0) for m in RESULT.finditer(text)]


def test_no_config_holds_a_measured_result():
    found = [f"{path.relative_to(CONFIGS.parent)}:{n}: {line.strip()}"
             for path in sorted(CONFIGS.rglob("*.yaml"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if results_in(line)]
    assert not found, "move measured results to docs/results/<study>/README.md:\n" + "\n".join(found)


def test_the_pattern_catches_results_and_passes_settings():
    planted = ("# with 140 steps it retrieved 15/15, 14/15 and 11/15 at 512 / 1,024 / 2,048\n"
               "report_note: recall (0/15) at g8\n")
    assert results_in(planted) == ["15/15", "14/15", "11/15", "0/15"]
    settings = ("out_dir: ${runs_root}/0/1\nwhen: 2026/12/04\nthresholds: 0.85/2.0\nat: 1,024/2,048\n"
                "# Lengths shrink 8K/16K/32K -> 512/1K/2K\nlr: 1/sqrt(d)\npath: data/seed0/12\n")
    assert results_in(settings) == []


def _recipe(curriculum: str, *overrides: str):
    from hydra import compose, initialize_config_dir

    from anchormass.curriculum.recipe import load_recipe

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("run_curriculum", overrides=[f"curriculum={curriculum}", *overrides]).curriculum
    return load_recipe(cfg, with_evaluate=False)


def test_the_miniature_report_opens_with_the_finding_kept_beside_its_results(tmp_path):
    import pytest

    from anchormass.errors import ConfigError

    note = (CONFIGS.parent / "docs/results/retrofit/report_note.md").read_text(encoding="utf-8")
    assert _recipe("mini").report_note == note and note.startswith("The retrofit study")
    assert _recipe("recall_study").report_note is None and _recipe("retrofit").report_note is None
    assert _recipe("mini", "curriculum.report_note='in words'").report_note == "in words"  # text comes first
    (tmp_path / "note.md").write_text("elsewhere\n")
    assert _recipe("mini", f"curriculum.report_note_file={tmp_path / 'note.md'}").report_note == "elsewhere\n"
    with pytest.raises(ConfigError, match="report_note_file docs/none.md is not a file"):
        _recipe("mini", "curriculum.report_note_file=docs/none.md")

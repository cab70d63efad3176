"""The frontier a stage 2 must beat, against one made by hand."""

from __future__ import annotations

import sys

import pytest

from trainer.commands.frontier import Curve, Point, frontier_at, judge, meaning_line, plot, summary_line, verdict_line

# The stage-1 generator: nll_test is lowest at temperature 1, so the branch above 1 (worse
# quality) and the branch below 1 both span 7.8..8.0; the continued one is better where it is.
STAGE1 = Curve("stage 1", (Point(1.2, 8.0, 10.0), Point(1.0, 7.8, 9.6), Point(0.8, 8.0, 9.1), Point(0.6, 8.4, 8.5)))
CONTINUED = Curve("maximum likelihood", (Point(1.0, 7.7, 9.5), Point(0.8, 7.9, 9.0)))
CURVES = [STAGE1, CONTINUED]


def test_the_frontier_is_the_best_segment_spanning_a_value():
    # At 7.9: stage 1's upper branch 9.8, its lower 9.35, the continued curve's end 9.0.
    assert frontier_at(CURVES, 7.9) == pytest.approx(9.0)
    assert frontier_at([STAGE1], 7.9) == pytest.approx(9.35)
    assert frontier_at(CURVES, 8.2) == pytest.approx(8.8)  # half way from 0.8 to 0.6
    assert frontier_at(CURVES, 7.75) == pytest.approx(9.375)  # the continued curve alone
    assert frontier_at(CURVES, 7.6) is None and frontier_at(CURVES, 8.5) is None


@pytest.mark.parametrize(
    ("diversity", "quality", "frontier", "beyond"),
    [
        (7.9, 8.99, 9.0, True),  # just inside
        (7.9, 9.01, 9.0, False),  # just outside
        (8.2, 8.79, 8.8, True),
        (8.2, 8.8, 8.8, False),  # on it is not beyond
        (7.6, 5.0, None, False),  # outside the range, however good
        (8.41, 5.0, None, False),
    ],
)
def test_judge(diversity, quality, frontier, beyond):
    verdict = judge(CURVES, Point(1.0, diversity, quality))
    assert verdict.beyond is beyond
    assert verdict.frontier == (None if frontier is None else pytest.approx(frontier))


def test_higher_is_better_quality():
    bleu = Curve("stage 1", (Point(1.0, 0.2, 0.30), Point(0.8, 0.4, 0.50)))
    assert judge([bleu], Point(1.0, 0.3, 0.41), higher_is_better=True).beyond
    assert not judge([bleu], Point(1.0, 0.3, 0.39), higher_is_better=True).beyond


def test_lines_and_plot(tmp_path):
    verdicts = [judge(CURVES, Point(1.0, 7.9, 8.99)), judge(CURVES, Point(1.0, 7.6, 5.0))]
    assert verdict_line(verdicts[0], "nll_oracle", "nll_test") == (
        "frontier: stage 2 nll_oracle 8.9900 at nll_test 7.9000; frontier at 7.9000: 9.0000; beyond: yes"
    )
    assert verdict_line(verdicts[1], "nll_oracle", "nll_test").endswith("outside its range; beyond: no")
    assert summary_line(verdicts) == "beyond the frontier: 1 of 2 seeds"
    # what it means for whoever ran the job, in one sentence, and where the figures are
    page = 'docs/results/oracle.md, "Stage-2 objectives against the frontier"'
    said = meaning_line(verdicts, "nll_oracle", "nll_test", page)
    assert said.startswith("what this means: 1 of 2 seeds' stage 2 reached better nll_oracle at its own nll_test")
    assert said.endswith(f"does not pay reliably; the figures and what was tried: {page}") and said.count(". ") == 0
    assert "no seed's stage 2" in meaning_line(verdicts[1:], "nll_oracle", "nll_test", page)
    assert "here stage 2 paid" in meaning_line(verdicts[:1], "nll_oracle", "nll_test", page)
    path = plot(CURVES, {"seed 0": verdicts[0].point}, "nll_oracle", "nll_test", tmp_path / "frontier.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"


def test_no_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    assert plot(CURVES, {}, "nll_oracle", "nll_test", tmp_path / "frontier.png") is None
    assert not (tmp_path / "frontier.png").exists()

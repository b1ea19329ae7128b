"""The visual study's findings sentences on constructed analyses: each claim only when the numbers carry it."""

from __future__ import annotations

from plelab.sweeps import stats
from plelab.visual.report import findings


def _analysis(label: str, visual_verdicts: list[list[str]], ci=(-0.05, 0.02)) -> dict:
    comp = {"b": "dct-kmeans", "mean": -0.01, "ci_low": ci[0], "ci_high": ci[1], "n": 3, "label": label}
    table = {"method": "dct-kmeans", "table": "visual", "verdicts": visual_verdicts, "use": "", "structure": "",
             "erank_centred": 15.0, "erank_centred_null": 15.3, "dim": 16, "grad_row": float("nan"),
             "permute_content": (0.4, 0.1)}
    return {"rows": [{"method": "none", "nmi": None}, {"method": "dct-kmeans", "nmi": 0.5}],
            "caption_vs_none": [comp], "content_vs_none": [comp], "tables": [table]}


def test_a_significant_rise_is_not_called_an_improvement():
    text = " ".join(findings(_analysis(stats.RISE, [["LEARNED", "USED"]] * 3)))
    assert "improves significantly (family-adjusted) for none of them" in text
    text = " ".join(findings(_analysis(stats.DROP, [["LEARNED", "USED"]] * 3)))
    assert "improves significantly (family-adjusted) for dct-kmeans" in text


def test_reliance_sentence_needs_every_seed_used():
    mixed = [["LEARNED", "USED"], ["LEARNED", "UNUSED"], ["LEARNED", "UNUSED"]]
    assert "reliance is not benefit" not in " ".join(findings(_analysis(stats.INCONCLUSIVE, mixed)))
    assert "reliance is not benefit" in " ".join(findings(_analysis(stats.INCONCLUSIVE, [["LEARNED", "USED"]] * 3)))


def test_dead_table_claim_needs_the_verdicts():
    undecided = [["UNDECIDED", "UNDECIDED"]] * 3
    assert "is undecided" in " ".join(findings(_analysis(stats.INCONCLUSIVE, undecided)))
    dead = [["NOT DISTINGUISHABLE FROM NULL", "UNUSED"]] * 3
    assert "— reproduces here" in " ".join(findings(_analysis(stats.EQUIVALENT, dead)))
    assert "does not reproduce" in " ".join(findings(_analysis(stats.INCONCLUSIVE, [["LEARNED", "UNUSED"]] * 3)))

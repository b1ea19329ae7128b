"""The visual study's findings sentences on constructed analyses: each claim only when the numbers carry it, and
the positive control gating the study."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from plelab import stats
from plelab.sweeps.spec import SweepSpec
from plelab.visual.report import findings
from plelab.visual.study import positive_control, table_use


def _analysis(label: str, visual_verdicts: list[list[str]], ci=(-0.05, 0.02), use_label=stats.INCONCLUSIVE,
              gate="ungated") -> dict:
    comp = {"b": "dct-kmeans", "mean": -0.01, "ci_low": ci[0], "ci_high": ci[1], "n": 3, "label": label}
    table = {"method": "dct-kmeans", "table": "visual", "verdicts": visual_verdicts, "use": "", "structure": "",
             "structure_pairs": [visual_verdicts[0][0]], "erank_centred": 15.0, "erank_centred_null": 15.3,
             "dim": 16, "grad_row": float("nan"), "permute_content": (0.4, 0.1)}
    use = {"a": "rows in place", "b": "dct-kmeans", "mean": 0.0, "ci_low": -0.001, "ci_high": 0.001, "n": 3,
           "label": use_label}
    gate_cmp = {"a": "random", "b": "oracle", "mean": -0.001, "ci_low": -0.01, "ci_high": 0.008, "n": 3,
                "label": stats.INCONCLUSIVE}
    return {"rows": [{"method": "none", "nmi": None}, {"method": "dct-kmeans", "nmi": 0.5}],
            "caption_vs_none": [comp], "content_vs_none": [comp], "tables": [table], "table_use": [use],
            "gate": {"status": gate, "comparison": None if gate == "ungated" else gate_cmp}}


def test_a_significant_rise_is_not_called_an_improvement():
    text = " ".join(findings(_analysis(stats.RISE, [["LEARNED", "USED"]] * 3)))
    assert "improves significantly (family-adjusted) for none of them" in text
    text = " ".join(findings(_analysis(stats.DROP, [["LEARNED", "USED"]] * 3)))
    assert "improves significantly (family-adjusted) for dct-kmeans" in text


def test_reliance_sentence_needs_every_seed_used():
    mixed = [["LEARNED", "USED"], ["LEARNED", "UNUSED"], ["LEARNED", "UNUSED"]]
    assert "reliance is not benefit" not in " ".join(findings(_analysis(stats.INCONCLUSIVE, mixed)))
    assert "reliance is not benefit" in " ".join(findings(_analysis(stats.INCONCLUSIVE, [["LEARNED", "USED"]] * 3)))


def test_dead_table_claim_comes_from_the_across_seed_test_and_counts_independent_runs():
    dead = [["NOT DISTINGUISHABLE FROM NULL", "UNUSED"]] * 3
    assert "reproduces (every table shown unread" in " ".join(findings(_analysis(stats.EQUIVALENT, dead,
                                                                                 use_label=stats.EQUIVALENT)))
    text = " ".join(findings(_analysis(stats.INCONCLUSIVE, [["LEARNED", "USED"]] * 3, use_label=stats.RISE)))
    assert "does not reproduce for dct-kmeans" in text
    assert "USED in 3/3 runs and LEARNED in 1/1 disjoint seed pairs" in text  # three cyclic pairs: one independent
    one_of_nine = [["NOT DISTINGUISHABLE FROM NULL", "UNUSED"]] * 8 + [["LEARNED", "USED"]]
    text = " ".join(findings(_analysis(stats.INCONCLUSIVE, one_of_nine)))
    assert "is inconclusive at this number of seeds" in text and "does not reproduce" not in text


def test_one_run_of_nine_does_not_make_a_table_alive():
    """The across-seed use test: eight runs near zero and one USED run is not 'read'; nine clear runs are, and
    nine runs within ±0.001 of zero are shown unread (equivalent within ±DELTA_USE)."""
    rng = np.random.default_rng(0)
    near_zero = list(rng.normal(0, 0.0005, 8))

    def label(deltas):
        return table_use([{"method": "m", "table": "visual", "permute_caption_runs": deltas}], 0.05)[0].label
    assert label([*near_zero, 0.03]) == stats.INCONCLUSIVE
    assert label(list(rng.normal(0.05, 0.005, 9))) == stats.RISE
    assert label(list(rng.normal(0, 0.0005, 9))) == stats.EQUIVALENT


def _study(oracle_gain: float) -> SimpleNamespace:
    """A constructed 6-seed study: content-word losses with a shared seed effect; the oracle is ``oracle_gain``
    nats below random."""
    rng = np.random.default_rng(1)
    seed_effect = rng.normal(0, 0.2, 6)

    def arm(mu):
        return {s: SimpleNamespace(loss=mu, visual={"content": mu + seed_effect[s] + rng.normal(0, 0.003)})
                for s in range(6)}
    return SimpleNamespace(runs={"none": arm(1.0), "random": arm(1.0), "oracle": arm(1.0 - oracle_gain)},
                           spec=SweepSpec(preset="cpu-tiny", seeds=list(range(6)), baseline="none"))


def test_the_positive_control_gates_the_study():
    passed = positive_control(_study(0.2))
    assert passed["status"] == "informative" and passed["comparison"]["label"] == stats.DROP
    failed = positive_control(_study(0.0))  # the oracle no better than random IDs
    assert failed["status"] == "uninformative" and failed["comparison"]["b"] == "oracle"
    small = positive_control(_study(0.008))  # real but smaller than δ = 0.02: the study cannot see a δ-sized gain
    assert small["status"] == "uninformative" and small["comparison"]["label"] == stats.SMALL_DROP
    no_random = _study(0.2)
    no_random.runs.pop("random")
    assert positive_control(no_random) == {"status": "ungated", "comparison": None}
    text = findings({**_analysis(stats.INCONCLUSIVE, [["NOT DISTINGUISHABLE FROM NULL", "UNUSED"]] * 3,
                                 use_label=stats.EQUIVALENT), "gate": failed})
    assert text[0].startswith("**UNINFORMATIVE**") and "visual.feature_noise" in text[0]
    # an uninformative study cannot claim the seed's dead table, nor that no tokenizer helps
    assert "cannot be judged here" in text[-1] and "which says nothing here" in text[-1]
    assert findings(_analysis(stats.INCONCLUSIVE, [["LEARNED", "USED"]] * 3))[0].startswith("**Ungated**")

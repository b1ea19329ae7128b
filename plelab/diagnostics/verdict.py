"""The early verdict on two axes, with the reasons in numbers.

STRUCTURE — has the table learned something that is not initialisation noise?
  The raw metrics of W_t cannot say: a Gaussian N×d table with N ≫ d already has erank ≈ d
  and mean cosine ≈ 0, and so may a well-trained one. The evidence is the change since
  initialisation, Δ = W_t − αW_0, compared across seeds: learned structure replicates, init
  and gradient noise do not. We use linear CKA between two seeds' Δ on the rows both runs
  used, after removing what row frequency alone explains (rows of frequent ids move more in
  every run, information or not) and normalising rows:
    LEARNED                     CKA > null_mean + 4·null_sd  and  CKA ≥ CKA_MIN
    NOT DISTINGUISHABLE ...     CKA ≤ null_mean + 2·null_sd  or   CKA < CKA_FLOOR
    UNDECIDED                   otherwise, or with no second seed
  The null is the CKA with one seed's rows permuted among rows of similar frequency (20 draws),
  after each column was regressed on a degree-4 polynomial in log-frequency: what frequency
  explains smoothly is removed, what it explains row by row survives the shuffle. A shared
  frequency-only component that is not smooth in log-frequency (e.g. √f with a heavy-tailed f)
  can still pass this test; the matched null-run pair is the full control for it. A matched
  null run (``ple.ids=iid``: same recipe, ids drawn i.i.d. from the real frequencies) checked
  the thresholds: its two seeds must come out NOT DISTINGUISHABLE
  (``tests/test_diagnostics_verdict.py``). With a null-run pair (``--null`` and
  ``--null-reference``), a real table must also exceed the pair's CKA by CKA_MARGIN.

USE — does the model rely on the table?
  Paired validation-loss change when rows are permuted among rows of similar frequency
  (``usage.py``), with its standard error across windows:
    USED      delta − 4·se > 0  and  delta ≥ DELTA_USE
    UNUSED    delta + 2·se < DELTA_USE
    UNDECIDED otherwise
  DELTA_USE = 0.005 nats is a declared smallest effect of interest: one fifth of the seed's
  dP=256 gain (0.023 nats), about the resolution of a few hundred validation windows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

LEARNED, NOT_DIST, UNDECIDED = "LEARNED", "NOT DISTINGUISHABLE FROM NULL", "UNDECIDED"
USED, UNUSED = "USED", "UNUSED"

CKA_MIN = 0.10  # an agreement this weak is not "learned" even if above a tiny null
CKA_FLOOR = 0.03  # below this the two seeds' changes share essentially nothing
CKA_MARGIN = 0.05  # by how much a real table must exceed a matched null run's agreement
DELTA_USE = 0.005  # nats


@dataclass
class Verdict:
    structure: str
    use: str
    reasons: list[str]

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"{'; '.join(self.reasons)} → {self.structure}, {self.use}"


def structure_verdict(cka: float | None, null_mean: float | None, null_sd: float | None,
                      null_run_cka: float | None = None) -> tuple[str, str]:
    if cka is None or null_mean is None:
        return UNDECIDED, ("no second seed's Δ to compare with (give a reference run of another seed): W_t alone "
                           "cannot tell")
    hi, lo = null_mean + 4 * null_sd, null_mean + 2 * null_sd
    reason = f"cross-seed CKA of Δ {cka:.3f} vs permutation null {null_mean:.3f}±{null_sd:.3f}"
    if null_run_cka is not None:
        reason += f", matched null-run pair {null_run_cka:.3f}"
    else:
        reason += " (frequency-only agreement excluded up to a smooth function of log-frequency; "\
                  "a null-control pair of runs controls it fully)"
    beats_null_run = null_run_cka is None or cka > null_run_cka + CKA_MARGIN
    if cka > hi and cka >= CKA_MIN and beats_null_run:
        return LEARNED, reason
    if cka <= lo or cka < CKA_FLOOR or (null_run_cka is not None and cka <= null_run_cka):
        return NOT_DIST, reason
    return UNDECIDED, reason


def use_verdict(delta: float | None, se: float | None, kind: str = "permute") -> tuple[str, str]:
    if delta is None:
        return UNDECIDED, "use test not run (turned off, or no model and validation windows to run it with)"
    reason = f"{kind} rows costs {delta:+.4f}±{se:.4f} nats"
    if delta - 4 * se > 0 and delta >= DELTA_USE:
        return USED, reason
    if delta + 2 * se < DELTA_USE:
        return UNUSED, reason
    return UNDECIDED, reason


def verdict(cka=None, null_mean=None, null_sd=None, null_run_cka=None, delta=None, se=None,
            extra: list[str] | None = None) -> Verdict:
    s, s_reason = structure_verdict(cka, null_mean, null_sd, null_run_cka)
    u, u_reason = use_verdict(delta, se)
    return Verdict(structure=s, use=u, reasons=[s_reason, u_reason, *(extra or [])])

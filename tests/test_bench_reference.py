"""Bai et al.'s own cells (`fedjax_dg.bench.reference`): the packaged transcription of their
Tables 8-11 against values read off the paper, Welch's test from summary statistics against
its closed form, and the remark readings on small hand-made tables whose answers are known."""
import math

import pytest
from scipy import stats as sps

from fedjax_dg.bench import reference


@pytest.fixture(scope="module")
def cells():
  return reference.bai_cells()


def test_the_transcription_holds_the_papers_tables(cells):
  ds = cells["datasets"]
  assert list(ds) == ["PACS", "IWildCam", "CelebA", "Camelyon17", "CivilComments", "Py150", "FEMNIST"]
  assert {d: v["table"] for d, v in ds.items()} == {"PACS": 8, "IWildCam": 8, "CelebA": 9, "Camelyon17": 9,
                                                   "CivilComments": 10, "Py150": 10, "FEMNIST": 11}
  # 14 methods on the image datasets; the text datasets have no Mixup, FedDG, FedADG.
  for d in ("PACS", "IWildCam", "CelebA", "Camelyon17", "FEMNIST"):
    assert len(ds[d]["methods"]) == 14, d
  for d in ("CivilComments", "Py150"):
    assert set(ds[d]["methods"]) == set(ds["PACS"]["methods"]) - {"Mixup", "FedDG", "FedADG"}, d
  # values read off the paper (mean, std), one per table and a few famous ones
  read = {("PACS", "Fish", 2): [0.345, 0.107], ("PACS", "FedAvg-ERM", 0): [0.943, 0.012],
          ("IWildCam", "AFL", 3): [0.034, 0.001], ("CelebA", "FedProx", 3): [0.0, 0.0],
          ("CelebA", "Mixup", 0): [0.288, 0.498], ("Camelyon17", "Fish", 1): [0.881, 0.006],
          ("CivilComments", "MMD", 1): [0.634, 0.012], ("Py150", "GroupDRO", 0): [0.513, 0.001],
          ("FEMNIST", "DeepCoral", 3): [0.851, 0.003]}
  for (d, m, col), v in read.items():
    assert ds[d]["methods"][m][col] == v, (d, m, col)
  # "-": centralised cells of federated methods, and DG methods at lambda = 0 on PACS
  assert ds["PACS"]["methods"]["FedProx"][0] is None and ds["PACS"]["methods"]["IRM"][3] is None
  assert ds["FEMNIST"]["methods"]["IRM"][3] is not None  # FEMNIST prints lambda = 0 for DG methods


def test_welch_from_summary_statistics_is_its_closed_form():
  a, b, n = [0.6, 0.05], [0.5, 0.02], 3
  va, vb = a[1] ** 2 / n, b[1] ** 2 / n
  t = (a[0] - b[0]) / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (n - 1))
  assert reference.welch_p(a, b) == pytest.approx(2 * sps.t.sf(abs(t), df), rel=1e-10)
  rec = reference.welch_record(a, b)
  assert rec["diff"] == pytest.approx(0.1) and rec["se"] == pytest.approx(math.sqrt(va + vb))
  assert rec["df"] == pytest.approx(df, rel=1e-12)
  assert reference.compare(a, b) == ("better" if 2 * sps.t.sf(abs(t), df) < 0.05 else "inconclusive")
  # A printed 0.000 is a spread below half the last digit: taken as 0.0005, not as exact.
  se0 = math.sqrt(2 * 0.0005 ** 2 / n)
  rec = reference.welch_record([0.5, 0.0], [0.5, 0.0])
  assert rec["se"] == pytest.approx(se0) and rec["df"] == pytest.approx(2 * (n - 1))
  # Equal means, spread at most 0.0005: inside +-0.02 by the two one-sided tests.
  assert max(sps.t.sf(0.02 / se0, 4), sps.t.cdf(-0.02 / se0, 4)) < 0.05
  assert reference.compare([0.5, 0.0], [0.5, 0.0]) == "equivalent"
  assert reference.compare([0.4, 0.0], [0.5, 0.0]) == "worse"
  # 0.639 against 0.641, both printed with sd 0.000: a p from the floor's spread, not p = 0.
  assert reference.welch_p([0.639, 0.0], [0.641, 0.0]) == pytest.approx(2 * sps.t.sf(0.002 / se0, 4), rel=1e-6)
  assert 0.0 < reference.welch_p([0.639, 0.0], [0.641, 0.0]) < 0.05


def _table(rows):
  return {"source": "test", "columns": ["C=1", "lam=1", "lam=0.1", "lam=0"],
          "datasets": {"D": {"table": 0, "methods": rows}}}


def _welch(a, b, n=3):
  va, vb = a[1] ** 2 / n, b[1] ** 2 / n
  se = math.sqrt(va + vb)
  return a[0] - b[0], se, (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (n - 1))


def test_remark_4_1_reads_their_columns_by_the_reports_rule():
  """Per column: against where a method is shown more than 0.02 above FedAvg-ERM (one-sided
  Welch, Holm within the column), supporting where every method is shown less than 0.02
  above it (one-sided at 0.05 each), else inconclusive; by hand with SciPy's t distribution."""
  base = [[0.5, 0.01]] * 4
  irm, fish = [[0.5, 0.01], [0.7, 0.01], [0.5, 0.01], None], [[0.49, 0.01]] * 3 + [None]
  t = _table({"FedAvg-ERM": base, "IRM": irm, "Fish": fish})
  for col in (0, 2):  # C=1 and lambda = 0.1: both methods shown below +0.02
    for m in (irm, fish):
      diff, se, df = _welch(m[col], base[col])
      assert sps.t.cdf((diff - 0.02) / se, df) < 0.05
  diff, se, df = _welch(irm[1], base[1])
  assert 2 * sps.t.sf((diff - 0.02) / se, df) < 0.05  # lambda = 1: IRM shown more than 0.02 above (Holm, m = 2)
  labels = {"supports": "supporting", "against": "against", "inconclusive": "inconclusive"}
  text = reference.remark_4_1(t, labels)
  assert text.startswith("On Bai et al.'s cells, by the same rule: does not hold (2 supporting, 1 against of 3 "
                         "testable); ")
  assert "significantly above it (Holm within the column) in 1 of 3: D [λ=1: IRM]." in text
  assert "highest mean in 2 of 3 columns" in text  # lambda = 1 has IRM above; lambda = 0 has no other method
  # IRM 0.03 above with a spread of 0.05: neither shown below nor above the margin.
  wide = _table({"FedAvg-ERM": base, "IRM": [[0.53, 0.05], [0.3, 0.01], [0.5, 0.01], None]})
  diff, se, df = _welch([0.53, 0.05], base[0])
  assert sps.t.cdf((diff - 0.02) / se, df) > 0.05 and sps.t.sf((diff - 0.02) / se, df) > 0.05
  text = reference.remark_4_1(wide, labels)
  assert "holds in part (2 supporting, 1 inconclusive of 3 testable)" in text and "in 0 of 3." in text


def test_remark_4_2_counts_the_drops_with_holm_over_the_remark():
  t = _table({"FedAvg-ERM": [[0.5, 0.01]] * 4,
              "IRM": [[0.9, 0.01], [0.5, 0.01], [0.5, 0.01], None],     # drops twice
              "Fish": [[0.5, 0.01], [0.5, 0.01], [0.9, 0.01], None]})   # equal, then rises
  # Holm over the four comparisons: the drops and the rise have p far below 0.05 / 4.
  assert 4 * reference.welch_p([0.9, 0.01], [0.5, 0.01]) < 0.05
  text = reference.remark_4_2_federated(t)
  assert "Holm over the remark): inconclusive (2 degrades, 1 improves, 1 inconclusive of 4 testable)" in text
  assert "D 2/4" in text
  t["datasets"]["D"]["methods"]["Fish"] = [[0.9, 0.01], [0.5, 0.01], [0.5, 0.01], None]
  assert "holds (4 degrades of 4 testable)" in reference.remark_4_2_federated(t)
  t["datasets"]["D"]["methods"]["Fish"] = [[0.5, 0.01], [0.9, 0.01], [0.9, 0.01], None]
  t["datasets"]["D"]["methods"]["IRM"] = [[0.5, 0.01], [0.9, 0.01], [0.9, 0.01], None]
  assert "does not hold (4 improves of 4 testable)" in reference.remark_4_2_federated(t)
  lam = reference.remark_4_2_lambda(_table({"IRM": [[0.9, 0.01], [0.8, 0.01], [0.5, 0.01], None]}))
  assert "holds (1 degrades of 1 testable)" in lam


def test_a_claim_on_cells_bai_et_al_did_not_run(cells):
  assert reference.claim(cells, "FedIIR") == "Bai et al. did not run FedIIR: their tables have no cell to compare with."
  assert reference.claim(cells, "FedProx").startswith("On Bai et al.'s cells (Holm over them): ")
  t = _table({"FedAvg-ERM": [[0.5, 0.01]] * 4, "X": [None, [0.6, 0.01], [0.6, 0.01], [0.5, 0.01]]})
  assert reference.claim(t, "X") == ("On Bai et al.'s cells (Holm over them): holds in part (2 better, 1 "
                                     "inconclusive of 3 testable).")


def test_every_claim_the_report_reads_names_its_paper_by_authors_and_title():
  from fedjax_dg import algorithms
  claims = {spec.claim for spec in algorithms.METHODS.values() if spec.claim}
  assert claims and claims <= set(reference.CLAIM_PAPERS)
  for short in claims:
    assert reference.CLAIM_PAPERS[short].count('"') == 2  # a quoted title
  assert reference.claim_paper("Guo et al. 2023").startswith('Guo, Guo, Cao, Wu and Chang, "Out-of-Distr')
  assert reference.claim_paper("Someone et al. 2020") == "Someone et al. 2020"


def test_every_work_the_report_names_is_in_its_reference_list():
  """The committed second edition's generated text names the tests it uses by their authors;
  its References section, generated too, holds each of them, Bai et al. and every claim paper.
  (Shi et al. and DomainBed, named by the Fish deviation line, are checked where that line is
  generated: tests/test_report3.py.)"""
  import os
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  text = open(os.path.join(root, "experiments", "report_fmnist", "REPORT.md"), encoding="utf-8").read()
  body, refs = text.split("\n## References\n", 1)
  refs = [l[2:] for l in refs.splitlines() if l.startswith("- ")]
  assert refs == reference.references()
  assert refs[0].startswith('Bai, Bagchi and Inouye, "Benchmarking Algorithms for Federated Domain Generalization"')
  for paper in reference.CLAIM_PAPERS.values():
    assert paper in refs
  for name, entry in (("Berger 1982", "Berger, "), ("Holm", "Holm, "), ("Welch", "Welch, "), ("Wilcoxon", "Wilcoxon, ")):
    assert name in body, name  # the generated text names it
    assert sum(r.startswith(entry) for r in refs) == 1, name

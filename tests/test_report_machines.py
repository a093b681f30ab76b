"""The report's setup names the machines its runs ran on (CPU model, widest vector
extension, cores), counted, and says what a mix of machines means for the paired seeds."""
import types

from fedjax_dg.bench import report


def _run(model, simd, cores=2):
  det = {"cpu": {"model": model, "simd": list(simd), "flags_sha256": "f" * 64}, "usable_cores": cores}
  return {"summary": {"provenance": {"git": {"commit": "c" * 40, "dirty": False}, "source": {"sha256": "s" * 64},
                                     "determinism": det}}}


AVX2 = ("sse4_2", "avx", "avx2", "fma")
AVX512 = AVX2 + ("avx512f", "avx512bw")


def test_machine_label_names_the_widest_vector_extension():
  assert report.machine_label(_run("AMD EPYC", AVX512)["summary"]["provenance"]) == "AMD EPYC, AVX-512, 2 cores"
  assert report.machine_label(_run("AMD EPYC", AVX2, 4)["summary"]["provenance"]) == "AMD EPYC, AVX2, 4 cores"
  assert report.machine_label(_run("", ("sse4_2",))["summary"]["provenance"]) == "unknown CPU, SSE4.2, 2 cores"
  assert report.machine_label({"git": {}}) == "not recorded"


def test_provenance_lines_count_the_machines_and_explain_a_mix():
  one = types.SimpleNamespace(results={"a": _run("AMD EPYC", AVX512), "b": _run("AMD EPYC", AVX512)},
                              stale=frozenset())
  line = report.provenance_lines(one)[-1]
  assert line == "machines (CPU model, widest vector extension, usable cores): AMD EPYC, AVX-512, 2 cores (2)"
  mixed = types.SimpleNamespace(results={"a": _run("AMD EPYC", AVX512), "b": _run("AMD EPYC", AVX2),
                                         "c": _run("AMD EPYC", AVX2)}, stale=frozenset())
  line = report.provenance_lines(mixed)[-1]
  assert line.startswith("machines (CPU model, widest vector extension, usable cores): "
                         "AMD EPYC, AVX-512, 2 cores (1), AMD EPYC, AVX2, 2 cores (2); ")
  assert "docs/reproducibility.md" in line and "seeds' spread" in line

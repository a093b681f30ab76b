"""The API reference answers "what does this argument mean, what does this return": every
public name of the package, the registration API, the contract types, `meta` and `api` have
Google-style docstrings whose sections mkdocstrings renders as tables (mkdocs.yml sets
`docstring_style: google`). Parsed with griffe, the library mkdocstrings itself uses."""
import os

import griffe
import pytest

import fedjax_dg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The registration API and the contract types, beyond what `fedjax_dg` exports.
EXTRA = (
    "fedjax_dg.algorithms.register", "fedjax_dg.algorithms.register_rule",
    "fedjax_dg.algorithms.spec.hparam", "fedjax_dg.algorithms.spec.MethodSpec", "fedjax_dg.algorithms.spec.RuleSpec",
    "fedjax_dg.algorithms.spec.Stage", "fedjax_dg.algorithms.spec.Context", "fedjax_dg.algorithms.spec.ClientSide",
    "fedjax_dg.algorithms.spec.compose",
    "fedjax_dg.data.datasets.register_dataset", "fedjax_dg.data.datasets.DomainDataset",
    "fedjax_dg.data.splits.Fold",
    "fedjax_dg.algorithms.base.Algorithm", "fedjax_dg.algorithms.base.ClientData", "fedjax_dg.algorithms.base.Batch",
    "fedjax_dg.algorithms.base.ClientOutput", "fedjax_dg.algorithms.base.Stacked",
    "fedjax_dg.algorithms.base.ServerRule", "fedjax_dg.algorithms.base.LocalSchedule",
    "fedjax_dg.algorithms.base.check_padding", "fedjax_dg.algorithms.base.padding_probe",
    "fedjax_dg.algorithms.base.make_schedule", "fedjax_dg.algorithms.base.local_train",
    "fedjax_dg.algorithms.base.erm_objective", "fedjax_dg.algorithms.base.masked_cross_entropy",
    "fedjax_dg.algorithms.fedavg.objective_client",
    "fedjax_dg.engine.round.make_round", "fedjax_dg.engine.round.init_round_state",
    "fedjax_dg.engine.round.RoundState",
)
# Modules whose every public function is documented alike.
MODULES = ("fedjax_dg.api", "fedjax_dg.meta")


def _exported() -> list[str]:
  """`fedjax_dg`'s exports, as the dotted paths of the objects they load."""
  paths = []
  for name in fedjax_dg.__all__:
    if name == "__version__":
      continue
    if name in fedjax_dg._EXPORTS:
      paths.append(f"{fedjax_dg._EXPORTS[name]}.{name}")
    else:
      module, attr = fedjax_dg._RENAMED[name]
      paths.append(f"{module}.{attr}")
  return paths


@pytest.fixture(scope="module")
def package():
  return griffe.load("fedjax_dg", search_paths=[ROOT], docstring_parser="google", resolve_aliases=False)


def _object(package, path: str):
  obj = package
  for part in path.split(".")[1:]:
    obj = obj.members[part]
  return obj.final_target if obj.is_alias else obj


def _module_functions(package, module: str) -> list[str]:
  mod = _object(package, module)
  return [f"{module}.{name}" for name, member in mod.members.items()
          if not name.startswith("_") and not member.is_alias and member.is_function]


def _sections(obj) -> dict:
  return {s.kind.value: s for s in obj.docstring.parse("google")} if obj.docstring else {}


def _problems(obj) -> list[str]:
  """What the reference would miss about `obj`: no docstring, an undocumented parameter, a
  class without `Attributes:`."""
  if not obj.docstring or not obj.docstring.value.strip():
    return ["no docstring"]
  sections = _sections(obj)
  if obj.is_class:
    if "attributes" not in sections:
      return ["a class without an Attributes: section"]
    return []
  params = [p.name for p in obj.parameters if p.name not in ("self", "cls")]
  if not params:
    return []
  if "parameters" not in sections:
    return ["a function with parameters without an Args: section"]
  documented = {p.name.lstrip("*") for p in sections["parameters"].value}
  missing = [p for p in params if p not in documented]
  return [f"Args: does not describe {missing}"] if missing else []


def _targets(package) -> list[str]:
  names = [*_exported(), *EXTRA]
  for module in MODULES:
    names += _module_functions(package, module)
  return list(dict.fromkeys(names))


def test_the_walk_covers_the_names_the_reference_promises(package):
  names = _targets(package)
  for want in ("fedjax_dg.algorithms.register", "fedjax_dg.algorithms.register_rule", "fedjax_dg.meta.rounds",
               "fedjax_dg.api.build_method", "fedjax_dg.algorithms.spec.MethodSpec", "fedjax_dg.engine.round.make_round"):
    assert want in names
  assert len(names) > 40


def test_every_public_name_has_google_sections(package):
  problems = {path: why for path in _targets(package) for why in _problems(_object(package, path))}
  assert not problems, "\n".join(f"{p}: {w}" for p, w in problems.items())


def test_register_rule_is_exported_next_to_register_method():
  from fedjax_dg import algorithms
  assert fedjax_dg.register_rule is algorithms.register_rule
  assert fedjax_dg.register_method is algorithms.register
  assert "register_rule" in dir(fedjax_dg)


def test_the_checker_finds_what_it_looks_for(package):
  """The walk can fail: a parameter left out of Args:, a class without Attributes:."""
  src = ('def f(a, b):\n  """Does.\n\n  Args:\n    a: one.\n  """\n\n\n'
         'class C:\n  """A class."""\n\n\ndef g():\n  pass\n')
  mod = griffe.visit("probe", filepath=None, code=src, docstring_parser="google")
  assert _problems(mod.members["f"]) == ["Args: does not describe ['b']"]
  assert _problems(mod.members["C"]) == ["a class without an Attributes: section"]
  assert _problems(mod.members["g"]) == ["no docstring"]


def test_register_rule_refuses_a_name_that_cannot_follow_plus():
  from fedjax_dg.algorithms.spec import RuleSpec
  for bad in ("", "adam+omg"):
    with pytest.raises(ValueError, match="server rule name") as err:
      fedjax_dg.register_rule(RuleSpec(bad, lambda ctx, hp: None))
    assert "\n" not in str(err.value)
  from fedjax_dg import algorithms
  assert "" not in algorithms.RULES and "adam+omg" not in algorithms.RULES

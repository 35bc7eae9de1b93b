"""The registry of named recipes: lookup errors, `idckit list`, and that it matches what the notebooks train."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from idckit.errors import ConfigError
from idckit.experiments import recipes

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = {"runs": 1, "hard_runs": 1, "run_variant": 1}     # call -> position of its variant(s) argument


def test_unknown_recipes_are_the_kits_error_naming_close_matches():
    with pytest.raises(ConfigError, match=r"unknown recipe 'pcl/ful' \(did you mean pcl/full\?\)"):
        recipes.get_recipe("pcl/ful")
    with pytest.raises(ConfigError, match=r"unknown clip4idc recipe 'clip5idc' \(did you mean clip4idc or clip4idc-diff\?\)") as e:
        recipes.get_recipe("clip5idc", "clip4idc")
    assert ("known: clip4idc/clip-ft, clip4idc/no-adapt, clip4idc/clip4idc, clip4idc/clip4idc-diff, clip4idc/adapt"
            in str(e.value))
    assert "idckit list" in e.value.fix
    with pytest.raises(ConfigError, match="unknown pcl recipe 'duda/duda'"):       # known, but another family's
        recipes.get_recipe("duda/duda", "pcl")
    with pytest.raises(ConfigError, match="unknown recipe 'resnet50'; known: pcl/none"):   # nothing close
        recipes.get_recipe("resnet50")
    with pytest.raises(ConfigError, match="unknown recipe family 'idcpcl'"):
        recipes.variants("idcpcl")
    assert recipes.get_recipe("full", "pcl") is recipes.get_recipe("pcl/full") is recipes.all_recipes()["pcl/full"]
    assert recipes.check_variants(["pcl/full", "no_judge"], "pcl") == ["full", "no_judge"]
    assert recipes.check_variants(None, "pcl") == recipes.variants("pcl") == [
        "none", "mlm", "mlm+mvcl", "full", "no_diff_encoder", "no_judge"]


def test_list_filters_like_timm_list_models():
    assert recipes.list_recipes("clip4idc/*") == ["clip4idc/clip-ft", "clip4idc/no-adapt", "clip4idc/clip4idc",
                                                  "clip4idc/clip4idc-diff", "clip4idc/adapt"]
    # the labelled variant is an extra row of CLIP4IDC's table 1, so `idckit train clip4idc` trains it with the rest
    assert recipes.variants("clip4idc") == ["clip-ft", "no-adapt", "clip4idc", "clip4idc-diff", "adapt"]
    assert recipes.get_recipe("clip4idc-diff", "clip4idc").tables == ("clip4idc.table1",)
    assert recipes.describe("clip4idc/clip4idc-diff").splitlines()[1].strip() == (
        'row "CLIP4IDC + difference tokens (idckit variant)" in clip4idc.table1')
    assert recipes.list_recipes("*judge*") == ["pcl/no_judge"]
    assert recipes.list_recipes() == list(recipes.all_recipes()) and len(recipes.all_recipes()) == 16


def test_idckit_list_prints_each_recipe_its_line_and_its_table_rows(capsys):
    from idckit.cli import main

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(recipes.all_recipes())
    names = [ln.split()[0] for ln in lines[::2]]
    assert names == list(recipes.all_recipes())
    full = lines[2 * names.index("pcl/full"):][:2]
    assert full[0].split(None, 1)[1] == recipes.all_recipes()["pcl/full"].description
    assert full[1].strip() == 'row "MLM + MVCL + FDA (full)" in pcl.table2, pcl.table3, pcl.table4, clip4idc.table1'
    assert main(["list", "pcl-birds/b2w"]) == 0
    assert capsys.readouterr().out.splitlines()[1].strip() == 'row "IDC-PCL" in pcl.table1; row "B2W" in pcl.table5'
    assert main(["list", "nothing*"]) == 2
    assert "no recipe matches 'nothing*'" in capsys.readouterr().err


def _names(node: ast.expr, family: str, where: str) -> list[str]:
    """The variant names a notebook passes: a string, a list of strings, or recipes.variants("<family>")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in node.elts):
        return [e.value for e in node.elts]
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "recipes.variants":
        return recipes.variants(node.args[0].value)
    raise AssertionError(f"{where}: cannot read the variants {ast.unparse(node)!r} of a {family} call")


def _family(module: str) -> str | None:
    """The recipe family of an experiment module, from the registry (no torch import for this test)."""
    from idckit import registry

    return next((f.recipe_family for f in registry.FAMILIES.values() if f.module == f"idckit.experiments.{module}"),
                None)


def _trained(tree: ast.AST, where: str) -> set[str]:
    """The recipes a module's code trains: its calls of ``<family module>.runs|hard_runs|run_variant``, plus those of
    the table builders it calls (``pair_table.build``, ``retrieval_table.build``: shared bodies in the package)."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    imported = {a.asname or a.name: a.name for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == "idckit.experiments" for a in n.names}
    families = {name: f for name, module in imported.items() if (f := _family(module))}
    used = set()
    for c in calls:
        if not isinstance(c.func, ast.Attribute):
            continue
        owner = ast.unparse(c.func.value)
        if owner in families and c.func.attr in RUNNERS:
            family = families[owner]
            used |= {recipes.get_recipe(v, family).name for v in _names(c.args[RUNNERS[c.func.attr]], family, where)}
        elif owner in imported and owner not in families and c.func.attr == "build":
            builder = ROOT / "idckit" / "experiments" / f"{imported[owner]}.py"
            used |= _trained(ast.parse(builder.read_text(encoding="utf-8")), builder.name)
    return used


def _notebook_recipes() -> dict[str, set[str]]:
    """table id -> the recipes its notebook trains (read from the notebooks' code, not run)."""
    out: dict[str, set[str]] = {}
    for nb in sorted((ROOT / "notebooks").glob("*.py")):
        tree = ast.parse(nb.read_text(encoding="utf-8"))
        used = _trained(tree, nb.name)
        if used:
            # the table id goes to write_report, or to pair_table.build where a shared body writes the report
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
            table = next(c.args[2].value for c in calls
                         if ast.unparse(c.func) in ("write_report", "pair_table.build"))
            out.setdefault(table, set()).update(used)
    return out


def test_the_registry_covers_every_recipe_the_notebooks_train_and_names_their_tables():
    used = _notebook_recipes()
    assert used["pcl.table4"] == {f"pcl/{v}" for v in recipes.variants("pcl")}
    assert used["clip4idc.table1"] == {"clip4idc/clip4idc", "clip4idc/clip4idc-diff", "pcl/full"}
    assert used["clip4idc.table6"] == {"clip4idc/adapt"}      # the adaptation alone, for every dataset
    # every (recipe, table) a notebook trains is in the registry, and every table the registry names trains it
    claimed = {(name, t) for name, r in recipes.all_recipes().items() for t in r.tables}
    assert {(name, t) for t, names in used.items() for name in names} == claimed


def test_recipes_pick_the_objectives_and_the_profile_json_gives_their_ratios(tmp_path):
    """A recipe switches objectives on; the ratios are pcl.json's (an override of pretrain.ratios reaches the run,
    where the recipe once silently replaced it with the public code's 8:1:2)."""
    from types import SimpleNamespace

    from idckit.experiments import pcl
    from idckit.experiments.config import load_config

    def pretrain_ratios(overrides=None, profile="paper"):
        s = SimpleNamespace(config=load_config("pcl", profile, overrides), identity={"data": "x"}, runs_dir=tmp_path)
        out = {}
        for v in recipes.variants("pcl"):
            run = pcl._pretrain_run(s, recipes.get_recipe(v, "pcl").settings, seed=0)
            out[v] = run and run.config["pretrain"]["ratios"]
        return out

    paper = pretrain_ratios()
    assert paper == {"none": None, "mlm": {"mlm": 8}, "mlm+mvcl": {"mlm": 8, "mvcl": 1},
                     "full": {"mlm": 8, "mvcl": 1, "fda": 2}, "no_diff_encoder": {"mlm": 8, "mvcl": 1, "fda": 2},
                     "no_judge": {"mlm": 8, "mvcl": 1, "fda": 2}}
    more_mvcl = pretrain_ratios({"pretrain": {"ratios": {"mvcl": 3}}})
    assert more_mvcl["full"] == {"mlm": 8, "mvcl": 3, "fda": 2} and more_mvcl["mlm"] == {"mlm": 8}
    assert pretrain_ratios(profile="cpu")["full"] == {"mlm": 8, "mvcl": 8, "fda": 2}     # the cpu profile's own
    with pytest.raises(ConfigError, match="no positive ratio for fda") as e:
        pretrain_ratios({"pretrain": {"ratios": {"fda": 0}}})
    assert "pretrain.ratios" in e.value.fix

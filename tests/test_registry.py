"""The table manifest (idckit.registry): one place that says which notebook trains which family on which datasets
from which root; the notebooks, the CLI, the Makefile and reproduce all follow it."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from idckit import registry
from idckit.cli import build_parser
from idckit.errors import ConfigError, DatasetError

ROOT = Path(__file__).resolve().parents[1]


def _parameters(name: str) -> dict:
    """The literal values of a notebook's parameters cell (its committed .ipynb)."""
    doc = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    cell = next(c for c in doc["cells"] if "parameters" in c["metadata"].get("tags", []))
    tree = ast.parse("".join(cell["source"]))
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def test_every_notebook_is_in_the_manifest_and_takes_exactly_its_roots_and_seeds():
    on_disk = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(registry.NOTEBOOKS) == on_disk
    for name, nb in registry.NOTEBOOKS.items():
        params = _parameters(name)
        assert "data_root" not in params, name                     # one root per dataset, never a shared one
        taken = {p for p in params if p in registry.root_params()}
        assert taken == set(nb.roots), (name, taken, nb.roots)
        assert all(params[p] is None for p in nb.roots), name    # None: the synthetic set
        assert tuple(params["seeds"]) == nb.seeds, name
        assert set(nb.families) <= set(registry.FAMILIES) and set(nb.datasets) <= set(registry.DATASETS)


def test_each_family_module_follows_the_protocol_and_names_its_recipes():
    from idckit.experiments import base, recipes

    for name, fam in registry.FAMILIES.items():
        m = base.family_module(name)
        assert m.__name__ == fam.module and m.FAMILY == fam.recipe_family and fam.dataset in registry.DATASETS
        assert [r.family for r in fam.recipes] == [fam.recipe_family] * len(fam.recipes)
        assert callable(m.setup) and callable(m.run_variant) and callable(m.runs)
        assert recipes.check_variants(None, fam.recipe_family)        # every family has recipes to train
    with pytest.raises(ConfigError, match="unknown experiment family 'gan'"):
        registry.family("gan")


def test_notebook_roots_pass_each_notebook_only_the_roots_it_reads():
    roots = {"clevr_root": "/data/clevr", "spot_root": "/data/spot", "ier_root": None, "birds_root": "/data/b"}
    assert registry.notebook_roots("table2_clevr_change", roots) == {"clevr_root": "/data/clevr"}
    assert registry.notebook_roots("table5_cross_task", roots) == {"birds_root": "/data/b"}
    assert registry.notebook_roots("clip4idc_table3_spot_the_diff", roots) == {"spot_root": "/data/spot"}
    assert registry.notebook_roots("clip4idc_table6_retrieval", roots) == {
        "clevr_root": "/data/clevr", "spot_root": "/data/spot", "ier_root": None}
    assert registry.notebook_roots("clip4idc_table4_editing_request", None) == {"ier_root": None}
    assert registry.notebook_roots("my_own_notebook", roots) == {}         # not the kit's: no dataset root
    with pytest.raises(ConfigError, match="unknown dataset roots"):
        registry.notebook_roots("table2_clevr_change", {"data_root": "/x"})


def test_reproduce_parameters_follow_the_manifest(tmp_path):
    from idckit.reproduce import parameters

    p = parameters("clip4idc_table5_ablation", profile="smoke", roots={"spot_root": "/s", "birds_root": "/b"},
                   report_dir=tmp_path / "r", runs_dir=tmp_path / "runs", extra_parameters={"device": "cpu"})
    assert p == {"profile": "smoke", "clevr_root": None, "spot_root": "/s", "report_dir": str(tmp_path / "r"),
                 "runs_dir": str(tmp_path / "runs"), "device": "cpu"}


def test_one_option_and_one_make_variable_per_dataset():
    parser = build_parser()
    for command in (["reproduce"], ["doctor"], ["train", "pcl"]):
        args = parser.parse_args(command + ["--clevr-root", "/c", "--birds-root", "/b"])
        assert (args.clevr_root, args.birds_root, args.spot_root, args.ier_root) == ("/c", "/b", None, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["reproduce", "--data-root", "/c"])
    make = (ROOT / "Makefile").read_text()
    for d in registry.DATASETS.values():
        assert re.search(rf"^{d.variable} \?=", make, re.M), d.variable
        assert f'$(if $({d.variable}),{d.option} "$${d.variable}")' in make     # the value: quoted, from the env
    assert "DATA_ROOT" not in make


def test_weights_are_read_from_the_family_config():
    from idckit.settings import load_config

    assert registry.weights("duda", "paper") == registry.weights("pcl", "paper")     # DUDA reads IDC-PCL's
    assert registry.weights("pcl", "paper")["backbone"] == load_config("pcl", "paper")["backbone"]
    assert registry.weights("clip4idc", "cpu")["clip"] == load_config("clip4idc_adapt", "cpu")["clip"]


@pytest.mark.parametrize("dataset", list(registry.DATASETS))
def test_a_root_in_the_wrong_layout_is_refused_with_the_layout_and_the_fix(dataset, tmp_path):
    from idckit.experiments.data import check_root

    d = registry.DATASETS[dataset]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError) as err:
        check_root(dataset, tmp_path / "empty")
    text = str(err.value)
    assert text.startswith(f"not a {d.title} root: ")
    assert f"{d.param} / {d.option} / {d.variable}=" in text and d.layout in text and d.synthetic in text


def test_reproduce_refuses_a_wrong_root_before_any_notebook_runs(tmp_path):
    from idckit.reproduce import reproduce

    (tmp_path / "birds").mkdir()
    with pytest.raises(DatasetError, match="not a Birds-to-Words"):
        reproduce(["table1_birds_to_words"], profile="smoke", roots={"birds_root": str(tmp_path / "birds")},
                  report_dir=tmp_path / "rep", runs_dir=tmp_path / "runs")
    assert not (tmp_path / "rep" / "table1_birds_to_words.json").exists()
    # a root no selected notebook reads is not checked (nor passed)
    from idckit.reproduce import check_roots

    check_roots(["table2_clevr_change"], {"birds_root": str(tmp_path / "birds")})


def _real_layout(synthetic: Path, dest: Path) -> Path:
    """A copy of a synthetic set without what marks it synthetic (synth_info.json, scene_descriptions.json): the
    release's layout, which the kit reads as real data."""
    import shutil

    shutil.copytree(synthetic, dest)
    for marker in ("synth_info.json", "scene_descriptions.json"):
        (dest / marker).unlink(missing_ok=True)
    return dest


@pytest.mark.slow
@pytest.mark.java
def test_each_dataset_root_reaches_its_notebook_through_reproduce(tmp_path, monkeypatch):
    """One notebook per dataset, run by `idckit reproduce --profile smoke` on a fixture in the real release's
    layout: each report says it ran on the real root it was given; the others' roots are not passed to it."""
    from idckit.cli import main
    from idckit.data.synth import birds, clevr_change, editing_request, spot_the_diff

    monkeypatch.setenv("IDCKIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("IDCKIT_RUNS_DIR", str(tmp_path / "runs"))
    # the kernels' torch threads: a second one gains nothing at smoke size and crawls on a busy 2-core box
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    made = tmp_path / "synth"
    roots = {
        "clevr_root": _real_layout(clevr_change.generate(made / "clevr", profile="smoke", progress=False),
                                   tmp_path / "clevr"),
        "spot_root": _real_layout(spot_the_diff.generate(made / "spot", profile="smoke", progress=False),
                                  tmp_path / "spot"),
        "ier_root": _real_layout(editing_request.generate(made / "ier", profile="smoke", progress=False),
                                 tmp_path / "ier"),
        "birds_root": _real_layout(birds.generate(made / "birds", profile="smoke", progress=False),
                                   tmp_path / "birds"),
    }
    by_notebook = {"00_walkthrough": "clevr_root", "clip4idc_table3_spot_the_diff": "spot_root",
                   "clip4idc_table4_editing_request": "ier_root", "table1_birds_to_words": "birds_root"}
    reports = tmp_path / "reports"
    args = ["reproduce", *by_notebook, "--profile", "smoke", "--report-dir", str(reports), "--device", "cpu"]
    for param, root in roots.items():
        args += [registry.dataset_of_param(param).option, str(root)]
    assert main(args) == 0
    for name, param in by_notebook.items():
        data = json.loads((reports / f"{name}.json").read_text())["provenance"]["data"]
        assert data.startswith("real: ") and str(roots[param].resolve()) in data, (name, data)


def test_a_toy_family_and_dataset_registered_in_one_place_reach_list_config_train_and_verify_data(tmp_path, capsys):
    """The README's guide: tests/toy_family.py's two records and its config folder, handed to registry.register,
    are all `idckit list`, `config`, `train` and `verify-data` need; they are gone again after the block."""
    import toy_family

    from idckit.cli import main
    from idckit.data.detect import dataset_name

    root = toy_family.generate(tmp_path / "toy", n_pairs=6)
    with registry.register(toy_family.FAMILY_RECORD, toy_family.DATASET, config_dir=toy_family.CONFIG_DIR):
        assert main(["list", "toy/*"]) == 0
        assert capsys.readouterr().out.split()[0] == "toy/base"
        assert main(["config", "toy", "--profile", "smoke"]) == 0
        printed = capsys.readouterr().out
        assert "pairs" in printed and "toy.json" in printed and "max_steps" in printed
        assert main(["verify-data", str(root), "--dataset", "toy-pairs"]) == 0
        assert "no problems; 36 images referenced" in capsys.readouterr().out     # 3 splits x 6 pairs x 2
        assert dataset_name(root) == "toy-pairs"
        assert main(["train", "toy", "--profile", "smoke", "--toy-root", str(root), "--runs-dir",
                     str(tmp_path / "runs"), "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert "toy (seed 0): toy-" in out and "val accuracy 1.000" in out, out
        run_dir = next((tmp_path / "runs").glob("toy-*"))
        model, step = registry.family("toy").load_run(run_dir)
        assert not model.training and step == json.loads((run_dir / "metrics.json").read_text())["best_step"]
        (root / "images" / "val0_a.png").unlink()
        assert main(["verify-data", str(root), "--dataset", "toy-pairs"]) == 1
        assert "val0_a.png" in capsys.readouterr().out
    assert "toy" not in registry.FAMILIES and "toy-pairs" not in registry.DATASETS
    with pytest.raises(SystemExit):
        main(["train", "toy"])
    with pytest.raises(ConfigError, match="already registered"):
        with registry.register(registry.DATASETS["birds"]):
            pass


def _other_spellings() -> dict[str, str]:
    """Spellings a dataset's name has had (``editing_request``, ``ier``, ``clevr``): its name with underscores, its
    root parameter's stem, its paper-number id (unless that id is a folder of its layout: ``birds_to_words/``)."""
    out = {}
    for d in registry.DATASETS.values():
        paper = {d.paper_id} if d.paper_id and d.paper_id not in d.layout else set()
        for other in {d.name.replace("-", "_"), d.param.removesuffix("_root"), *paper} - {d.name}:
            out[other] = d.name
    return out


def test_every_dataset_has_one_spelling_outside_the_registry():
    """No string in the package or the notebooks names a dataset another way than the registry's name (the
    registry alone holds its root parameter and paper-number id)."""
    package = Path(registry.__file__).parent
    others = _other_spellings()
    assert {"ier", "editing_request", "clevr_change", "spot"} <= set(others)
    found = []
    for path in [*package.rglob("*.py"), *(package.parent / "notebooks").glob("*.py")]:
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in others:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value!r} "
                             f"(registry: {others[node.value]!r})")
    assert not found, "other spellings of a dataset:\n" + "\n".join(found)


def test_a_trained_run_is_loaded_one_way():
    """The registry's Family.load_run is the one loader: no other run-loading function is left in the package, and
    a family whose module has none says so (the kit's error, not an AttributeError)."""
    package = Path(registry.__file__).parent
    loaders = sorted(f"{p.relative_to(package.parent)}:{n.name}" for p in package.rglob("*.py")
                     for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                     if isinstance(n, ast.FunctionDef) and re.fullmatch(r"load_(run|finetuned|trained)\w*", n.name))
    assert loaders == ["idckit/experiments/pcl.py:load_run", "idckit/registry.py:load_run"], loaders
    with pytest.raises(ConfigError, match="the duda family has no run loader yet"):
        registry.family("duda").load_run("runs/duda-x")


def test_every_name_the_registry_gives_as_a_string_resolves():
    """The registry names code as "module:attribute" strings (so it imports nothing heavy): each one resolves, and
    each config file a family names exists."""
    from idckit.settings import config_path

    for d in registry.DATASETS.values():
        assert callable(registry.resolve(d.loader)) if d.loader else not d.pairs
        assert callable(registry.resolve(d.generator).generate), d.generator
        assert config_path(d.config).is_file(), d.config
    for f in registry.FAMILIES.values():
        module = registry.resolve(f.module)
        assert callable(module.setup) and callable(module.run_variant) and callable(module.runs)
        assert isinstance(registry.resolve(f.config_class), type), f.config_class
        assert all(config_path(c).is_file() for c in (*f.configs, f.weights[0], f.model[0])), f.name
    with pytest.raises(AttributeError):
        registry.resolve("idckit.registry:no_such_name")

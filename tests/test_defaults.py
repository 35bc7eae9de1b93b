"""Every default once: the generators' settings live in configs/synth_*.json only. The CLI's options and each
generate()'s arguments default to None and read the profile's file, so they cannot drift apart."""
from __future__ import annotations

import inspect
import json

import pytest

from idckit.cli import build_parser
from idckit.paths import DEFAULT_PROFILE
from idckit.settings import load_config

#: command -> (its config file, generate()'s module, option -> the file's key)
GENERATORS = {
    "clevr-change": ("synth_clevr_change", "idckit.data.synth.clevr_change",
                     {"pairs": "pairs", "seed": "seed", "size": "size", "camera_jitter": "camera_jitter",
                      "lamp_jitter": "lamp_jitter", "objects": "objects", "workers": "workers"}),
    "birds": ("synth_birds", "idckit.data.synth.birds",
              {"pairs": "pairs", "cub_per_class": "cub_per_class", "nabirds_per_class": "nabirds_per_class",
               "size": "size", "seed": "seed", "workers": "workers", "tree": "tree"}),
    "spot-the-diff": ("synth_spot_the_diff", "idckit.data.synth.spot_the_diff",
                      {"pairs": "pairs", "seed": "seed", "workers": "workers", "light_change": "light_change"}),
    "editing-request": ("synth_editing_request", "idckit.data.synth.editing_request",
                        {"pairs": "pairs", "seed": "seed", "workers": "workers"}),
}


@pytest.mark.parametrize("command", list(GENERATORS))
def test_cli_and_generate_hold_no_default_of_their_own(command):
    import importlib

    config, module, options = GENERATORS[command]
    args = build_parser().parse_args(["generate", command, "--out", "/tmp/x"])
    assert args.profile == DEFAULT_PROFILE
    assert {o: getattr(args, o) for o in options} == dict.fromkeys(options)     # nothing typed here
    params = inspect.signature(importlib.import_module(module).generate).parameters
    given = {"n_pairs" if o == "pairs" else o for o in options}
    assert {p: params[p].default for p in given} == dict.fromkeys(given)       # nor there
    # and every option is a setting of the file (the file holds all of them at every profile)
    for profile in ("smoke", "cpu", "paper"):
        assert set(options.values()) <= set(load_config(config, profile))


@pytest.mark.parametrize("command", ["spot-the-diff", "editing-request"])
def test_what_the_cli_writes_is_the_profiles_settings(command, tmp_path, capsys):
    from idckit.cli import main

    config, _, options = GENERATORS[command]
    assert main(["generate", command, "--out", str(tmp_path / "ds"), "--profile", "smoke"]) == 0
    info = json.loads((tmp_path / "ds" / "synth_info.json").read_text())
    want = load_config(config, "smoke")
    assert {k: info[k] for k in options.values() if k != "workers"} == \
        {k: want[k] for k in options.values() if k != "workers"}
    # an option given wins over the file
    assert main(["generate", command, "--out", str(tmp_path / "ds2"), "--profile", "smoke", "--seed", "1"]) == 0
    assert json.loads((tmp_path / "ds2" / "synth_info.json").read_text())["seed"] == 1


def test_generate_reads_the_default_profile_and_another_on_request(monkeypatch):
    from idckit.data.synth import writing

    seen = []
    real = writing.from_profile
    monkeypatch.setattr(writing, "from_profile", lambda *a, **k: seen.append(a) or real(*a, **k))
    resolved = real("synth_birds", None, pairs=None, seed=3)
    assert resolved == {"pairs": load_config("synth_birds", DEFAULT_PROFILE)["pairs"], "seed": 3}
    assert real("synth_clevr_change", "smoke", size=None)["size"] == load_config("synth_clevr_change", "smoke")["size"]


def test_idckit_config_prints_every_resolved_setting_with_its_layer(capsys):
    from idckit.cli import main
    from idckit.settings import read_config_file

    assert main(["config", "pcl", "--profile", "cpu", "--json"]) == 0
    rows = {r["setting"]: (r["value"], r["from"]) for r in json.loads(capsys.readouterr().out)}
    cpu = load_config("pcl", "cpu")
    assert rows["pcl.model.d_model"] == (cpu["model"]["d_model"], "pcl.json profiles.cpu")
    assert rows["pcl.backbone"] == (cpu["backbone"], "pcl.json base")
    assert rows["runtime.device"] == ("auto", "runtime.json base")
    assert rows["synth_clevr_change.pairs"] == (load_config("synth_clevr_change", "cpu")["pairs"],
                                                "synth_clevr_change.json profiles.cpu")
    # every leaf of the resolved config, and nothing else
    def leaves(tree, prefix):
        for k, v in tree.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    assert {k for k in rows if k.startswith("pcl.")} == set(leaves(cpu, "pcl."))
    # a dataset block is its own layer
    assert main(["config", "clip4idc", "--profile", "cpu", "--dataset", "editing-request", "--json"]) == 0
    rows = {r["setting"]: (r["value"], r["from"]) for r in json.loads(capsys.readouterr().out)}
    block = read_config_file("clip4idc_caption")["datasets"]["editing-request"]["cpu"]
    assert rows["clip4idc_caption.train.max_steps"] == (block["train"]["max_steps"],
                                                        "clip4idc_caption.json datasets.editing-request.cpu")
    # DUDA's features are IDC-PCL's: the paper profile's backbone comes from pcl.json
    assert main(["config", "duda", "--profile", "paper", "--json"]) == 0
    rows = {r["setting"]: (r["value"], r["from"]) for r in json.loads(capsys.readouterr().out)}
    assert rows["pcl.backbone"] == ("resnet101", "pcl.json profiles.paper") and "duda.backbone" not in rows


def test_every_about_is_a_reason_in_at_most_300_characters():
    """A config's ``_about`` says why in a sentence or two; measurements live in lab/records (issue 37)."""
    from idckit.settings import CONFIG_DIR

    def abouts(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "_about":
                    yield where, value
                else:
                    yield from abouts(value, f"{where}.{key}")

    long = [(where, len(text)) for path in sorted(CONFIG_DIR.glob("*.json"))
            for where, text in abouts(json.loads(path.read_text()), path.name) if len(text) > 300]
    assert not long, long

"""docs/parity_settings.md, the audit of every paper run's training settings against the authors' scripts, is tied
to the configs: each row's `family:setting` must hold the kit `paper` value the row shows, as ``idckit config
FAMILY --profile paper`` resolves it; every row has a status, every `differs` and `unverifiable` a reason; and
every resolved setting has a row or a line saying why not."""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pytest

from idckit.registry import FAMILIES
from idckit.settings import resolved_with_sources

DOC = Path(__file__).resolve().parent.parent / "docs" / "parity_settings.md"
RUNS = 7                                    # IDC-PCL: 2 CLEVR + 3 birds stages; CLIP4IDC: adaptation, captioning
COLUMNS = ["setting", "authors", "authors' file:line", "kit `paper`", "config", "status"]
STATUS = re.compile(r"(equal(: .+)?|differs: .+|unverifiable: .+)")
REF = re.compile(r"`(\w+):([\w.\-]+)`")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def parse(text: str) -> tuple[list[dict[str, str]], list[tuple[str, str]]]:
    """The audit rows (one dict per row, with its run and line number) and the (family, pattern) lines of
    'Settings without a row'."""
    rows, exempt, run, section = [], [], None, None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            section, run = line[3:].strip(), None
        elif line.startswith("### "):
            run = line[4:].strip()
        elif line.startswith("| ") and not line.startswith(("| setting |", "| config |")):
            cells = _cells(line)
            if section == "Settings without a row":
                exempt += [tuple(p.split(":", 1)) for p in re.findall(r"`([^`]+)`", cells[0])]
            elif run is not None:
                assert len(cells) == len(COLUMNS), f"docs/parity_settings.md:{n}: {len(cells)} cells, not 6"
                rows.append({"run": run, "line": n, **dict(zip(COLUMNS, cells))})
    return rows, exempt


def resolved(family: str) -> dict[str, object]:
    return {k: v for k, v, _ in resolved_with_sources(list(FAMILIES[family].configs), "paper")}


def _json(cell: str):
    try:
        return True, json.loads(cell.strip("`"))
    except ValueError:
        return False, None


def problems(text: str, resolve=resolved) -> list[str]:
    """What in the audit disagrees with the configs (empty: none), each naming its row."""
    rows, exempt = parse(text)
    out = []
    if len({r["run"] for r in rows}) != RUNS:
        out.append(f"{len({r['run'] for r in rows})} run tables, not {RUNS}")
    configs = {f: resolve(f) for f in FAMILIES if f != "duda"}
    referenced = set()
    for r in rows:
        name = f"docs/parity_settings.md:{r['line']} ({r['run']}: {r['setting']})"
        if not STATUS.fullmatch(r["status"]):
            out.append(f"{name}: status {r['status']!r} is not 'equal', 'differs: why' or 'unverifiable: why'")
        if r["config"] == "-":
            continue
        ref = REF.fullmatch(r["config"])
        if ref is None or ref[1] not in configs:
            out.append(f"{name}: config {r['config']!r} is not `family:setting` of {sorted(configs)}")
            continue
        family, key = ref[1], ref[2]
        referenced.add((family, key))
        if key not in configs[family]:
            out.append(f"{name}: {family}'s paper config has no setting {key}")
            continue
        ok, shown = _json(r["kit `paper`"])
        actual = configs[family][key]
        if not ok or shown != actual or type(shown) is not type(actual):
            out.append(f"{name}: the table shows {r['kit `paper`']}, `idckit config {family} --profile paper` "
                       f"resolves {key} = {json.dumps(actual)}: update the row (and its status)")
            continue
        ok, authors = _json(r["authors"])
        if ok and r["status"].startswith("equal") and authors != actual:
            out.append(f"{name}: says equal, but the authors' {r['authors']} is not the kit's {json.dumps(actual)}")
        if ok and r["status"].startswith("differs") and authors == actual:
            out.append(f"{name}: says differs, but the authors' {r['authors']} is the kit's {json.dumps(actual)}")
    used = set()
    for family, keys in configs.items():
        for key in keys:
            hits = {(f, p) for f, p in exempt if fnmatch.fnmatchcase(family, f) and fnmatch.fnmatchcase(key, p)}
            used |= hits
            if (family, key) not in referenced and not hits:
                out.append(f"{family}:{key} = {json.dumps(keys[key])} has no row in docs/parity_settings.md: add "
                           f"one to its run's table (or a line under 'Settings without a row' saying why not)")
    out += [f"'Settings without a row' line {f}:{p} matches no setting" for f, p in exempt if (f, p) not in used]
    return out


def test_the_audit_matches_the_resolved_paper_configs():
    rows, _ = parse(DOC.read_text())
    assert len(rows) >= 200 and sum(r["config"] != "-" for r in rows) >= 150
    assert problems(DOC.read_text()) == []


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_a_drifted_paper_value_fails_naming_its_row(monkeypatch, tmp_path):
    import shutil

    import idckit.settings

    configs = tmp_path / "configs"
    shutil.copytree(idckit.settings.CONFIG_DIR, configs)
    birds = configs / "pcl_birds.json"        # birds fine-tuning back to the kit's old 100,000 steps at paper
    birds.write_text(_edit(birds.read_text(), '"max_steps": 20002', '"max_steps": 100000'))
    monkeypatch.setattr(idckit.settings, "CONFIG_DIR", configs)
    found = problems(DOC.read_text())
    assert len(found) == 1, found
    assert "IDC-PCL birds fine-tuning (Birds-to-Words): steps" in found[0] and "= 100000" in found[0]


@pytest.mark.parametrize("old, new, says", [
    ("| `pcl:pcl.model.dropout` | equal |", "| `pcl:pcl.model.dropout` |  |", "status ''"),
    ("| `pcl:pcl.model.dropout` | equal |", "| `pcl:pcl.model.dropout` | differs |", "status 'differs'"),
    ("| `pcl:pcl.model.dropout` | equal |", "| `pcl:pcl.model.dropout` | differs: x |", "says differs, but"),
    ("| `0.2` | `pcl:pcl.model.dropout` |", "| `0.1` | `pcl:pcl.model.dropout` |", "resolves pcl.model.dropout"),
    ("| `0.2` | `pcl:pcl.model.dropout` |", "| `0.2` | `pcl:pcl.model.dropot` |", "has no setting pcl.model.dropot"),
    ("| `*:*.eval_batch_size`, ", "| ", "pcl:pcl.finetune.eval_batch_size = 200 has no row"),
])
def test_a_row_without_status_reason_or_true_value_fails(old, new, says):
    found = problems(_edit(DOC.read_text(), old, new))
    assert found and all("dropout" in p or "eval_batch_size" in p for p in found), found
    assert any(says in p for p in found), found

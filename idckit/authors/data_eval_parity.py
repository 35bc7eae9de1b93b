"""Data and evaluation parity: the authors' preprocessing and evaluation code, run on a tiny real-layout fixture.

``record(idc, clip4idc, out)`` reads ``tests/parity/data_eval_fixture.json`` (a 16-index CLEVR-Change in the
official layout's schemas, fixed candidate captions, tokeniser probes), writes it out as the layouts the authors'
code reads, runs their code on it from the checkouts and stores what it produced in ``data_eval_record.json``:

* IDC-PCL (yaolinli/IDC ``clver/``): their fine-tuning ``Dataset`` (``data/dataset_finetune_clver.py``) on
  ``{train,val,test}.json`` and ``dict.json``: every training sample's ids (their lookup, ``<UNK>``, truncation to
  ``max_len - 3`` words, ``<BOS>``/``<EOS>``/``<PAD>``) and ``diff_label`` (their change list: semantic or not),
  and val/test references per pair; the pre-training ``Dataset.padding`` on the same sentences; their selection
  scorer (``clver/eval.py``: CIDEr) on val and their test evaluator (``eval/eval.py``: BLEU-1..4, METEOR,
  ROUGE-L, CIDEr, CIDEr-D, no tokenizer) on the fixed candidates.
* CLIP4IDC (sushizixin/CLIP4IDC): their CLEVR data loaders (``dataloaders/dataloader_clevr_{retrieval,caption}.py``)
  with their ``SimpleTokenizer`` at ``--max_words 32``: every retrieval text and every caption's decoder input
  and target, probes included; their ``eval_epoch`` (``main_task_caption.py``), fed fixed greedy outputs in place
  of a model's, which decodes them (cut at ``<|endoftext|>`` and ``!``), writes the result file and scores it
  against the reference file their ``preprocess/eval_utils.merge_gt_files`` builds (pycocoevalcap with the PTB
  tokenizer); and per change type, semantic and distractor subsets with ``preprocess/eval_utils.py``.

What the fixture stands in for: IDC-PCL's ``{split}.json`` and ``dict.json`` are pre-built downloads whose builder
is not published; :func:`write_pcl_layout` writes them from the official files (the captions' strings as they
are, one line per pair, semantic then non-semantic; the dictionary: their six specials at the ids their code
hard-codes, then the train words). Their feature pickles are replaced by zero arrays (no text depends on them).
The MLM masks that their ``Dataset`` draws are switched off for the recording (the masks are random; the traces
record them). SPICE is recorded by neither: both authors' evaluators leave it out.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import re
import shutil
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from idckit import registry
from idckit.authors import checkout_commit, clip4idc, pcl
from idckit.data.clevr_change import default_name, nonsemantic_name, parse_pair_id, semantic_name
from idckit.errors import ConfigError
from idckit.fileio import write_text

#: CLEVR-Change as the authors' scripts name it (their --datatype)
AUTHORS_CLEVR = registry.dataset("clevr-change").authors_name

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "parity" / "data_eval_fixture.json"
RECORD_NAME = "data_eval_record.json"
#: the authors' caption length and scripts' text length (clver/config/finetune_clver.json:15;
#: CLIP4IDC scripts/retrieve_clevr.sh:14 and scripts/caption_clevr.sh:17)
PCL_MAX_LEN, CLIP4IDC_MAX_WORDS = 40, 32
#: IDC-PCL's special words at the ids their fine-tuning code hard-codes (BOS 1, MASK 5), as pcl.RECORDING_VOCAB
PCL_SPECIALS = {"<PAD>": 0, "<BOS>": 1, "<EOS>": 2, "<UNK>": 3, "<CLS>": 4, "<MASK>": 5}


# -- the fixture and the layouts written from it -----------------------------------------------------------------
def load_fixture(path: str | Path = FIXTURE) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_official_layout(fixture: Mapping[str, Any], root: str | Path, *, image_size=(8, 6)) -> Path:
    """The official CLEVR-Change layout (tiny solid-colour PNGs, the fixture's four JSON files) under ``root``."""
    from PIL import Image  # local: Pillow is needed only to write the fixture's images

    root = Path(root)
    indices = sorted(i for ids in fixture["splits"].values() for i in ids)
    for sub, name in (("images", default_name), ("sc_images", semantic_name), ("nsc_images", nonsemantic_name)):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for i in indices:
            shade = (20 * i % 256, 100 if sub == "sc_images" else 50, 200 if sub == "nsc_images" else 20)
            Image.new("RGB", image_size, shade).save(root / sub / name(i))
    for name in ("change_captions", "no_change_captions", "splits", "type_mapping"):
        (root / f"{name}.json").write_text(json.dumps(fixture[name]), encoding="utf-8")
    return root


def pcl_pairs(fixture: Mapping[str, Any], split: str) -> list[dict[str, Any]]:
    """One line of the authors' ``{split}.json`` per pair: (default, semantic) with the change captions, then
    (default, non-semantic) with the no-change captions, for each index of the split in its order."""
    out = []
    for i in fixture["splits"][split]:
        key = default_name(i)
        out.append({"img1": key, "img2": semantic_name(i), "sentences": fixture["change_captions"][key]})
        out.append({"img1": key, "img2": nonsemantic_name(i), "sentences": fixture["no_change_captions"][key]})
    return out


def pcl_dictionary(fixture: Mapping[str, Any]) -> dict[str, int]:
    """The stand-in ``dict.json``: the specials, then every word (split on ' ') of the train sentences."""
    counts = Counter(w for p in pcl_pairs(fixture, "train") for s in p["sentences"] for w in s.split(" "))
    words = sorted(counts, key=lambda w: (-counts[w], w))
    return {**PCL_SPECIALS, **{w: len(PCL_SPECIALS) + i for i, w in enumerate(words)}}


def authors_image_id(pair_id: str) -> str:
    """IDC-PCL's ``ImgId`` (``img1 + '_' + img2``) of a kit pair id (``000123.png`` / ``000123.png_n``)."""
    index, distractor = parse_pair_id(pair_id)
    return default_name(index) + "_" + (nonsemantic_name if distractor else semantic_name)(index)


def write_pcl_layout(fixture: Mapping[str, Any], root: str | Path) -> Path:
    """``{train,val,test}.json`` (JSON lines) and ``dict.json`` as IDC-PCL's ``clver/`` reads them."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        (root / f"{split}.json").write_text("".join(json.dumps(p) + "\n" for p in pcl_pairs(fixture, split)),
                                            encoding="utf-8")
    (root / "dict.json").write_text(json.dumps(pcl_dictionary(fixture)), encoding="utf-8")
    return root


# -- IDC-PCL ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _pcl_code(folder: Path, config: Path) -> Iterator[None]:
    """Their folder first on sys.path and their script's command line in sys.argv (their modules parse it when
    imported); the modules it imports are dropped again on exit (``clver/cider`` and ``eval/cider`` share a name)."""
    saved_argv, saved_path, saved_modules = sys.argv, list(sys.path), set(sys.modules)
    sys.argv = ["finetune.py", "--dataset", "clver", "--exp_name", "data_eval", "--mode", "train",
                "--config", str(config)]
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name in set(sys.modules) - saved_modules:
            del sys.modules[name]


def _no_masks(module: types.ModuleType, dataset: Any) -> None:
    """Their Dataset without its random MLM masks: no word chosen, and the [EOS] never masked."""
    dataset.mask_sent = lambda x: (x, [-1] * len(x))
    module.random = types.SimpleNamespace(random=lambda: 1.0, choice=module.random.choice)


def _record_pcl(checkout: Path, fixture: Mapping[str, Any], tmp: Path) -> dict[str, Any]:
    layout = write_pcl_layout(fixture, tmp / "dataset_clver")
    clver = checkout / "clver"
    names = {p[k] for s in ("train", "val", "test") for p in pcl_pairs(fixture, s) for k in ("img1", "img2")}
    images = {"img": {n: np.zeros((2, 1, 1), dtype=np.float32) for n in names}}
    out: dict[str, Any] = {"max_len": PCL_MAX_LEN, "dictionary": pcl_dictionary(fixture)}
    with _pcl_code(clver, clver / "config" / "finetune_clver.json"):
        args = importlib.import_module("para").parse_args()
        if args.max_len != PCL_MAX_LEN:
            raise ConfigError(f"their finetune_clver.json has max_len {args.max_len}, the recording expects "
                              f"{PCL_MAX_LEN}", fix="record from an unmodified checkout at the recorded commit")
        utils = importlib.import_module("utils")
        vocabs, rev = utils.load_vocabs(str(layout / "dict.json"))
        fin = pcl._load(clver / "data" / "dataset_finetune_clver.py", "idc_data_eval_finetune")
        pre = pcl._load(clver / "data" / "dataset_pretrain_clver.py", "idc_data_eval_pretrain")
        train = fin.Dataset(args, str(layout / "train.json"), vocabs, rev, images, "train")
        _no_masks(fin, train)
        samples = []
        for i in range(len(train)):
            item = train[i]
            samples.append({"img1": train.datas[i]["img1"], "img2": train.datas[i]["img2"],
                            "cap": item["cap"].tolist(), "diff_label": int(item["diff_label"])})
        out["train"] = samples
        # the pre-training Dataset pads the same sentences (its own copy of the code); task "fda" adds no mask
        pretrain = pre.Dataset(args, "fda", train.datas, images, vocabs, rev, "train")
        out["pretrain_caps"] = [pretrain.padding(d["sentences"])[0].tolist() for d in train.datas]
        for split in ("val", "test"):
            ds = fin.Dataset(args, str(layout / f"{split}.json"), vocabs, rev, images, split)
            out[split] = {ds[i][3]: ds[i][2] for i in range(len(ds))}
        out["probes"] = [train.padding(p.split(" "))[0].tolist() for p in fixture["probes"]]
        # their selection scorer (clver/eval.py: CIDEr only), on the val candidates, as Inference() calls it
        selection = pcl._load(clver / "eval.py", "idc_data_eval_clver_eval")
        val_cands = {authors_image_id(k): [c] for k, c in fixture["candidates"]["val"].items()}
        val_refs = {k: out["val"][k] for k in val_cands}
        out["selection"] = {k: float(v) for k, v in selection.Evaluator(val_refs, val_cands).evaluate().items()}
    out["test_scores"] = _pcl_test_scores(checkout, fixture, out["test"], tmp)
    return out


def _pcl_test_scores(checkout: Path, fixture: Mapping[str, Any], references: Mapping[str, list[str]],
                     tmp: Path) -> dict[str, float]:
    """Their ``eval/eval.py`` Evaluator on the test candidates. Their METEOR wrapper expects meteor-1.5.jar (and
    its data) beside it, which their repository does not ship: a copy of their ``eval/`` gets pycocoevalcap's."""
    folder = tmp / "idc_eval"
    shutil.copytree(checkout / "eval", folder)
    jar_dir = Path(importlib.util.find_spec("pycocoevalcap.meteor.meteor").origin).parent
    shutil.copy(jar_dir / "meteor-1.5.jar", folder / "meteor" / "meteor-1.5.jar")
    shutil.rmtree(folder / "meteor" / "data")
    shutil.copytree(jar_dir / "data", folder / "meteor" / "data")
    cands = {authors_image_id(k): [c] for k, c in fixture["candidates"]["test"].items()}
    refs = {k: references[k] for k in cands}
    with _pcl_code(folder, checkout / "clver" / "config" / "finetune_clver.json"):
        evaluator = pcl._load(folder / "eval.py", "idc_data_eval_eval").Evaluator(refs, cands)
        evaluator.evaluate()
        scores = {k: float(v) for k, v in evaluator.eval.items()}
    return scores


# -- CLIP4IDC --------------------------------------------------------------------------------------------------
def clip4idc_outputs(fixture: Mapping[str, Any], tokenizer: Any) -> dict[str, list[list[int]]]:
    """Fixed greedy outputs (ids after SOT) for the test pairs: each candidate caption's BPE ids, then EOT, then
    words that must be cut off; 32 ids a row, as their greedy loop returns."""
    eot = tokenizer.encoder["<|endoftext|>"]
    tail = tokenizer.encode("there is")
    rows = {}
    for pid, caption in fixture["candidates"]["test"].items():
        ids = tokenizer.encode(caption)
        ids = (ids + [eot] + tail + [0] * CLIP4IDC_MAX_WORDS)[:CLIP4IDC_MAX_WORDS]
        rows[pid] = ids
    return rows


def decode_probes(tokenizer: Any) -> list[list[int]]:
    """Greedy outputs that test the decoding's cut: '!' (id 0) mid-caption, a token holding '!' that is not id 0,
    EOT after a word, and nothing to cut."""
    enc = tokenizer.encode
    eot = tokenizer.encoder["<|endoftext|>"]
    return [enc("the cube moved") + [0] + enc("away"), enc("the cube moved!! away"), enc("no change") + [eot]
            + enc("more"), enc("the red sphere is gone"), [eot] + enc("late words")]


def _record_clip4idc(checkout: Path, fixture: Mapping[str, Any], tmp: Path) -> dict[str, Any]:
    root = write_official_layout(fixture, tmp / "clevr-change")
    out: dict[str, Any] = {"max_words": CLIP4IDC_MAX_WORDS}
    with clip4idc._authors_code(checkout):
        tokenizer = importlib.import_module("modules.tokenization_clip").SimpleTokenizer()
        retrieval = importlib.import_module("dataloaders.dataloader_clevr_retrieval").CLEVR_DataLoader
        caption = importlib.import_module("dataloaders.dataloader_clevr_caption").CLEVR_DataLoader
        eval_utils = importlib.import_module("preprocess.eval_utils")
        main = importlib.import_module("main_task_caption")
        for split in ("train", "val", "test"):
            r = retrieval(split, str(root), str(root), tokenizer, max_words=CLIP4IDC_MAX_WORDS)
            texts = [{"image_id": int(img), "caption": cap,
                      "ids": r._get_text(img, cap)[0][0].tolist()} for img, cap in
                     (r.sentences_dict[i] for i in range(len(r)))]
            c = caption(split, str(root), str(root), tokenizer, max_words=CLIP4IDC_MAX_WORDS)
            caps = []
            for img, change in (c.sentences_dict[i] for i in range(len(c))):
                name = default_name(int(img))
                for kind, texts_of in (("change", change), ("no_change", c.no_change_captions[name])):
                    for cap in texts_of:
                        _, _, _, inp, mask, target = c._get_text(img, cap)
                        caps.append({"image_id": int(img), "kind": kind, "caption": cap, "input": inp[0].tolist(),
                                     "mask": mask[0].tolist(), "target": target[0].tolist()})
            out[split] = {"retrieval": texts, "retrieval_cut_off_points": list(r.cut_off_points), "caption": caps}
        probe = out["probes"] = []
        for text in fixture["probes"]:
            ids = r._get_text(0, text)[0][0].tolist()
            _, _, _, inp, mask, target = c._get_text(0, text)
            probe.append({"caption": text, "retrieval": ids, "input": inp[0].tolist(), "mask": mask[0].tolist(),
                          "target": target[0].tolist()})
        out["evaluation"] = _clip4idc_eval(main, eval_utils, tokenizer, fixture, root, tmp)
    return out


def _clip4idc_eval(main: types.ModuleType, eval_utils: types.ModuleType, tokenizer: Any,
                   fixture: Mapping[str, Any], root: Path, tmp: Path) -> dict[str, Any]:
    """Their ``eval_epoch`` on fixed greedy outputs (their ``greedy_decode`` answers with them), and their
    per-type / per-subset scoring of the result file it writes."""
    gt_dir, out_dir = tmp / "gt", tmp / "out"
    gt_dir.mkdir()
    out_dir.mkdir()
    gt = gt_dir / "clevr_total_change_captions_reformat.json"
    eval_utils.merge_gt_files(str(root / "change_captions.json"), str(root / "no_change_captions.json"), str(gt))
    rows = clip4idc_outputs(fixture, tokenizer)
    names = [f"{i:06d}.png" for i in fixture["splits"]["test"]]
    queue = iter([[rows[n] for n in names], [rows[n + "_n"] for n in names]])
    seen: dict[str, Any] = {}
    real_score = main.score_generation

    def score_generation(anno_file, result_file):
        seen["total"] = real_score(anno_file, result_file)
        return seen["total"]

    zeros = torch.zeros(len(names), 1)
    batch = [zeros] * 13 + [names]
    args = types.SimpleNamespace(datatype=AUTHORS_CLEVR, output_dir=str(out_dir), gt_dir=str(gt_dir),
                                 max_words=CLIP4IDC_MAX_WORDS)
    saved = main.greedy_decode, main.score_generation, getattr(main, "logger", None)
    main.greedy_decode = lambda *a, **k: next(queue)
    main.score_generation = score_generation
    main.logger = logging.getLogger("clip4idc_authors_eval")
    try:
        cider = main.eval_epoch(args, torch.nn.Module(), [batch], tokenizer, "cpu", 1, epoch=0)
    finally:
        main.greedy_decode, main.score_generation, main.logger = saved
    hyp = out_dir / "hyp_ep_0.json"
    results = {r["image_id"]: r["caption"] for r in json.loads(hyp.read_text())}
    # their per-type scorer builds pycocoevalcap's COCOEvalCap, which adds SPICE (a CoreNLP download): their own
    # EvalCap (main_task_caption.py, the same scorers without SPICE) stands in, as their captioning evaluates
    saved_eval = eval_utils.COCOEvalCap
    eval_utils.COCOEvalCap = main.EvalCap
    try:
        by_type = eval_utils.score_generation_by_type(str(gt), str(hyp), str(root / "type_mapping.json"))
        semantic = eval_utils.score_generation_with_ids(str(gt), str(hyp), [n for n in results if "_n" not in n])
        distractor = eval_utils.score_generation_with_ids(str(gt), str(hyp), [n for n in results if "_n" in n])
    finally:
        eval_utils.COCOEvalCap = saved_eval
    type_ids = json.loads((root / "type_mapping.json").read_text())
    # the decoding alone, on outputs that test its cut (scoring them would need references: a stub answers)
    probes = decode_probes(tokenizer)
    queue = iter([probes, probes])
    probe_names = [f"{i:06d}.png" for i in range(len(probes))]
    main.greedy_decode = lambda *a, **k: next(queue)
    main.score_generation = lambda *a, **k: dict.fromkeys(("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L",
                                                          "CIDEr"), 0.0)
    main.logger = logging.getLogger("clip4idc_authors_eval")
    try:
        zeros = torch.zeros(len(probe_names), 1)
        main.eval_epoch(args, torch.nn.Module(), [[zeros] * 13 + [probe_names]], tokenizer, "cpu", 1, epoch=1)
    finally:
        main.greedy_decode, main.score_generation, main.logger = saved
    probe_out = {r["image_id"]: r["caption"] for r in json.loads((out_dir / "hyp_ep_1.json").read_text())}
    decoded = [{"ids": ids, "caption": probe_out[name]} for ids, name in zip(probes, probe_names)]
    return {"outputs": rows, "results": results, "selection_CIDEr": float(cider),
            "total": _floats(seen["total"]), "semantic": _floats(semantic), "distractor": _floats(distractor),
            "by_type": {t: _floats(v) for t, v in by_type.items()},
            "type_ids": {t: sorted(set(ids) & set(results)) for t, ids in type_ids.items()},
            "decode_probes": decoded}


def _floats(scores: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in scores.items()}


# -- the recording ---------------------------------------------------------------------------------------------
def record(idc: str | Path | None, clip4idc_checkout: str | Path | None, out: str | Path,
           fixture: str | Path = FIXTURE) -> Path:
    """``out``/data_eval_record.json from either or both checkouts (a part not given keeps what the file holds)."""
    out = Path(out)
    fx = load_fixture(fixture)
    path = out / RECORD_NAME
    doc = json.loads(path.read_text()) if path.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        if idc is not None:
            idc = Path(idc).resolve()
            (Path(tmp) / "pcl").mkdir()
            doc["idc_pcl"] = {"commit": checkout_commit(idc), **_record_pcl(idc, fx, Path(tmp) / "pcl")}
        if clip4idc_checkout is not None:
            c = Path(clip4idc_checkout).resolve()
            (Path(tmp) / "c4").mkdir()
            doc["clip4idc"] = {"commit": checkout_commit(c), **_record_clip4idc(c, fx, Path(tmp) / "c4")}
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    # a list of ids on one line: the file stays short enough to read and to diff
    write_text(path, re.sub(r"\[[\d,\s-]+\]", lambda m: json.dumps(json.loads(m.group(0))), text) + "\n")
    return path

"""Can IDC-PCL's image difference encoder learn to tell a change from a distractor at the cpu size, on its own?

The cpu-profile IDC-PCL never lifts its distractor judge off chance (lab/notes/learnability.md). This script takes the
captioner out of the question: it trains only the judge (``PCL.judge`` over the [IMG1] / [IMG2] outputs of the
single- and pair-image encoders; no words, no cross-modal layers) and prints train loss and val / test accuracy
every 100 steps, in two settings:

- ``data DIR``: the grid features of a SynthCLEVR-Change set (the cpu profile's model, AdamW, batches of 64 random
  training pairs);
- ``toy``: random "features" where a distractor is the before-image plus Gaussian noise on every region
  (``--noise 0``: the very same features) and a change also replaces one of the 49 regions by a fresh vector. A
  model that compares the two images region by region separates these at once; one that does not, never does.

    .venv/bin/python -m lab.scripts.judge_alone data data/synth-cam0.1 --steps 1000 --lr 3e-4 --warmup 100
    .venv/bin/python -m lab.scripts.judge_alone toy --noise 0.1 --lr 1e-3 --steps 3000

Writes ``lab/records/learnability/judge_alone_<setting>.json`` with every logged step. A diagnosis of this kit's
cpu-size model, not an analysis from either paper.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from idckit.fileio import write_json

from lab.scripts import LEARNABILITY as OUT


THROUGH_CROSS = False


def judge_logits(model, f1, f2):
    """The judge on [IMG1; IMG2] of the pair-image encoder, or (``--through-cross``) of the cross-modal layers run
    over the visual tokens alone, which is what the full model's judge reads: under the fine-tuning mask the
    visual tokens never see the text."""
    x = model.encode_visual(f1, f2)
    if THROUGH_CROSS:
        x = model._cross(x, None)
    n = model.cfg.n_regions
    return model.judge(torch.cat([x[:, 0], x[:, 1 + n]], -1))


def toy_set(m: int, n: int, fd: int, noise: float, g: torch.Generator):
    f1 = torch.relu(torch.randn(m, n, fd, generator=g))
    f2 = f1 + noise * torch.randn(m, n, fd, generator=g)
    y = torch.randint(0, 2, (m,), generator=g)
    j = torch.randint(0, n, (m,), generator=g)
    new = torch.relu(torch.randn(m, fd, generator=g))
    f2[y == 1, j[y == 1]] = new[y == 1]
    return f1, f2, y


def mvcl_phase(model, batch, *, steps: int, lr: float, tau: float, seed: int, log) -> list[dict]:
    """MVCL alone before the judge (paper eq. 8 on the visual tokens, as ``--through-cross`` reads them): 15 % of one
    image's regions (at least one) zeroed per pair, their original features recovered contrastively against the
    batch's unmasked regions. At jitter 0 the best guess of a masked region is the same cell of the other image, so
    this is the objective that could teach the encoder to align the two images before the judge needs it."""
    from idckit.losses import mvcl_nce
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g, t0, losses, history = torch.Generator().manual_seed(seed + 1), time.time(), [], []
    n = model.cfg.n_regions
    for step in range(1, steps + 1):
        f1, f2, _ = batch(g)
        b = len(f1)
        scores = torch.rand(b, n, generator=g)
        k = max(1, round(0.15 * n))
        chosen = torch.zeros(b, n, dtype=torch.bool).scatter_(1, scores.topk(k, 1).indices, True)
        which = torch.randint(0, 2, (b,), generator=g)
        regions = torch.zeros(b, 2, n, dtype=torch.bool)
        regions[torch.arange(b), which] = chosen
        x = model.encode_visual(f1, f2, regions)
        if THROUGH_CROSS:
            x = model._cross(x, None)
        visual = torch.stack([x[:, 1:1 + n], x[:, 2 + n:2 + 2 * n]], 1)
        original = torch.stack([f1, f2], 1)
        loss = mvcl_nce(model.mvcl_regress(visual[regions]), original[regions], original[~regions], tau=tau)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0:
            row = {"mvcl_step": step, "mvcl_loss": sum(losses[-100:]) / 100, "seconds": round(time.time() - t0, 1)}
            history.append(row)
            log(row)
    return history


def train(model, batch, evaluate, *, steps: int, lr: float, warmup: int, seed: int, log) -> list[dict]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g, t0, losses, history = torch.Generator().manual_seed(seed), time.time(), [], []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / warmup) if warmup else lr
        f1, f2, y = batch(g)
        loss = F.cross_entropy(judge_logits(model, f1, f2), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0:
            model.eval()
            with torch.no_grad():
                row = {"step": step, "train_loss": sum(losses[-100:]) / 100, **evaluate(),
                       "seconds": round(time.time() - t0, 1)}
            model.train()
            history.append(row)
            log(row)
    return history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("setting", choices=["data", "toy"])
    ap.add_argument("data_root", nargs="?")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--noise", type=float, default=0.1, help="toy: distractor noise per region (0 = identical)")
    ap.add_argument("--pairs", type=int, default=3400, help="toy: training pairs (SynthCLEVR-Change's 2,000 "
                                                             "scenes give 3,400 training pairs)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--through-cross", action="store_true", help="the judge reads the cross-modal layers' "
                                                                  "[IMG1]/[IMG2] (as in the full model)")
    ap.add_argument("--init", default=None, help="start from this IDC-PCL checkpoint (e.g. a pre-training run's "
                                                  "best.pt)")
    ap.add_argument("--mvcl-steps", type=int, default=0, help="MVCL-only steps before the judge")
    ap.add_argument("--tau-mvcl", type=float, default=1.0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting of the cpu profile's model, e.g. --set pair_layers=2")
    ap.add_argument("--runs-dir", default=None)
    a = ap.parse_args()
    global THROUGH_CROSS
    THROUGH_CROSS = a.through_cross
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from idckit.experiments import pcl
    from idckit.models.pcl import PCL
    from idckit.reports.report import git_commit

    overrides = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in a.set)}
    out = {"setting": a.setting, "through_cross": a.through_cross, "overrides": overrides, "steps": a.steps,
           "lr": a.lr, "warmup": a.warmup, "batch_size": a.batch_size, "commit": git_commit()}
    if a.setting == "data":
        from idckit.text.pcl_inputs import load_pcl_data
        from idckit.tasks.pcl import build_config, data_sizes
        s = pcl.setup("cpu", a.data_root, runs_dir=a.runs_dir, progress=False)
        # the judge needs no FDA negatives: the data without them (tagging 8,000 scenes' captions takes a while)
        data = load_pcl_data(s.data.dataset(), s.store, max_len=s.config["max_len"])
        s.config["model"].update(overrides)
        model = PCL(build_config(s.config["model"], **data_sizes(data)), data.vocab)
        train_split = data.splits["train"]

        def batch(g):
            idx = torch.randint(0, len(train_split), (a.batch_size,), generator=g)
            return (*data.pair_features("train", idx), train_split.is_change[idx].long())

        def accuracy(split):
            sp = data.splits[split]
            pred = torch.cat([judge_logits(model, *data.pair_features(split, torch.arange(i, min(i + 256, len(sp)))))
                              .argmax(-1) for i in range(0, len(sp), 256)])
            return float((pred.bool() == sp.is_change.bool()).float().mean())

        evaluate = lambda: {"val": accuracy("val"), "test": accuracy("test")}  # noqa: E731
        name = Path(a.data_root).name
        # the description names the data folder, not where it lay on the machine that ran this
        where = str(Path(a.data_root).resolve().parent) + "/"
        out.update({"data": s.data.description.replace(where, ""), "model": s.config["model"]})
    else:
        n, fd = 49, 1280
        from idckit.experiments.config import load_config, model_config
        settings = {**load_config("pcl", "cpu")["model"], **overrides}     # what the record names
        vocab = {"pad": 0, "bos": 1, "eos": 2, "mask": 3, "img1": 4, "img2": 5, "cls": 6}
        # the cpu profile's model (its sizes and caption length), as in the data setting
        model = PCL(model_config("pcl-cpu", vocab_size=20, feat_dim=fd, n_regions=n, **overrides), vocab)
        g = torch.Generator().manual_seed(0)
        tr, te = toy_set(a.pairs, n, fd, a.noise, g), toy_set(400, n, fd, a.noise, g)

        def batch(g):
            idx = torch.randint(0, a.pairs, (a.batch_size,), generator=g)
            return tr[0][idx], tr[1][idx], tr[2][idx]

        def evaluate():
            return {"test": float((judge_logits(model, te[0], te[1]).argmax(-1) == te[2]).float().mean())}
        name = f"toy_noise{a.noise:g}"
        out.update({"noise": a.noise, "pairs": a.pairs, "model": settings})
    if a.init:
        model.load_pretrained(torch.load(a.init, map_location="cpu", weights_only=True))
        out["init"] = Path(a.init).parent.name
    if a.mvcl_steps:
        out.update({"mvcl_steps": a.mvcl_steps, "tau_mvcl": a.tau_mvcl})
        out["mvcl_history"] = mvcl_phase(model, batch, steps=a.mvcl_steps, lr=a.lr, tau=a.tau_mvcl, seed=0,
                                         log=lambda r: print(r, flush=True))
    out["history"] = train(model, batch, evaluate, steps=a.steps, lr=a.lr, warmup=a.warmup, seed=0,
                           log=lambda r: print(r, flush=True))
    OUT.mkdir(parents=True, exist_ok=True)
    tag = "".join(f"_{k}{v}" for k, v in overrides.items()) + ("_cross" if a.through_cross else "") \
        + (f"_mvcl{a.mvcl_steps}tau{a.tau_mvcl:g}" if a.mvcl_steps else "") \
        + (f"_init-{Path(a.init).parent.name}" if a.init else "")
    path = OUT / f"judge_alone_{name}{tag}_lr{a.lr:g}_s{a.steps}.json"
    write_json(path, out, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

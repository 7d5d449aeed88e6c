"""What a computation ran on: threads, device and library versions, recorded beside its results.

    python -c "from detour.compute import compute_record; print(compute_record())"

A training run (each start and resume, in summary.json) and each fine-tune (in results.json) keep
this record. On CPU two runs of the same data and seed agree bit for bit only when these agree:
another thread count, number of processes, device or library version sums floats in another order.
"""

from __future__ import annotations

# the fields that change float results; where and when a run computed do not
RESULT_FIELDS = ("world_size", "threads", "device", "torch", "transformers")


def compute_record(device=None) -> dict:
    """This process's threads, device (a GPU by name) and library versions."""
    import torch
    import transformers

    from detour import __version__

    device = torch.device(device or "cpu")
    return {"threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            "torch": torch.__version__, "transformers": transformers.__version__, "detour": __version__}


def same_compute(records: list[dict]) -> bool:
    """Whether every record computed alike, in the fields that change float results."""
    return len({tuple(r.get(f) for f in RESULT_FIELDS) for r in records}) <= 1

"""GPU sampling without a GPU: which process holds which GPU, and a clean absence of NVML.

What runs only on a GPU machine: NVML's own numbers (memory, utilisation, compute processes
per GPU). The mapping from those numbers to supervised processes is tested here.
"""

from __future__ import annotations

import json

from grpo_tui.run_files import event_from_json
from grpo_tui.run_state import RunState
from grpo_tui.supervisor.events import GpuSample
from grpo_tui.supervisor.samplers import GpuSampler, gpu_holders, pinned_gpus


def test_pinned_gpus_reads_cuda_visible_devices() -> None:
    assert pinned_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == (4, 5, 6, 7)
    assert pinned_gpus({"CUDA_VISIBLE_DEVICES": "GPU-1a2b,3"}) == (3,)
    assert pinned_gpus({}) == ()


def test_holders_are_pinned_processes_and_trees_with_memory_on_the_gpu() -> None:
    on_gpu = {
        0: {101: 40 << 30, 102: 40 << 30},  # two trainer ranks (pids of the trainer's tree)
        1: {},
        2: {300: 70 << 30},  # vLLM's worker, a descendant of the inference process
        3: {999: 1 << 30},  # a process that is not ours
    }
    trees = {"trainer": {100, 101, 102}, "inference": {299, 300}, "api": {50}}
    pinned = {"trainer": (0, 1), "inference": (2,), "api": ()}
    assert gpu_holders(on_gpu, trees, pinned) == {
        0: ("trainer",),
        1: ("trainer",),  # pinned there, nothing allocated yet
        2: ("inference",),
        3: (),
    }
    # unpinned processes are still found by their memory
    assert gpu_holders({0: {300: 1}}, trees, {}) == {0: ("inference",)}


def test_without_nvml_the_gpu_part_is_absent() -> None:
    sampler = GpuSampler()
    if sampler.available:  # a GPU machine: NVML answers, one sample per GPU
        gpus, per_gpu = sampler.sample()
        assert [g.index for g in gpus] == sorted(per_gpu)
        return
    assert sampler.sample() == ([], {})


def test_gpu_samples_keep_their_holders_in_the_state_and_the_run_files() -> None:
    sample = GpuSample(
        t=1.0,
        index=3,
        name="H200",
        memory_used_bytes=50_000_000_000,
        memory_total_bytes=140_000_000_000,
        utilization_percent=87.0,
        holders=("inference", "trainer"),
    )
    record = json.loads(json.dumps(sample.to_json()))
    restored = event_from_json(record)
    assert restored == sample
    state = RunState("gpus")
    state.apply(sample)
    assert state.gpus[3].holders == ("inference", "trainer")
    assert state.gpus[3].utilization_percent == 87.0

"""benchmarks/gpu_workload.py without a GPU: what its one device call depends on.

The profiles of every grpo-tui part go through the real role layer (GPU pinning, the
synchronous and overlapped queue bounds, fixed-length sampling), the task gives exactly
128-token prompts and rewards that differ within a group, and the report keeps parts that
did not run and judges the issue's targets from the numbers.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_workload  # noqa: E402
from model_shapes import qwen2_config  # noqa: E402
from workload_task import PROMPT_CHARS, Workload  # noqa: E402

from grpo_trainer.models import build_tiny_tokenizer  # noqa: E402
from grpo_tui.plan.profile import load_profile  # noqa: E402
from grpo_tui.plan.roles import build_plan  # noqa: E402


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


ONE_GPU_PARTS = [p for p in gpu_workload.GRPO_PARTS if p not in gpu_workload.TWO_GPU_PARTS]


def part_specs(tmp_path: Path, device: str, part: str, size: str = "1.5b") -> dict:
    """The role layer's process specs of one part's profile on ``device``."""
    args = gpu_workload.parse_args(["--size", size, "--device", device, "--out", "x"])
    args.model = tmp_path / "model"
    qwen2_config(args.shape).save_pretrained(args.model)  # the config is what check reads
    mode, bound = gpu_workload.GRPO_PARTS[part]
    body = gpu_workload.profile_for(args, part, mode, bound, [8100, 8101], tmp_path / "runs")
    path = tmp_path / "p.toml"
    path.write_text(gpu_workload.tomli_w.dumps(body))
    return {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}


@pytest.mark.parametrize("part", ONE_GPU_PARTS)
def test_part_profile_pins_its_gpu_and_fixes_the_work(tmp_path: Path, part: str) -> None:
    mode, bound = gpu_workload.GRPO_PARTS[part]
    specs = part_specs(tmp_path, "cuda:1", part)
    for role in ("inference", "trainer"):
        assert specs[role].env["CUDA_VISIBLE_DEVICES"] == "1"  # the other lane's GPU is 0
        assert specs[role].env["NCCL_NVLS_ENABLE"] == "0"
    assert flag(specs["api"].command, "--max-batches-offpolicy") == str(bound)
    env = specs["env"].command
    assert (flag(env, "--max-tokens"), flag(env, "--ignore-eos")) == ("256", "true")
    assert flag(env, "--max-concurrency") == "64"  # the whole batch in flight
    trainer = specs["trainer"].command
    batch = int(flag(trainer, "--batch-size")) * int(flag(trainer, "--gradient-accumulation-steps"))
    assert batch == 512 and flag(trainer, "--seq-len") == str(PROMPT_CHARS + 256)
    assert flag(trainer, "--weight-bridge-mode") == mode
    assert "--kv-cache-memory-bytes" in specs["inference"].command


@pytest.mark.parametrize("part", gpu_workload.TWO_GPU_PARTS)
def test_two_gpu_parts_place_the_roles_and_keep_the_global_batch(tmp_path: Path, part: str):
    """split: trainer on the lane's first GPU, vLLM alone on the second, NCCL, one step of
    overlap; colocate2: 2 ranks and 2 vLLM replicas on both. Same 512 x (128 + 256) step."""
    specs = part_specs(tmp_path, "cuda:2+3", part, size="0.5b")
    trainer, served = specs["trainer"].command, specs["inference"].command
    visible = {role: specs[role].env["CUDA_VISIBLE_DEVICES"] for role in ("trainer", "inference")}
    for role in ("inference", "trainer"):
        env = specs[role].env
        assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"]) == ("0", "1")
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    if part == "split":
        assert visible == {"trainer": "2", "inference": "3"}
        assert flag(trainer, "--weight-bridge-mode") == "shared_vllm"
        assert "--data-parallel-size" not in served
        assert flag(specs["api"].command, "--max-batches-offpolicy") == "1"
    else:
        assert visible == {"trainer": "2,3", "inference": "2,3"}
        assert flag(trainer, "--nproc-per-node") == "2"
        assert flag(trainer, "--weight-bridge-mode") == "colocate"
        assert flag(served, "--data-parallel-size") == "2" and "--enable-sleep-mode" in served
        assert flag(specs["api"].command, "--max-batches-offpolicy") == "0"
    batch = int(flag(trainer, "--batch-size")) * int(flag(trainer, "--gradient-accumulation-steps"))
    assert batch == 512 and flag(trainer, "--seq-len") == str(PROMPT_CHARS + 256)
    env = specs["env"].command
    assert (flag(env, "--max-tokens"), flag(env, "--ignore-eos")) == ("256", "true")


def test_split_sends_weights_over_nccl(tmp_path: Path) -> None:
    args = gpu_workload.parse_args(["--device", "cuda:0+1", "--out", "x"])
    assert gpu_workload.inference_table(args, 8101, "split")["weight_transfer"] == "nccl"
    assert gpu_workload.placement(args, "split") == ([0], [1])
    assert gpu_workload.placement(args, "sync") == ([0], [0])  # one-GPU parts: the first


def test_a_lane_names_one_gpu_or_two_different_ones() -> None:
    assert gpu_workload.parse_args(["--device", "cuda:3+1", "--out", "x"]).gpus == [3, 1]
    for bad in ("cuda:1+1", "cuda:0+1+2"):
        with pytest.raises(SystemExit):
            gpu_workload.parse_args(["--device", bad, "--out", "x"])


def test_two_gpu_report_gives_tokens_per_gpu_and_judges_colocate2_against_split() -> None:
    args = gpu_workload.parse_args(["--device", "cuda:0+1", "--out", "x"])
    args.params = 494e6
    parts = [
        gpu_workload.Part("split", "split", status="ok", step_times=[10.0, 10.0], gpus=[0, 1]),
        gpu_workload.Part("colocate2", "c2", status="ok", step_times=[7.0, 7.0], gpus=[0, 1]),
    ]
    text = gpu_workload.markdown(args, parts, {"device": "H200"})
    per_gpu = 512 * 256 / 7.0 / 2
    assert f"| colocate2 | c2 | 0+1 | ok | 2 | 7.00 | {2 * per_gpu:,.0f} | {per_gpu:,.0f} |" in text
    assert "colocate2 tok/s per GPU / split tok/s per GPU: 1.43 (goal 1.3) -> met" in text
    missing = gpu_workload.markdown(args, parts[:1], {"device": "H200"})
    assert "colocate2 tok/s per GPU / split tok/s per GPU: not measured" in missing


def test_prompts_are_128_tokens_and_rewards_differ_in_a_group() -> None:
    tokenizer = build_tiny_tokenizer(vocab_size=151936)
    task = Workload(seed=0)
    rng = random.Random(0)
    for _ in range(5):
        assert len(tokenizer.encode(task.sample(rng).text)) == PROMPT_CHARS
    sampled = random.Random(1)
    group = [[sampled.randrange(len(tokenizer)) for _ in range(256)] for _ in range(8)]
    scores = {task.score(task.sample(rng), tokenizer.decode(ids)) for ids in group}
    assert len(scores) > 1 and all(0 < s < 1 for s in scores)


def test_report_keeps_what_did_not_run_and_judges_the_targets() -> None:
    args = gpu_workload.parse_args(["--out", "x"])
    args.params = 494e6
    floor = gpu_workload.Part("floor", "floor", status="ok", step_times=[10.0])
    floor.extra = {"sum_s": 10.0, "max_s": 6.0, "generate_s": 4.0, "train_s": 6.0}
    parts = [
        floor,
        gpu_workload.Part("sync", "ours", status="ok", step_times=[11.0, 11.4, 11.2]),
        gpu_workload.Part("trl", "TRL", status="ok", step_times=[16.0, 16.0]),
        gpu_workload.Part("overlap", "ours", status="ok", step_times=[8.0, 8.0]),
        gpu_workload.Part("lora", "ours"),  # never started: out of time
    ]
    text = gpu_workload.markdown(args, parts, {"device": "H200"})
    assert "| lora | ours | - | not run: out of time | 0 |" in text
    assert "colocate2" not in text  # no two-GPU part here: no verdict about one
    assert "sync step / floor sum: 1.12 (goal 1.15) -> met" in text
    assert "overlap step / floor max: 1.33 (goal 1.15) -> NOT met" in text
    assert "TRL tok/s: 2.00 (goal 1.3) -> met" in text  # TRL 16 s vs our best 8 s
    assert f"{512 * 256 / 11.2:,.0f}" in text  # end-to-end completion tokens/s of sync


def test_combine_merges_a_sizes_lanes_and_judges_them_against_one_floor(tmp_path: Path) -> None:
    """Lanes of one size (its parts spread over GPUs in one call) make one table: the lora
    row on GPU 1 is compared with the floor of GPU 0, TRL with GPU 0's overlap."""
    floor = gpu_workload.Part("floor", "floor", status="ok", step_times=[10.0])
    floor.extra = {"sum_s": 10.0, "max_s": 6.0}
    lanes = {
        0: [floor, gpu_workload.Part("overlap", "ours", status="ok", step_times=[6.6, 6.6])],
        1: [
            gpu_workload.Part("trl", "TRL", status="ok", step_times=[13.2]),
            gpu_workload.Part("lora", "ours", status="ok", step_times=[12.0]),
        ],
    }
    paths = []
    for gpu, parts in lanes.items():
        args = gpu_workload.parse_args(["--out", str(tmp_path / f"lane-{gpu}"), "--device",
                                        f"cuda:{gpu}"])  # fmt: skip
        args.params = 494e6
        args.out.mkdir()
        gpu_workload.save(args, parts, {"device": "H200"}, args.out)
        paths.append(args.out / "gpu_workload_0.5b.json")
    text = gpu_workload.combine(paths)
    assert text.count("## qwen2.5-0.5b") == 1 and "H200, GPU 0, 1" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| floor", "| trl", "| overlap", "| lora"]
    assert "| lora | ours | 1 | ok | 1 | 12.00 |" in text and "1.20x sum" in text
    assert "overlap step / floor max: 1.10 (goal 1.15) -> met" in text
    assert "TRL tok/s: 2.00 (goal 1.3) -> met" in text

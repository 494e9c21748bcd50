"""benchmarks/gpu_workload.py without a GPU: what its one device call depends on.

The profiles of every grpo-tui part go through the real role layer (GPU pinning, the
synchronous and overlapped queue bounds, fixed-length sampling), the task gives exactly
128-token prompts and rewards that differ within a group, and the report keeps parts that
did not run and judges the issue's targets from the numbers.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_workload  # noqa: E402
from model_shapes import qwen2_config  # noqa: E402
from workload_report import Part, combine, markdown, save  # noqa: E402
from workload_task import PROMPT_CHARS, Workload  # noqa: E402

from grpo_trainer.models import build_tiny_tokenizer  # noqa: E402
from grpo_tui.plan.profile import load_profile  # noqa: E402
from grpo_tui.plan.roles import build_plan  # noqa: E402


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


GRPO = gpu_workload.GRPO_PARTS
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


@pytest.mark.parametrize("part", [p for p in gpu_workload.TWO_GPU_PARTS if p in GRPO])
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


def test_trl_runs_get_our_kv_cache_and_cuda_graphs_and_differ_only_where_named() -> None:
    """TRL at its best turns the IS correction off, its defaults keep it; the async run is
    AsyncGRPOTrainer at staleness 1 with its vLLM on the lane's second GPU."""
    args = gpu_workload.parse_args(["--device", "cuda:2+3", "--out", "x"])
    args.model = Path("m")
    best, default, async_ = (gpu_workload.trl_argv(args, p, Path("o")) for p in
                             ("trl-best", "trl", "trl-async"))  # fmt: skip
    assert "--no-is-correction" in best and "--no-is-correction" not in default
    for argv in (best, default, async_):
        assert flag(argv, "--kv-cache-gib") == "16" and "--enforce-eager" not in argv
        assert flag(argv, "--steps") == "11"  # 10 counted
    assert (flag(async_, "--mode"), flag(async_, "--max-staleness")) == ("async", "1")
    assert gpu_workload.placement(args, "trl-async") == ([2], [3])
    eager = gpu_workload.parse_args(["--device", "cuda:0", "--out", "x", "--eager"])
    eager.model = Path("m")
    assert "--enforce-eager" in gpu_workload.trl_argv(eager, "trl", Path("o"))


def test_a_lane_names_one_gpu_or_two_different_ones() -> None:
    assert gpu_workload.parse_args(["--device", "cuda:3+1", "--out", "x"]).gpus == [3, 1]
    for bad in ("cuda:1+1", "cuda:0+1+2"):
        with pytest.raises(SystemExit):
            gpu_workload.parse_args(["--device", bad, "--out", "x"])


def run(part: str, steps: list[float], gpu: int = 0, repeat: int = 0, **kw) -> Part:
    return Part(part, part, status="ok", step_times=steps, gpu=gpu, repeat=repeat, **kw)


def test_two_gpu_report_gives_tokens_per_gpu_and_judges_colocate2_against_split() -> None:
    args = gpu_workload.parse_args(["--device", "cuda:0+1", "--out", "x"])
    args.params = 494e6
    parts = [run("split", [10.0, 10.0], gpus=[0, 1]), run("colocate2", [7.0, 7.0], gpus=[0, 1])]
    text = markdown(args, parts, {"device": "H200"})
    per_gpu = 512 * 256 / 7.0 / 2
    assert f"| colocate2 | colocate2 | 1 (0+1) | 2 | 7.00 | 7.00-7.00 | {2 * per_gpu:,.0f} | " \
        f"{per_gpu:,.0f} |" in text  # fmt: skip
    assert "split step / colocate2 step: 1.43 (range 1.43-1.43, 1 pairs), goal >= 1.3" in text
    missing = markdown(args, parts[:1], {"device": "H200"})
    assert "split step / colocate2 step: not measured" in missing


def test_ratios_pair_runs_on_the_same_gpu_and_a_goal_needs_the_whole_range() -> None:
    """Two lanes of alternating sync / trl-best runs: every ratio is taken on one GPU and
    repeat; one pair below 1.15 fails the goal although the median clears it."""
    args = gpu_workload.parse_args(["--out", "x"])
    args.params = 494e6
    runs = [
        run("sync", [10.0] * 10, gpu=0), run("trl-best", [12.0] * 10, gpu=0),
        run("sync", [11.0] * 10, gpu=0, repeat=1), run("trl-best", [13.5] * 10, gpu=0, repeat=1),
        run("sync", [8.0] * 10, gpu=1), run("trl-best", [9.0] * 10, gpu=1),  # a faster GPU
    ]  # fmt: skip
    text = markdown(args, runs, {"device": "H100"})
    assert "| sync | sync | 3 (0, 0, 1) | 30 | 10.00 | 8.00-11.00 |" in text
    line = next(x for x in text.splitlines() if "TRL colocate at its best" in x)
    assert "1.20 (range 1.12-1.23, 3 pairs), goal >= 1.15 over the whole range -> NOT met" in line
    runs[-1].step_times = [9.5] * 10  # the third pair clears it too: 1.19
    assert "1.20 (range 1.19-1.23, 3 pairs)" in markdown(args, runs, {"device": "H100"})
    assert "-> met" in markdown(args, runs, {"device": "H100"}).split("at its best")[1][:200]


def test_report_keeps_what_did_not_run_and_judges_the_floor_goals() -> None:
    args = gpu_workload.parse_args(["--out", "x"])
    args.params = 494e6
    floor = run("floor", [10.0])
    floor.extra = {"sum_s": 10.0, "max_s": 6.0, "generate_s": 4.0, "train_s": 6.0}
    parts = [
        floor,
        run("sync", [8.8, 8.9, 9.0]),
        run("trl-best", [16.0, 16.0]),
        run("overlap", [8.0, 8.0]),
        Part("lora", "ours", gpu=0),  # never started: out of time
    ]
    text = markdown(args, parts, {"device": "H200"})
    assert "| lora | - | 0.1 | 0 | - | not run: out of time | 0 |" in text
    assert "colocate2" not in text  # no two-GPU part here: no verdict about one
    assert "sync step / floor sum (same GPU): 0.89 (range 0.89-0.89, 1 pairs), goal <= 0.9" in text
    assert "overlap step / floor max (same GPU): 1.33" in text and "NOT met" in text
    assert "TRL colocate at its best (IS correction off) step / ours synchronous step: 1.80" in text
    assert f"{512 * 256 / 8.9:,.0f}" in text  # end-to-end completion tokens/s of sync
    assert "start-up = from the command's start to the end of the first optimizer step" in text


def test_combine_merges_a_sizes_lanes_and_pairs_within_each_lane(tmp_path: Path) -> None:
    """Lanes of one size (its runs spread over GPUs in one call) make one table; a ratio
    pairs runs of the same lane only: GPU 0's sync with GPU 0's TRL, not GPU 1's."""
    lanes = {
        0: [run("sync", [10.0], gpu=0), run("trl-best", [12.0], gpu=0)],
        1: [run("trl-best", [13.0], gpu=1), run("sync", [10.0], gpu=1)],
    }
    paths = []
    for gpu, parts in lanes.items():
        args = gpu_workload.parse_args(["--out", "x", "--device", f"cuda:{gpu}"])
        args.params = 494e6
        paths.append(tmp_path / f"lane-{gpu}.json")
        save(args, parts, {"device": "H100"}, paths[-1])
    text = combine(paths)
    assert text.count("## qwen2.5-0.5b") == 1 and "H100, GPU 0, 1" in text
    assert "| sync | sync | 2 (0, 1) | 2 | 10.00 | 10.00-10.00 |" in text
    assert "step / ours synchronous step: 1.25 (range 1.20-1.30, 2 pairs)" in text


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


STALE_STEP = 1000.0
"""The step interval of the planted leftover run: no real run on this machine takes it."""


def plant_leftover_run(run_dir: Path, steps: int = 11) -> None:
    """What an earlier call's ``sync`` run leaves on a warm machine: a run folder whose
    trainer logged ``steps`` optimizer steps, ``STALE_STEP`` s apart."""
    run_dir.mkdir(parents=True)
    lines = [
        {"type": "metrics", "process": "trainer", "step": i + 1, "t": 1.0e6 + STALE_STEP * i,
         "data": {"step_time": 1.0, "reward/mean": 0.5}}
        for i in range(steps)
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text(
        "".join(gpu_workload.json.dumps(x) + "\n" for x in lines)
    )


def test_a_lane_never_reuses_an_earlier_calls_run(tmp_path: Path) -> None:
    """Issue 39, call 2: on a warm machine the lane found the previous call's ``sync`` run
    in its work folder, counted its 11 steps as its own, and paired them with a new TRL
    run. Here an earlier call's runs lie in every folder a lane of this size could look
    (the old shared layout and a per-call one); a real ``sync`` run of a new call (CPU,
    built-in server) reports only its own steps, or none, never the planted ones."""
    work = tmp_path / "lane" / "work-0.5b"
    plant_leftover_run(work / "sync-0" / "runs" / "sync-20261129-000000")
    plant_leftover_run(work / "20261129T000000Z" / "sync-0" / "run")
    out = tmp_path / "lane.json"
    argv = ["--quick", "--parts", "sync", "--out", str(tmp_path / "lane"), "--json", str(out)]
    argv += ["--budget", "120", "--steps", "3"]  # the call's id: its own, by default
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_workload.py"), *argv],
        capture_output=True, text=True, cwd=REPO, timeout=400,
    )  # fmt: skip
    raw = gpu_workload.json.loads(out.read_text())
    (part,) = raw["parts"]
    assert part["part"] == "sync", done.stdout[-2000:]
    assert STALE_STEP not in part["step_times"], part
    assert all(t < 100 for t in part["step_times"]), part  # real CPU steps, seconds apart
    call = part["call"]
    assert call and call != "20261129T000000Z" and raw["facts"]["call"] == call
    if part["status"] == "ok":  # it ran to its steps: they came from its own run folder
        assert len(part["step_times"]) == 2 and len(part["extra"]["step_ends"]) == 3
    assert (work / call / "sync-0" / "run" / "events.jsonl").is_file()


def test_passes_swap_the_order_so_a_pair_runs_both_ways() -> None:
    assert gpu_workload.run_order(["sync", "trl-best"], 3, "swap") == [
        (0, 0, "sync"), (0, 1, "trl-best"),
        (1, 0, "trl-best"), (1, 1, "sync"),
        (2, 0, "sync"), (2, 1, "trl-best"),
    ]  # fmt: skip
    same = gpu_workload.run_order(["sync", "trl-best"], 2, "same")
    assert [name for _, _, name in same] == ["sync", "trl-best", "sync", "trl-best"]


def test_ratios_pair_runs_of_one_call_and_count_both_orders() -> None:
    """Two calls on the same GPU, each one pass: a ratio never pairs a run of one call with
    a run of the other (call 2 of issue 39 did), and the line says which ran first."""
    args = gpu_workload.parse_args(["--out", "x"])
    args.params = 494e6
    runs = [
        run("sync", [10.0] * 3, call="A", position=0),
        run("trl-best", [13.0] * 3, call="A", position=1),
        run("trl-best", [12.0] * 3, call="B", position=0),
        run("sync", [11.0] * 3, call="B", position=1),
        run("trl-best", [30.0] * 3, call="C"),  # TRL alone in its call: paired with nothing
    ]
    line = next(x for x in markdown(args, runs, {}).splitlines() if "at its best" in x)
    assert "1.20 (range 1.09-1.30, 2 pairs)" in line  # not 3.0: C's TRL has no sync
    assert "[orders: 1 with sync first, 1 with trl-best first]" in line


def test_a_run_that_found_its_gpu_busy_pairs_with_nothing_and_the_report_says_so() -> None:
    args = gpu_workload.parse_args(["--out", "x"])
    args.params = 494e6
    busy = {"gpus": [0], "status": "not empty", "waited_s": 90.0, "used_mib": {"0": 4096.0},
            "processes": ["GPU 0 pid 77 VLLM::EngineCore 3900 MiB"]}  # fmt: skip
    empty = {"gpus": [0], "status": "empty", "waited_s": 2.5, "used_mib": {"0": 530.0},
             "processes": []}  # fmt: skip
    runs = [
        run("sync", [10.0], position=0, extra={"gpu_before": empty}),
        run("trl-best", [13.0], position=1, extra={"gpu_before": busy}),
    ]
    text = markdown(args, runs, {})
    assert "1 of 2 runs found them empty (longest wait 2.5 s)" in text
    assert "paired with nothing: trl-best #0 (not empty (4.0 GiB used, waited 90.0 s; " \
        "GPU 0 pid 77 VLLM::EngineCore 3900 MiB))" in text  # fmt: skip
    assert "TRL colocate at its best (IS correction off) step / ours synchronous step: " \
        "not measured" in text  # fmt: skip
    assert "| sync | - | 0.1 | 0 | empty (0.5 GiB used, waited 2.5 s) | ok |" in text

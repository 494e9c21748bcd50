"""The environment keeps producing through a SIGKILL and restart of the inference server,
then of the rollout API (same port, same database); afterwards every queued group is
intact and none is duplicated, and the count matches what the environment says it sent."""

from __future__ import annotations

import signal

from env_procs import (
    Trainer,
    api_argv,
    env_argv,
    free_port,
    last_env_metrics,
    serve_argv,
    wait_until,
)

from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer
from grpo_trainer.envs.toy import RepeatDigit

GROUP = 8


def test_env_survives_inference_then_api_restart(spawn, tmp_path, tiny_model) -> None:
    api_port, serve_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    inference = f"http://127.0.0.1:{serve_port}"
    db = tmp_path / "rollouts.db"
    api_cmd = api_argv(api_port, db, "--max-batches-offpolicy", "1000")
    serve_cmd = serve_argv(tiny_model, serve_port)

    api_proc = spawn("api", api_cmd).wait_http(f"{api}/health")
    serve_proc = spawn("serve", serve_cmd).wait_http(f"{inference}/health")
    trainer = Trainer(api, batch_size=GROUP)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs.toy", api, inference, tiny_model, "--group-size",
                 str(GROUP), "--max-concurrency", "2"),
    )  # fmt: skip

    def queued() -> int:
        return trainer.status()["queue_size"]

    wait_until(lambda: queued() >= 3, 60, "the first groups")

    serve_proc.stop(signal.SIGKILL)
    env.wait_line("inference server unreachable")
    assert "inference server reachable again" not in env.text()
    # Another sampling seed: the restarted server would otherwise replay its first samples,
    # and an identical prompt would then produce an identical (but not duplicated) group.
    serve_proc = spawn("serve-2", [*serve_cmd, "--seed", "1"]).wait_http(f"{inference}/health")
    env.wait_line("inference server reachable again")
    after_inference = queued()
    wait_until(lambda: queued() >= after_inference + 3, 60, "groups after inference restart")

    api_proc.stop(signal.SIGKILL)
    env.wait_line("API unreachable")
    spawn("api-2", api_cmd).wait_http(f"{api}/health")
    env.wait_line("API reachable again")
    after_api = queued()
    wait_until(lambda: queued() >= after_api + 3, 60, "groups after API restart")

    env.send_signal(signal.SIGTERM)
    assert env.wait(timeout=30) == 0, env.text()[-3000:]
    metrics = last_env_metrics(env.text())

    groups = []
    while batch := trainer.take():
        groups.extend(batch)
    sent, unconfirmed = metrics["env/groups_sent"], metrics["env/groups_unconfirmed"]
    assert sent <= len(groups) <= sent + unconfirmed
    assert len(groups) >= 9

    keys = [tuple(tuple(seq) for seq in g["tokens"]) for g in groups]
    repeats = [i for i, key in enumerate(keys) if keys.index(key) != i]
    assert not repeats, f"groups {repeats} repeat earlier ones (of {len(keys)})"
    tokenizer = FastTokenizer.from_dir(tiny_model)
    task = RepeatDigit()
    for group in groups:
        prompt_text = tokenizer.decode(group["tokens"][0][:9])
        prompt_ids = tokenizer.encode(prompt_text)
        plen = len(prompt_ids)
        prompt = Prompt(text=prompt_text, answer=prompt_text[-2])
        assert len(group["tokens"]) == len(group["scores"]) == GROUP
        for tokens, masks, logprobs, score in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["scores"],
            strict=True,
        ):  # fmt: skip
            assert tokens[:plen] == prompt_ids
            assert masks == [-100] * plen + tokens[plen:]
            assert logprobs[:plen] == [1.0] * plen
            assert len(logprobs) == len(tokens) and all(lp < 0 for lp in logprobs[plen:])
            assert score == task.score(prompt, tokenizer.decode(tokens[plen:]))
    trainer.close()

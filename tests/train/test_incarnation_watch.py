"""Which inference incarnation the trainer attached to, read from the supervisor's file.

The rollout API holds the environments from inference's "down" until the trainer reports
weights pushed to the incarnation up now, so every way the trainer can meet a new
incarnation must end in a re-attach (a push, then that report), or the run waits forever.
"""

from __future__ import annotations

from pathlib import Path

from grpo_trainer.run_notices import IncarnationWatch, InferenceLife, NoticeWatcher, write_notice


def watch_of(tmp_path: Path) -> tuple[IncarnationWatch, Path]:
    path = tmp_path / "inference.json"
    return IncarnationWatch(NoticeWatcher(path, InferenceLife)), path


def say(path: Path, incarnation: int, up: bool) -> None:
    write_notice(path, InferenceLife(incarnation=incarnation, up=up, pid=100 + incarnation))


def test_the_first_incarnation_of_a_run_is_the_one_attached_at_start(tmp_path: Path) -> None:
    """Started alongside inference, before the supervisor's first word: no re-attach."""
    watch, path = watch_of(tmp_path)
    assert watch.adopt() is None and not watch.restarted()
    say(path, 1, up=True)
    assert not watch.restarted() and watch.attached == 1
    say(path, 1, up=False)
    assert watch.down() and not watch.restarted()
    say(path, 2, up=True)
    assert watch.restarted()
    assert watch.adopt() == 2 and not watch.restarted()


def test_a_trainer_started_while_inference_was_down_re_attaches_to_the_next_one(
    tmp_path: Path,
) -> None:
    """The fault suite's hang (mode none, trainer and inference killed a second apart): the
    new trainer adopted nothing while inference was down and then took incarnation 2 as
    attached without a push, so it never reported 2 and the API held the environments."""
    watch, path = watch_of(tmp_path)
    say(path, 1, up=False)
    assert watch.adopt() is None and watch.down()
    say(path, 2, up=True)
    assert watch.restarted(), "the incarnation up after a down adopt needs a re-attach"
    assert watch.adopt() == 2 and not watch.restarted()

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


def test_a_restart_the_trainer_asked_for_is_followed_by_its_number_not_the_file(
    tmp_path: Path,
) -> None:
    """CI's lora_restart hang: the incarnation a sync restart started (2) died before the
    trainer read the file, whose next word was the crash restart (3, without the synced
    adapter). Taking "the newer one up" as attached, the trainer never re-attached and every
    request of the environments got 404. The supervisor's reply names 2: 3 is a restart."""
    watch, path = watch_of(tmp_path)
    say(path, 1, up=True)
    assert watch.adopt() == 1
    say(path, 3, up=True)
    watch.started(2)
    assert watch.restarted(), "the crash restart after the one asked for needs a re-attach"


def test_a_restart_reply_ahead_of_the_file_waits_for_its_incarnation(tmp_path: Path) -> None:
    """The reply may come before the supervisor's file says the new incarnation is up: the
    trainer waits while it says down, and the incarnation it started is no restart."""
    watch, path = watch_of(tmp_path)
    say(path, 1, up=True)
    assert watch.adopt() == 1
    say(path, 1, up=False)
    watch.started(2)
    assert watch.down() and not watch.restarted()
    say(path, 2, up=True)
    assert not watch.down() and not watch.restarted()

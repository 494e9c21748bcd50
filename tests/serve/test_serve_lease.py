"""A kept server's lease (``grpo_trainer/serve/lease.py``): one run at a time, a second
refused naming the holder, a lease nobody renews expires. The rules on a fake clock, then
the routes on the real built-in server (its own middleware), bad requests included."""

from __future__ import annotations

import httpx
import pytest

from grpo_trainer.serve.lease import LEASE_PATH, LeaseBook, LeaseRequest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_holder_at_a_time_renewed_released_and_expired() -> None:
    clock = Clock()
    book = LeaseBook(clock)
    first = LeaseRequest(holder="host:/runs/a", label="run a", ttl=30)
    second = LeaseRequest(holder="host:/runs/b", label="run b", ttl=30)
    assert book.take(first)
    assert not book.take(second)
    assert "run a (holder host:/runs/a" in book.refusal()
    clock.now += 20
    assert book.take(first)  # a renewal: 30 s from now, held since the first take
    assert book.describe() == {
        "holder": "host:/runs/a",
        "label": "run a",
        "held_for": 20.0,
        "expires_in": 30.0,
    }
    assert not book.release("host:/runs/b")
    clock.now += 29.9
    assert not book.take(second)
    clock.now += 0.2  # nobody renewed: a crashed run frees the server
    assert book.take(second)
    assert book.release("host:/runs/b")
    assert book.describe()["holder"] is None
    assert book.release("anyone")  # nothing held: nothing to refuse


@pytest.fixture
def lease(client: httpx.Client):
    """The shared server's lease routes; the test leaves the lease free."""
    yield client
    state = client.get(LEASE_PATH).json()
    if state["holder"] is not None:
        client.delete(LEASE_PATH, params={"holder": state["holder"]})


def test_the_built_in_server_keeps_a_lease(lease: httpx.Client) -> None:
    assert lease.get(LEASE_PATH).json()["holder"] is None
    taken = lease.post(LEASE_PATH, json={"holder": "h:/r1", "label": "run r1", "ttl": 5})
    assert taken.status_code == 200, taken.text
    assert taken.json()["holder"] == "h:/r1"
    refused = lease.post(LEASE_PATH, json={"holder": "h:/r2", "label": "run r2", "ttl": 5})
    assert refused.status_code == 409
    body = refused.json()
    assert body["holder"] == "h:/r1"
    assert "leased to run r1 (holder h:/r1" in body["error"]["message"]
    assert lease.delete(LEASE_PATH, params={"holder": "h:/r2"}).status_code == 409
    assert lease.delete(LEASE_PATH, params={"holder": "h:/r1"}).status_code == 200
    assert lease.get(LEASE_PATH).json()["holder"] is None


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"holder": ""},
        {"holder": "h", "ttl": 0},
        {"holder": "h", "ttl": "x"},
        {"holder": "h", "x": 1},
    ],
)
def test_a_bad_lease_request_is_refused_and_the_server_keeps_serving(
    lease: httpx.Client, body: dict
) -> None:
    answer = lease.post(LEASE_PATH, json=body)
    assert answer.status_code == 400, answer.text
    assert "a lease request is {holder, label, ttl}" in answer.json()["error"]["message"]
    assert lease.delete(LEASE_PATH).status_code == 400  # no holder named
    assert lease.put(LEASE_PATH).status_code == 405
    assert lease.get("/health").status_code == 200
    assert lease.get(LEASE_PATH).json()["holder"] is None

"""Scoring slots (mini_of3.ablation.slots): at most k holders at once, across open files as across processes."""
import threading
import time

from mini_of3.ablation import slots


def test_no_limit_yields_none(tmp_path, monkeypatch):
    monkeypatch.delenv(slots.SLOTS_ENV, raising=False)
    with slots.slot(folder=tmp_path) as index:
        assert index is None
    assert not list(tmp_path.iterdir())


def test_at_most_k_hold_a_slot_at_once(tmp_path):
    k, workers = 2, 5
    inside, most, lock = [0], [0], threading.Lock()
    held = []

    def work():
        with slots.slot(k, tmp_path, poll_s=0.01) as index:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                held.append(index)
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert most[0] == k and len(held) == workers and set(held) == set(range(k))


def test_slot_is_freed_after_an_error(tmp_path):
    try:
        with slots.slot(1, tmp_path):
            raise RuntimeError("scoring failed")
    except RuntimeError:
        pass
    with slots.slot(1, tmp_path, poll_s=0.01) as index:
        assert index == 0

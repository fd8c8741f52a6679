"""The parent's end of the shared words (shmvec._link), driven by hand over words of a bytearray.

No worker runs here: the test plays the worker's part (DONE_SEQ, STATUS, RESULT_LEN, PENDING) and
checks what the links store and read, in the protocol's terms (shmvec._protocol).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shmvec import _protocol as P
from shmvec._link import Links
from shmvec._sync import Words

N_WORKERS = 3
MAILBOX = 64


@pytest.fixture
def links():
    buf = bytearray((1 + N_WORKERS) * P.ROW_WORDS * 4)
    words = Words(buf, 0, (1 + N_WORKERS) * P.ROW_WORDS)
    out = Links(words, [range(0, 2), range(2, 4), range(4, 5)])
    out.use_mailbox(np.zeros((N_WORKERS, MAILBOX), dtype=np.uint8))
    yield out
    out.release()
    words.release()


def _word(links, w, offset):
    return links.words.load(P.word(w, offset))


def test_a_counted_post_stores_pending_then_each_command_with_the_next_sequence_number(links):
    links.post(int(P.Cmd.STEP))
    assert links.pending == N_WORKERS and links.seqs == [1, 1, 1]
    assert [_word(links, w, P.CMD) for w in range(N_WORKERS)] == [P.Cmd.STEP] * N_WORKERS
    assert [_word(links, w, P.CMD_SEQ) for w in range(N_WORKERS)] == [1, 1, 1]
    assert links.begun == 1


def test_a_post_to_some_workers_counts_only_them_and_leaves_the_others_alone(links):
    links.post(int(P.Cmd.RESET), [0, 2])
    assert links.pending == 2 and links.seqs == [1, 0, 1]
    assert _word(links, 1, P.CMD_SEQ) == 0 and _word(links, 1, P.CMD) == P.Cmd.NONE


def test_a_single_post_leaves_pending_and_wakes(links):
    links.post(int(P.Cmd.STEP))
    links[1].post(P.Cmd.PIPE)
    assert links.pending == N_WORKERS  # a rare command is not counted
    assert links.seqs == [1, 2, 1] and _word(links, 1, P.CMD) == P.Cmd.PIPE
    links.send(P.Cmd.CLOSE, [0, 2])
    assert links.seqs == [2, 2, 2] and _word(links, 2, P.CMD) == P.Cmd.CLOSE


def test_sequence_numbers_wrap_at_32_bits(links):
    links.seqs[0] = 0xFFFFFFFF
    links[0].post(P.Cmd.PIPE)
    assert links.seqs[0] == 0 and _word(links, 0, P.CMD_SEQ) == 0


def test_done_and_late_compare_done_seq_with_the_last_post(links):
    links.post(int(P.Cmd.STEP))
    assert links.late() == [0, 1, 2] and not links[0].done
    links.words.store(P.word(1, P.DONE_SEQ), 1)
    assert links.late() == [0, 2] and links[1].done
    assert links.late([1, 2]) == [2]


def test_wait_returns_at_the_target_or_false_after_the_timeout(links):
    links.post(int(P.Cmd.STEP))
    assert links.wait(0.0, 0.01) is False
    assert links.wait(0.0, 0.01, target=N_WORKERS) is True
    links.words.store(P.PENDING, 1)
    assert links.wait(1e-4, 0.01, target=1) is True
    links.clear_pending()
    assert links.pending == 0 and links.wait(0.0, 0.01) is True


def test_early_wake_makes_a_sleeping_parent_spin(links):
    links.arm(-1)
    assert links.words.load(P.PARENT_CPU) == P.NO_CPU and links.words.load(P.EARLY_WAKE) == 0
    links.arm(1)
    assert links.words.load(P.PARENT_CPU) == 1
    links.words.store(P.PENDING, 1)
    links.words.store(P.EARLY_WAKE, 1)
    assert links.wait(0.0, 0.01) is False  # spun (EARLY_SPIN_S is longer), then timed out


def test_an_argument_goes_into_the_mailbox_or_is_marked_for_the_pipe(links):
    assert links[0].put_arg(b"") is None and _word(links, 0, P.ARG_LEN) == 0
    assert links[1].put_arg(b"abc") is None and _word(links, 1, P.ARG_LEN) == 3
    assert bytes(links.mailbox[1, :3]) == b"abc"
    big = b"x" * MAILBOX
    assert links[2].put_arg(big) is big and _word(links, 2, P.ARG_LEN) == P.ARG_IN_PIPE


def _recv(messages):
    def recv(w, command, raw_bytes=False):
        return messages.pop((w, raw_bytes))
    return recv


def test_a_reply_is_read_from_the_mailbox_the_pipe_or_is_an_error(links):
    items = [(0, {"a": 1}, None)]
    data = pickle.dumps(items)
    links.mailbox[0, :len(data)] = np.frombuffer(data, dtype=np.uint8)
    links.words.store(P.word(0, P.RESULT_LEN), len(data))
    links.words.store(P.word(1, P.RESULT_LEN), P.RESULT_IN_PIPE)
    links.words.store(P.word(2, P.STATUS), P.Reply.ERROR)
    messages = {(1, True): pickle.dumps([(2, {"big": 2}, None)]), (2, False): (P.Pipe.ERROR, {"packed": True})}
    assert not links[0].by_pipe and links[1].by_pipe and links[2].by_pipe
    results, errors = links.collect("step", lambda w, command: links[w].reply(command, _recv(messages)))
    assert results == [items, [(2, {"big": 2}, None)], []]
    assert errors == {2: {"packed": True}} and not messages
    links[0].clear_result()
    assert _word(links, 0, P.RESULT_LEN) == 0


def test_collect_reads_nothing_for_workers_with_nothing_to_say(links):
    def read(w, command):
        raise AssertionError("nothing to read")

    assert links.collect("step", read) == ([[], [], []], {})


def test_a_result_that_does_not_load_names_the_worker_and_its_envs(links):
    links.mailbox[1, :4] = np.frombuffer(b"\x80\x05junk"[:4], dtype=np.uint8)
    links.words.store(P.word(1, P.RESULT_LEN), 4)
    with pytest.raises(Exception) as info:
        links[1].reply("step", _recv({}))
    assert any("worker 1 (envs 2..3)" in note for note in getattr(info.value, "__notes__", [])), info.value


def test_env_at_is_a_hint_inside_the_slice_only(links):
    links.words.store(P.word(1, P.ENV_AT), 3)
    assert links[1].env_at() == 3
    links.words.store(P.word(1, P.ENV_AT), P.NO_ENV)
    assert links[1].env_at() is None

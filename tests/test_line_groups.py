"""`translate` reading standard input: lines in groups as they arrive
(`cli.line_groups`), without a model."""

import os
import threading

import pytest

from keras_transformer.cli.line_groups import line_groups, with_copies


@pytest.fixture
def pipe():
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass  # closed by the test


def next_group(groups, wait: float = 10.0):
    """`next(groups)` (None at the end) in a thread, so that a reader that
    waits for input it should not need fails the test instead of hanging it;
    returns the thread while it still waits."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(group=next(groups, None)), daemon=True)
    thread.start()
    thread.join(wait)
    return thread if thread.is_alive() else result["group"]


def test_a_complete_line_is_handed_on_without_waiting_for_more(pipe):
    read_end, write_end = pipe
    groups = line_groups(read_end, most=8)
    os.write(write_end, b"Two dogs play in the snow.\n")
    assert next_group(groups) == ["Two dogs play in the snow."]
    os.write(write_end, b"A man rides a bike.\n")
    assert next_group(groups) == ["A man rides a bike."]


def test_lines_that_arrived_together_come_together_at_most_most_at_a_time(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"a\nb\nc\nd\ne\n")
    groups = line_groups(read_end, most=2)
    assert [next_group(groups) for _ in range(3)] == [["a", "b"], ["c", "d"], ["e"]]
    os.close(write_end)
    assert next_group(groups) is None


def test_a_partial_line_waits_for_its_end(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"part")
    groups = line_groups(read_end, most=8)
    result = {}
    thread = threading.Thread(target=lambda: result.update(group=next(groups)), daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # nothing complete yet
    os.write(write_end, b"ial\n")
    thread.join(10)
    assert result == {"group": ["partial"]}


def test_line_ends_empty_lines_and_a_last_line_without_an_end(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"one\r\n\nzwei \xc3\xa4\ntwo")
    os.close(write_end)
    assert list(line_groups(read_end, most=8)) == [["one", "", "zwei ä", "two"]]


def test_a_redirected_file_comes_in_full_groups(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_bytes(b"".join(b"sentence %d\n" % i for i in range(5)))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert [len(group) for group in line_groups(fd, most=3)] == [3, 2]
    finally:
        os.close(fd)


def test_bytes_that_are_not_utf8_name_their_line(pipe):
    read_end, write_end = pipe
    os.write(write_end, b"fine\n\xff\n")
    os.close(write_end)
    with pytest.raises(ValueError, match=r"standard input, line 2: not valid UTF-8"):
        list(line_groups(read_end, most=8))
    with pytest.raises(ValueError, match="most must be at least 1"):
        next(line_groups(read_end, most=0))


@pytest.mark.parametrize("count, size", [(1, 1), (2, 2), (3, 4), (5, 8), (17, 32), (32, 32), (40, 40)])
def test_copies_bring_a_group_to_a_power_of_two_up_to_the_batch(count, size):
    lines = [f"sentence {'x' * i}" for i in range(count)]
    padded = with_copies(lines, batch_size=32)
    assert len(padded) == size and padded[:count] == lines
    assert set(padded[count:]) <= {lines[-1]}  # copies of the longest


def test_copies_count_only_lines_that_reach_the_model():
    assert with_copies(["a", "", "  ", "b c"], batch_size=8) == ["a", "", "  ", "b c"]  # two non-blank lines
    assert with_copies(["a", "", "b c", "d"], batch_size=8) == ["a", "", "b c", "d", "b c"]
    assert with_copies(["", " "], batch_size=8) == ["", " "]
    assert with_copies(["a", "b", "c"], batch_size=2) == ["a", "b", "c"]

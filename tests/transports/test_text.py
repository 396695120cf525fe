"""split_markdown: chunk size, paragraph boundaries, code fences kept whole."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transports.text import split_markdown

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


def open_fence_at_end(chunk: str) -> bool:
    """True if the chunk leaves a code fence open (naive, matching fence chars)."""
    open_fence: str | None = None
    for line in chunk.split("\n"):
        match = FENCE.match(line)
        if not match:
            continue
        fence = match.group(1)
        if open_fence is None:
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence):
            open_fence = None
    return open_fence is not None


def words(text: str) -> list[str]:
    return [w for w in text.split() if not FENCE.match(w)]


def test_short_text_is_one_chunk_unchanged() -> None:
    text = "Hello **world**.\n\nSecond paragraph."
    assert split_markdown(text, 100) == [text]


def test_blank_text_gives_no_chunks() -> None:
    assert split_markdown("", 100) == []
    assert split_markdown("\n \n", 100) == []


def test_splits_at_paragraph_boundaries() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 8 for i in range(6)]
    text = "\n\n".join(p.strip() for p in paragraphs)
    chunks = split_markdown(text, 120)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk) <= 120
        # Each chunk is whole paragraphs: every one starts a paragraph.
        assert chunk.startswith("Paragraph ")
    assert "\n\n".join(chunks) == text


def test_code_block_is_never_cut_when_it_fits() -> None:
    code = "```python\n" + "\n".join(f"value_{i} = {i}" for i in range(8)) + "\n```"
    text = "Intro paragraph here.\n\n" + code + "\n\nOutro paragraph."
    chunks = split_markdown(text, len(code) + 5)
    assert code in chunks
    assert all(not open_fence_at_end(c) for c in chunks)


def test_long_code_block_becomes_complete_blocks_with_same_info_string() -> None:
    body = [f"line_{i:03d} = compute({i})" for i in range(60)]
    text = "~~~~python title=x\n" + "\n".join(body) + "\n~~~~"
    chunks = split_markdown(text, 200)
    assert len(chunks) > 1
    collected: list[str] = []
    for chunk in chunks:
        assert len(chunk) <= 200
        lines = chunk.split("\n")
        assert lines[0] == "~~~~python title=x"
        assert lines[-1] == "~~~~"
        collected.extend(lines[1:-1])
    assert collected == body


def test_unterminated_fence_is_closed_in_every_chunk() -> None:
    text = "```\n" + "\n".join("x" * 20 for _ in range(20))
    chunks = split_markdown(text, 100)
    assert len(chunks) > 1
    assert all(not open_fence_at_end(c) and len(c) <= 100 for c in chunks)


def test_overlong_paragraph_is_cut_at_spaces() -> None:
    text = " ".join(f"w{i}" for i in range(200))
    chunks = split_markdown(text, 50)
    assert all(len(c) <= 50 for c in chunks)
    assert words(" ".join(chunks)) == words(text)


def test_overlong_word_is_hard_cut() -> None:
    chunks = split_markdown("x" * 250, 100)
    assert chunks == ["x" * 100, "x" * 100, "x" * 50]


def test_tiny_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least"):
        split_markdown("hello", 10)


_word = st.text(alphabet="abcdefghij*_#-", min_size=1, max_size=12)
_para = st.lists(_word, min_size=1, max_size=30).map(" ".join)
_code = st.tuples(
    st.sampled_from(["```", "```py", "~~~", "````rust"]),
    st.lists(st.text(alphabet="abc ={}();", max_size=40), max_size=25),
).map(lambda t: "\n".join([t[0], *t[1], t[0].rstrip("pyrust")]))
_doc = st.lists(st.one_of(_para, _code), min_size=1, max_size=12).map("\n\n".join)


@settings(max_examples=200, deadline=None)
@given(_doc, st.integers(min_value=40, max_value=400))
def test_property_chunks_fit_and_fences_balance(text: str, limit: int) -> None:
    chunks = split_markdown(text, limit)
    assert chunks
    for chunk in chunks:
        assert len(chunk) <= limit
        assert not open_fence_at_end(chunk)


@settings(max_examples=200, deadline=None)
@given(st.lists(_para, min_size=1, max_size=12).map("\n\n".join), st.integers(40, 400))
def test_property_prose_words_survive_in_order(text: str, limit: int) -> None:
    chunks = split_markdown(text, limit)
    # Words longer than the limit are hard-cut, so compare the characters.
    assert "".join(words(" ".join(chunks))) == "".join(words(text))

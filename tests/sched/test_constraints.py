"""sbatch's --constraint syntax over node labels (hsched.spec.constraints)."""

from __future__ import annotations

import pytest

from hsched.spec.constraints import label_problem, parse_constraint


@pytest.mark.parametrize(("text", "labels", "ok"), [
    ("nvme", {"nvme"}, True),
    ("nvme", {"ib"}, False),
    ("nvme&ib", {"nvme", "ib", "x"}, True),
    ("nvme&ib", {"nvme"}, False),
    ("a100|h100", {"h100"}, True),
    ("a100|h100", {"v100"}, False),
    ("nvme&ib|bigmem", {"bigmem"}, True),  # & binds tighter: (nvme&ib)|bigmem
    ("nvme&(ib|bigmem)", {"bigmem"}, False),
    ("nvme&(ib|bigmem)", {"bigmem", "nvme"}, True),
    (" nvme & ib ", {"nvme", "ib"}, True),
    ("rack-1.b:x", {"rack-1.b:x"}, True),
])
def test_and_or_and_parentheses(text: str, labels: set[str], ok: bool) -> None:
    assert parse_constraint(text).satisfied_by(labels) is ok


def test_the_text_is_normalised_and_redundant_clauses_dropped() -> None:
    c = parse_constraint(" nvme & ib ")
    assert c.text == "nvme&ib" and str(c) == "nvme&ib"
    assert parse_constraint("a|a&b").clauses == (frozenset({"a"}),)
    assert parse_constraint("(a|b)&c").labels == frozenset({"a", "b", "c"})


@pytest.mark.parametrize(("text", "words"), [
    ("", "labels joined by &"),
    ("a&&b", "'&' where a label was expected"),
    ("a&", "ends where a label was expected"),
    ("(a|b", "not closed"),
    ("a)b", "unexpected ')'"),
    ("[a|b]", "matching OR"),
    ("a*2", "counts"),
    ("!a", "negation"),
    ("a,b", "',' is not allowed"),
])
def test_bad_syntax_says_what_is_accepted(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="labels joined by & \\(and\\) and \\| \\(or\\)") as e:
        parse_constraint(text)
    assert words in str(e.value)


def test_label_names() -> None:
    assert label_problem("nvme") is None and label_problem("a100-80g") is None
    assert label_problem("has space") is not None and label_problem("a&b") is not None
    assert label_problem(3) is not None

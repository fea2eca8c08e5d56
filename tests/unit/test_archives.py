"""The check of a client's tar archive: members are resolved as the extraction will
resolve them (in order, through the links earlier members made), not lexically; every
block is read, and what GNU tar extracts is the copy of what the check read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.executions.archives import MAX_LINK_FOLLOWS, Spool, checked_copy
from controller.executions.commands import InvalidValue
from tests.support.crafted_tars import CRAFTED_ACCEPTED, CRAFTED_REFUSED, extracted
from tests.support.tars import Member, directory, file, hardlink, symlink, tar_of


def check(*members: Member) -> None:
    checked(tar_of(*members))


def checked(body: bytes) -> bytes:
    """The copy the check makes of `body`, which is what `tar -x` is given."""
    spool = Spool()
    spool.write(body)
    try:
        copy = checked_copy(spool)
    finally:
        spool.close()
    try:
        return b"".join(copy.chunks())
    finally:
        copy.close()


# name, members, the member named in the refusal, what the refusal says
REFUSED: list[tuple[str, list[Member], str, str]] = [
    ("absolute name", [file("/etc/passwd")], "/etc/passwd", "leaves the directory"),
    ("../ in a name", [file("a/../../x")], "a/../../x", "has `..`"),
    ("../ that stays inside", [file("a/x"), file("a/../b")], "a/../b", "has `..`"),
    ("absolute link target", [symlink("l", "/etc")], "l", "links out"),
    ("link up", [symlink("l", "../x")], "l", "links out"),
    ("link up from below", [symlink("a/b/l", "../../..")], "a/b/l", "links out"),
    (
        "chain: a link through a link to the top",
        [symlink("ca", "."), symlink("cb", "ca/.."), file("cb/escaped.txt")],
        "cb",
        "links out",
    ),
    (
        "link to a link that leads up",
        [directory("d"), symlink("d/up", ".."), symlink("x", "d/up"), symlink("y", "x/..")],
        "y",
        "links out",
    ),
    (
        "a link replaced by a later one moves an earlier link out",
        [directory("a/b"), symlink("p", "a/b"), symlink("q", "p/.."), symlink("p", ".")],
        "q",
        "links out",
    ),
    (
        "a name through a link that a later link moved out",
        [symlink("l1", "x/.."), symlink("x", "."), file("l1/f")],
        "l1/f",
        "tar makes such links last",
    ),
    (
        "a file through a link whose target has ..",
        [directory("d"), symlink("d/up", ".."), file("d/up/f")],
        "d/up/f",
        "tar makes such links last",
    ),
    ("hard link up", [hardlink("h", "../secret")], "h", "has `..`"),
    ("hard link absolute", [hardlink("h", "/etc/shadow")], "h", "leaves the directory"),
    (
        "hard link to a link that leads up from the top",
        [directory("d"), symlink("d/up", ".."), hardlink("h", "d/up")],
        "h",
        "links out",
    ),
    (
        "hard link through a link to the top",
        [symlink("ca", "."), symlink("cb", "ca"), hardlink("h", "cb/../x")],
        "h",
        "has `..`",
    ),
    (
        "a directory member over a link that a later link moved out",
        [
            directory("a/b"),
            symlink("p", "a/b"),
            symlink("q", "p/.."),
            symlink("p", "."),
            directory("q"),
        ],
        "q",
        "leaves the directory",
    ),
    ("a loop", [symlink("a", "b"), symlink("b", "a")], "b", "more than 40 links"),
    (
        "a link to itself below",
        [symlink("a", "a/b")],
        "a",
        f"more than {MAX_LINK_FOLLOWS} links",
    ),
]


@pytest.mark.parametrize(
    ("members", "culprit", "problem"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_a_member_that_would_leave_is_refused(
    members: list[Member], culprit: str, problem: str
) -> None:
    with pytest.raises(InvalidValue) as refused:
        check(*members)
    assert f"tar member {culprit!r}" in str(refused.value)
    assert problem in str(refused.value)


ACCEPTED: list[tuple[str, list[Member]]] = [
    ("a link to a directory, written through", [symlink("lib", "sub"), file("lib/x")]),
    ("a link to a link", [symlink("ca", "."), symlink("cb", "ca"), file("cb/x")]),
    ("a link below to the top", [directory("d"), symlink("d/up", "..")]),
    ("a link up within", [symlink("a/b/l", "../c"), file("a/c/x")]),
    ("a dangling link", [symlink("l", "missing/deeper")]),
    ("a hard link to a file", [file("a/x"), hardlink("h", "a/x")]),
    ("a hard link through a link", [symlink("ca", "a"), file("a/x"), hardlink("h", "ca/x")]),
    ("a link replaced by a file", [symlink("l", "x"), file("l")]),
    (
        "a link that led up, replaced, then written under",
        [directory("a/b"), symlink("q", "a/b"), file("q"), directory("q"), file("q/x")],
    ),
    ("dot names", [directory("."), file("./a/./b")]),
]


@pytest.mark.parametrize("members", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_links_that_stay_inside_are_accepted(members: list[Member]) -> None:
    check(*members)


def test_resolving_is_bounded_by_the_archive_size() -> None:
    """Links of long targets, each to the next (made last to first, so each is cheap to
    make), and members that go through all of them: each would take 40,000 steps of
    resolving, far beyond what its few bytes in the archive pay for."""
    deep = "/".join(["e"] * 1000)
    chain = [symlink(f"l{i}", f"l{i - 1}/{deep}") for i in range(MAX_LINK_FOLLOWS - 1, 0, -1)]
    last = f"l{MAX_LINK_FOLLOWS - 1}"
    members = [*chain, symlink("l0", deep), *(file(f"{last}/f{i}") for i in range(200))]
    with pytest.raises(InvalidValue, match="more links than an archive of its size may") as refused:
        check(*members)
    assert f"tar member '{last}/f0'" in str(refused.value)


@pytest.mark.parametrize(
    ("body", "problem"),
    [case[1:] for case in CRAFTED_REFUSED],
    ids=[case[0] for case in CRAFTED_REFUSED],
)
def test_a_crafted_archive_is_refused_naming_the_problem(body: bytes, problem: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        checked(body)
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    ("body", "tree"),
    [case[1:] for case in CRAFTED_ACCEPTED],
    ids=[case[0] for case in CRAFTED_ACCEPTED],
)
def test_gnu_tar_extracts_what_the_check_read(
    body: bytes, tree: dict[str, bytes | str], tmp_path: Path
) -> None:
    subprocess.run(
        ["tar", "-x", "-f", "-", "--no-same-owner", "-C", str(tmp_path)],
        input=checked(body),
        check=True,
    )
    assert extracted(tmp_path) == tree

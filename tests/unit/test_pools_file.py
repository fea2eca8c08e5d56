"""Pool files (loading, error reports) and the reload rules: pools are added, updated and
removed in document order, an invalid document keeps its pool's last valid version, an
immutable change is refused, and an error no pool can be named by removes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.model import RunnerPool
from controller.sources.files import (
    MAX_DEPTH,
    ConfigError,
    LimitExceeded,
    LoadLimits,
    LoadResult,
    PoolFileError,
    load_pools,
)
from controller.sources.reload import RemovalGuard, reload, summary
from tests.support.documents import pool_doc

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pools.yaml"


def pool_yaml(name: str, idle: int = 2, image: str = "python:3.12", extra: str = "") -> str:
    return (
        "apiVersion: poolkeeper.dev/v1alpha1\n"
        "kind: RunnerPool\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"  idleRunners: {idle}\n"
        f"  runner: {{image: '{image}'}}\n"
        f"{extra}"
    )


def write(path: Path, *documents: str) -> Path:
    path.write_text("---\n".join(documents))
    return path


def keys(result: LoadResult) -> list[str]:
    return [p.key for p in result.pools]


def test_example_file_is_valid() -> None:
    result = load_pools(EXAMPLES)
    assert result.errors == []
    assert len(result.pools) >= 2
    # The dotted name shows prefix derivation; prefixes must differ or one pool is refused.
    assert any("." in p.metadata.name for p in result.pools)
    assert len({(p.nomad_namespace, p.job_prefix) for p in result.pools}) == len(result.pools)


def test_multi_document_file_keeps_document_order(tmp_path: Path) -> None:
    file = write(tmp_path / "pools.yaml", pool_yaml("b"), pool_yaml("a"), pool_yaml("c"))
    result = load_pools(file)
    assert keys(result) == ["default/b", "default/a", "default/c"]
    assert result.errors == [] and result.complete


def test_invalid_document_is_reported_and_skipped(tmp_path: Path) -> None:
    file = write(
        tmp_path / "pools.yaml",
        pool_yaml("a"),
        pool_yaml("b", extra="  bogus: 1\n"),
        pool_yaml("c", idle=-1),
        pool_yaml("d"),
    )
    result = load_pools(file)
    assert keys(result) == ["default/a", "default/d"]
    assert result.errors == [
        PoolFileError(file, 1, "spec.bogus", "unknown field", "default/b"),
        PoolFileError(
            file, 2, "spec.idleRunners", "input should be greater than or equal to 0", "default/c"
        ),
    ]


def test_error_string_names_file_document_and_field(tmp_path: Path) -> None:
    file = write(
        tmp_path / "pools.yaml",
        pool_yaml("a"),
        pool_yaml("b"),
        "apiVersion: poolkeeper.dev/v1alpha1\nkind: RunnerPool\n"
        "metadata: {name: c}\nspec: {idleRunners: 1, runner: {}}\n",
    )
    (error,) = load_pools(file).errors
    assert str(error) == f"{file}:2: spec.runner.image: field required"


def test_folder_reads_yaml_and_yml_sorted_not_recursive(tmp_path: Path) -> None:
    write(tmp_path / "b.yml", pool_yaml("from-b"))
    write(tmp_path / "a.yaml", pool_yaml("from-a"))
    write(tmp_path / "c.json", pool_yaml("ignored-json"))
    write(tmp_path / ".hidden.yaml", pool_yaml("ignored-hidden"))
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "d.yaml", pool_yaml("ignored-sub"))
    assert keys(load_pools(tmp_path)) == ["default/from-a", "default/from-b"]


def test_folder_with_a_good_and_a_bad_file(tmp_path: Path) -> None:
    write(tmp_path / "1-good.yaml", pool_yaml("good"))
    bad = write(tmp_path / "2-bad.yaml", pool_yaml("bad", image=""))
    result = load_pools(tmp_path)
    assert keys(result) == ["default/good"]
    assert [(e.file, e.document, e.field, e.key) for e in result.errors] == [
        (bad, 0, "spec.runner.image", "default/bad")
    ]


def test_syntax_error_reports_the_file_and_keeps_the_others(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", pool_yaml("a"))
    broken = write(tmp_path / "b.yaml", pool_yaml("b"), "spec: [unclosed\n")
    write(tmp_path / "c.yaml", pool_yaml("c"))
    result = load_pools(tmp_path)
    assert keys(result) == ["default/a", "default/c"]  # not even b's good first document
    (error,) = result.errors
    assert (error.file, error.document, error.field, error.key) == (broken, 1, "", None)
    assert "YAML syntax error" in error.message and "line " in error.message
    assert str(error).startswith(f"{broken}:1: YAML syntax error")
    assert not result.complete


def test_documents_that_are_not_pools(tmp_path: Path) -> None:
    file = write(tmp_path / "p.yaml", "- a\n- b\n", "just text\n", pool_yaml("ok"), "")
    result = load_pools(file)
    assert keys(result) == ["default/ok"]  # the trailing empty document is skipped
    assert [(e.document, e.field, e.key) for e in result.errors] == [(0, "", None), (1, "", None)]


def test_duplicate_pool_later_document_is_the_error(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", pool_yaml("dup", idle=1))
    second = write(tmp_path / "b.yaml", pool_yaml("dup", idle=2), pool_yaml("dup", image=""))
    result = load_pools(tmp_path)
    assert [(p.key, p.spec.idle_runners) for p in result.pools] == [("default/dup", 1)]
    assert [(e.file, e.document, e.key) for e in result.errors] == [
        (second, 0, "default/dup"),
        (second, 1, "default/dup"),
    ]
    assert all("duplicate RunnerPool default/dup" in e.message for e in result.errors)


def test_same_name_in_other_namespace_is_no_duplicate(tmp_path: Path) -> None:
    other = pool_yaml("x").replace("{name: x}", "{name: x, namespace: team-b}")
    result = load_pools(write(tmp_path / "p.yaml", pool_yaml("x"), other))
    assert keys(result) == ["default/x", "team-b/x"]


def test_missing_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_pools(tmp_path / "nope.yaml")


def test_unreadable_bytes_are_reported(tmp_path: Path) -> None:
    file = tmp_path / "bin.yaml"
    file.write_bytes(b"\xff\xfe\x00garbage")
    (error,) = load_pools(file).errors
    assert error.file == file and error.key is None and "cannot read" in error.message


# --- reload --------------------------------------------------------------------------------


def parse(name: str, **spec: Any) -> RunnerPool:
    """The pool ``pool_yaml(name)`` describes, with ``spec`` over it."""
    spec.setdefault("runner", {"image": "python:3.12"})
    return RunnerPool.parse_document(pool_doc(name, namespace=None, **spec))


def previous_of(*pools: RunnerPool) -> dict[str, RunnerPool]:
    return {p.key: p for p in pools}


def test_first_load_adds_everything(tmp_path: Path) -> None:
    result = load_pools(write(tmp_path / "p.yaml", pool_yaml("a"), pool_yaml("b")))
    outcome = reload({}, result)
    assert list(outcome.pools) == ["default/a", "default/b"]
    assert outcome.added == ["default/a", "default/b"]
    assert outcome.removed == outcome.kept == outcome.updated == []


def test_reload_updates_adds_removes_and_keeps_order(tmp_path: Path) -> None:
    previous = previous_of(parse("a"), parse("b"), parse("gone"))
    file = write(tmp_path / "p.yaml", pool_yaml("new"), pool_yaml("b", idle=4), pool_yaml("a"))
    outcome = reload(previous, load_pools(file))
    assert list(outcome.pools) == ["default/new", "default/b", "default/a"]
    assert outcome.pools["default/b"].spec.idle_runners == 4
    assert outcome.added == ["default/new"]
    assert outcome.updated == ["default/b"]
    assert outcome.unchanged == ["default/a"]
    assert outcome.removed == ["default/gone"]
    assert outcome.errors == []


def test_invalid_document_keeps_the_last_valid_version(tmp_path: Path) -> None:
    old = parse("a", idleRunners=3)
    file = write(tmp_path / "p.yaml", pool_yaml("a", idle=-4), pool_yaml("b"))
    outcome = reload(previous_of(old), load_pools(file))
    assert outcome.pools["default/a"] is old
    assert outcome.kept == ["default/a"]
    assert outcome.removed == []
    assert [(e.field, e.key) for e in outcome.errors] == [("spec.idleRunners", "default/a")]
    assert outcome.refused == []
    assert list(outcome.pools) == ["default/a", "default/b"]


def test_invalid_new_pool_is_not_started(tmp_path: Path) -> None:
    outcome = reload({}, load_pools(write(tmp_path / "p.yaml", pool_yaml("a", image=""))))
    assert outcome.pools == {} and len(outcome.errors) == 1


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("  nomad: {namespace: other}\n", "spec.nomad.namespace"),
        ("  nomad: {jobPrefix: changed-}\n", "spec.nomad.jobPrefix"),
    ],
)
def test_immutable_change_is_refused(tmp_path: Path, extra: str, field: str) -> None:
    old = parse("a")
    file = write(tmp_path / "p.yaml", pool_yaml("a", idle=9, extra=extra))
    outcome = reload(previous_of(old), load_pools(file))
    assert outcome.pools["default/a"] is old
    assert outcome.kept == ["default/a"] and outcome.updated == []
    (error,) = outcome.errors
    assert outcome.refused == [error]
    assert (error.file, error.document, error.field, error.key) == (file, 0, field, "default/a")
    assert "immutable" in error.message


def test_spelling_out_the_derived_prefix_is_no_change(tmp_path: Path) -> None:
    old = parse("a")
    file = write(tmp_path / "p.yaml", pool_yaml("a", extra="  nomad: {jobPrefix: a-}\n"))
    outcome = reload(previous_of(old), load_pools(file))
    assert outcome.updated == ["default/a"] and outcome.errors == []


def test_unattributable_error_removes_nothing(tmp_path: Path) -> None:
    # The syntax error may hide pool "b": it is kept, not removed.
    previous = previous_of(parse("a"), parse("b"))
    write(tmp_path / "a.yaml", pool_yaml("a", idle=5))
    write(tmp_path / "b.yaml", "spec: [unclosed\n")
    outcome = reload(previous, load_pools(tmp_path))
    assert outcome.removed == []
    assert outcome.kept == ["default/b"]
    assert outcome.updated == ["default/a"]
    assert outcome.pools["default/b"] is previous["default/b"]


def test_pool_removed_when_every_document_is_attributed(tmp_path: Path) -> None:
    previous = previous_of(parse("a"), parse("b"))
    # An invalid document of *another* pool does not block the removal of "b".
    result = load_pools(write(tmp_path / "p.yaml", pool_yaml("a"), pool_yaml("c", idle=-1)))
    assert result.complete
    outcome = reload(previous, result)
    assert outcome.removed == ["default/b"]
    assert list(outcome.pools) == ["default/a"]


def test_a_refused_pool_is_named_in_the_summary_with_its_reason(tmp_path: Path) -> None:
    # A new pool that was never valid is refused as much as a new version of a running one.
    old = parse("a")
    file = write(
        tmp_path / "p.yaml",
        pool_yaml("a", extra="  nomad: {jobPrefix: moved-}\n"),
        pool_yaml("b", idle=-1),
        pool_yaml("c"),
    )
    line = summary(reload(previous_of(old), load_pools(file)))
    assert line == (
        "added default/c; refused "
        "default/a (spec.nomad.jobPrefix ('a-' cannot become 'moved-'): immutable; the "
        "previous version keeps running. Delete and re-create the pool to move it.), "
        f"default/b ({file}:1: spec.idleRunners: input should be greater than or equal to 0)"
    )


# --- what one reload may remove ------------------------------------------------------------


def running(*names: str) -> dict[str, RunnerPool]:
    return previous_of(*(parse(name) for name in names))


def loaded(tmp_path: Path, *names: str) -> LoadResult:
    return load_pools(write(tmp_path / "p.yaml", *(pool_yaml(name) for name in names)))


@pytest.mark.parametrize(
    ("guard", "left", "refusal"),
    [
        (
            RemovalGuard(),
            ["a", "b", "c", "d"],
            "would remove 3 of 4 pools (default/b, default/c, default/d), more than "
            "--max-removed-share 0.5; pass --allow-shrink to remove them",
        ),
        (RemovalGuard(allow_shrink=True), ["a"], None),
        (RemovalGuard(allow_empty=True), ["a", "b", "c", "d"], "would remove 3 of 4 pools"),
        (RemovalGuard(max_removed_share=0.75), ["a"], None),
    ],
)
def test_a_reload_removing_more_than_the_share_changes_nothing(
    tmp_path: Path, guard: RemovalGuard, left: list[str], refusal: str | None
) -> None:
    # What a file truncated after its first document looks like.
    outcome = reload(running("a", "b", "c", "d"), loaded(tmp_path, "a"), guard)
    assert list(outcome.pools) == [f"default/{name}" for name in left]
    if refusal is None:
        assert outcome.guard_refusal is None
    else:
        assert outcome.guard_refusal is not None and outcome.guard_refusal.startswith(refusal)
        assert outcome.removed == outcome.added == outcome.updated == []


def test_removing_up_to_the_share_is_taken(tmp_path: Path) -> None:
    outcome = reload(running("a", "b", "c", "d"), loaded(tmp_path, "a", "b", "new"))
    assert outcome.guard_refusal is None
    assert outcome.removed == ["default/c", "default/d"] and outcome.added == ["default/new"]
    guard = RemovalGuard(max_removed_share=0.25)
    refused = reload(running("a", "b", "c", "d"), loaded(tmp_path, "a", "b", "new"), guard)
    assert refused.guard_refusal is not None and "2 of 4" in refused.guard_refusal


@pytest.mark.parametrize(
    ("guard", "refused"),
    [
        (RemovalGuard(), True),
        # --allow-shrink is about files that still define pools: an empty one is refused.
        (RemovalGuard(allow_shrink=True), True),
        (RemovalGuard(allow_empty=True), False),
    ],
)
def test_an_empty_load_removes_every_pool_only_with_allow_empty(
    tmp_path: Path, guard: RemovalGuard, refused: bool
) -> None:
    outcome = reload(running("a", "b"), loaded(tmp_path), guard)
    if refused:
        assert outcome.guard_refusal == "defines no pool; pass --allow-empty to remove every pool"
        assert list(outcome.pools) == ["default/a", "default/b"]
    else:
        assert outcome.guard_refusal is None and outcome.removed == ["default/a", "default/b"]


def test_the_first_load_is_never_guarded(tmp_path: Path) -> None:
    assert reload({}, loaded(tmp_path)).guard_refusal is None


# --- limits --------------------------------------------------------------------------------


def laughs(levels: int) -> str:
    """A pool whose jobTemplate holds 9**levels strings written in a few hundred bytes."""
    lines = ['      l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"      l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels + 1)]
    return pool_yaml("laughs", extra="  nomad:\n    jobTemplate:\n" + "\n".join(lines) + "\n")


def test_an_alias_fan_out_is_refused_while_it_is_parsed(tmp_path: Path) -> None:
    file = write(tmp_path / "p.yaml", pool_yaml("a"), laughs(9))  # 387,420,489 strings
    with pytest.raises(LimitExceeded) as refused:
        load_pools(file, LoadLimits(max_nodes=10_000))
    # Refused at the first alias of l4 (line 20): its 7,381 nodes take the count over.
    assert str(refused.value) == (
        f"{file}:1: 15722 YAML nodes by line 20, column 16 (an alias counts as the nodes it "
        "expands to), over the limit of 10000 (--max-pools-nodes)"
    )


def test_an_alias_counts_as_the_nodes_it_expands_to(tmp_path: Path) -> None:
    env = "{A: '1', B: '2'}"
    runner = f"  runner: {{image: 'python:3.12', env: &env {env}}}\n"
    aliased = pool_yaml("a", extra="  nomad: {jobTemplate: {Meta: *env}}\n")
    written_out = pool_yaml("a", extra=f"  nomad: {{jobTemplate: {{Meta: {env}}}}}\n")
    for document in (aliased, written_out):
        file = write(tmp_path / "p.yaml", document.replace(pool_yaml("a")[-33:], runner))
        (pool,) = load_pools(file, LoadLimits(max_nodes=33)).pools
        assert pool.spec.nomad.job_template == {"Meta": {"A": "1", "B": "2"}}
        with pytest.raises(LimitExceeded) as refused:
            load_pools(file, LoadLimits(max_nodes=32))
        assert str(refused.value).startswith(f"{file}:0: 33 YAML nodes by line 8, column 1 ")


def test_the_files_bytes_are_counted_together_before_parsing(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", pool_yaml("a"))
    write(tmp_path / "b.yaml", pool_yaml("b"))
    size = sum(f.stat().st_size for f in tmp_path.iterdir())
    assert keys(load_pools(tmp_path, LoadLimits(max_bytes=size))) == ["default/a", "default/b"]
    with pytest.raises(LimitExceeded) as refused:
        load_pools(tmp_path, LoadLimits(max_bytes=size - 1))
    assert str(refused.value) == (
        f"{tmp_path}: {size} bytes of pool files, over the limit of {size - 1} (--max-pools-bytes)"
    )


def test_more_pool_documents_than_the_limit_are_refused(tmp_path: Path) -> None:
    file = write(tmp_path / "p.yaml", pool_yaml("a"), pool_yaml("b"), "", pool_yaml("c", idle=-1))
    assert len(load_pools(file, LoadLimits(max_pools=3)).locations) == 3
    with pytest.raises(LimitExceeded) as refused:
        load_pools(file, LoadLimits(max_pools=2))
    assert str(refused.value) == (
        f"{file}: more than 2 pool documents, over the limit of 2 (--max-pools)"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("spec: " + "[" * 5000 + "]" * 5000 + "\n", f"nested deeper than {MAX_DEPTH} levels"),
        ("spec: &loop [a, *loop]\n", "an alias inside the node it names (line 8, column 17)"),
    ],
)
def test_documents_no_pool_can_be_are_syntax_errors_of_their_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    file = write(tmp_path / "p.yaml", pool_yaml("a"), text)
    result = load_pools(file)
    assert result.pools == [] and not result.complete
    (error,) = result.errors
    assert (error.document, error.key) == (1, None)
    assert error.message.startswith(f"YAML syntax error: {problem}")

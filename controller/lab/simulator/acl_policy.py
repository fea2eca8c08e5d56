"""Nomad's ACL policy language: parsing rules, and evaluating the policies of a token.

What Nomad does (acl/policy.go, acl/acl.go), and so what this does:
- A namespace's `policy` shorthand adds its capabilities to the listed `capabilities`;
  `deny` in a namespace clears every other capability there, in every policy of the token.
- Namespace and variable-path rules with `*` are globs. An exact rule wins; otherwise the
  matching glob closest to the name (fewest characters matched by its `*`s).
- A variables path's capabilities are the union over the token's policies; `read` brings
  `list`; `deny` in one path block replaces that block's other capabilities.
- `agent`, `node`, `operator`, ... take the most privileged policy, `deny` above all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.lab.simulator.hcl import Body, HclError, parse

DENY, READ, LIST, WRITE, SCALE = "deny", "read", "list", "write", "scale"

_READ_JOB_CAPABILITIES = (
    "list-jobs",
    "parse-job",
    "read-job",
    "csi-list-volume",
    "csi-read-volume",
    "read-job-scaling",
    "list-scaling-policies",
    "read-scaling-policy",
)
NAMESPACE_SHORTHANDS: dict[str, tuple[str, ...]] = {
    DENY: (DENY,),
    READ: _READ_JOB_CAPABILITIES,
    WRITE: (
        *_READ_JOB_CAPABILITIES,
        "scale-job",
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-lifecycle",
        "csi-mount-volume",
        "csi-write-volume",
        "submit-recommendation",
    ),
    SCALE: ("list-scaling-policies", "read-scaling-policy", "read-job-scaling", "scale-job"),
}
NAMESPACE_CAPABILITIES = frozenset(
    {c for caps in NAMESPACE_SHORTHANDS.values() for c in caps}
    | {"alloc-node-exec", "csi-register-plugin", "sentinel-override"}
)
VARIABLE_CAPABILITIES = frozenset({READ, LIST, WRITE, "destroy", DENY})
_COARSE_POLICIES = ("agent", "node", "operator", "quota")
# Blocks Nomad accepts that the simulator has nothing to enforce with (volumes, pools).
_UNENFORCED_BLOCKS = {
    "host_volume": frozenset({DENY, "mount-readonly", "mount-readwrite"}),
    "node_pool": frozenset({DENY, READ, WRITE, "delete"}),
}
_VALID_NAME = re.compile(r"^[a-zA-Z0-9\-*]{1,128}$")
_VALID_POOL_NAME = re.compile(r"^[a-zA-Z0-9\-_*]{1,128}$")
_RANK = {"": 0, LIST: 1, READ: 2, WRITE: 3, DENY: 4}


class PolicyError(ValueError):
    """Rules Nomad would refuse to store."""


@dataclass(frozen=True)
class NamespaceRule:
    name: str
    capabilities: frozenset[str]
    variable_paths: tuple[tuple[str, frozenset[str]], ...]


@dataclass(frozen=True)
class Policy:
    namespaces: tuple[NamespaceRule, ...] = ()
    coarse: tuple[tuple[str, str], ...] = ()  # ("node", "read"), ("plugin", "list"), ...


def parse_policy(rules: str) -> Policy:
    """The rules of `PUT /v1/acl/policy/:name`, HCL or JSON; PolicyError as Nomad refuses."""
    if rules == "":
        return Policy()  # Nomad takes empty rules as a policy that grants nothing
    try:
        body = parse(rules)
    except HclError as exc:
        raise PolicyError(f"Failed to parse ACL Policy: {exc}") from None
    namespaces = tuple(_namespace_rule(name, ns) for name, ns in _labelled(body, "namespace"))
    coarse: list[tuple[str, str]] = []
    for kind in (*_COARSE_POLICIES, "plugin"):
        for block in _unlabelled(body, kind):
            level = _string(block, "policy") or ""
            allowed = (DENY, READ, LIST) if kind == "plugin" else (DENY, READ, WRITE, SCALE)
            if level not in allowed:
                raise PolicyError(f"Invalid {kind} policy: {level!r}")
            coarse.append((kind, level))
    for kind, valid_caps in _UNENFORCED_BLOCKS.items():
        for name, block in _labelled(body, kind):
            pattern = _VALID_POOL_NAME if kind == "node_pool" else _VALID_NAME
            if not pattern.match(name):
                raise PolicyError(f"Invalid {kind} name: {name!r}")
            _capabilities(block, kind, valid_caps)
    if not namespaces and not coarse and not any(k in body for k in _UNENFORCED_BLOCKS):
        raise PolicyError(f"Invalid policy: {rules}")
    return Policy(namespaces, tuple(coarse))


def _namespace_rule(name: str, block: Body) -> NamespaceRule:
    if not _VALID_NAME.match(name):
        raise PolicyError(f"Invalid namespace name: {name!r}")
    shorthand = _string(block, "policy")
    if shorthand is not None and shorthand not in NAMESPACE_SHORTHANDS:
        raise PolicyError(f"Invalid namespace policy: {shorthand!r} in namespace {name}")
    capabilities = set(_capabilities(block, f"namespace {name}", NAMESPACE_CAPABILITIES))
    capabilities.update(NAMESPACE_SHORTHANDS.get(shorthand or "", ()))
    paths: list[tuple[str, frozenset[str]]] = []
    for variables in _unlabelled(block, "variables"):
        declared = _labelled(variables, "path")
        if not declared:
            raise PolicyError(f"Invalid variable policy: no variable paths in namespace {name}")
        for spec, path_block in declared:
            if not spec:
                raise PolicyError(f"Invalid missing variable path in namespace {name}")
            caps = set(_capabilities(path_block, f"namespace {name}", VARIABLE_CAPABILITIES))
            if DENY in caps:
                caps = {DENY}
            elif READ in caps:
                caps.add(LIST)
            paths.append((spec, frozenset(caps)))
    return NamespaceRule(name, frozenset(capabilities), tuple(paths))


def _labelled(body: Body, key: str) -> list[tuple[str, Body]]:
    out: list[tuple[str, Body]] = []
    for entry in body.get(key, []):
        if not isinstance(entry, dict):
            raise PolicyError(f"{key}: expected a block")
        for label, inners in entry.items():
            for inner in inners if isinstance(inners, list) else [inners]:
                if not isinstance(inner, dict):
                    raise PolicyError(f"{key} {label!r}: expected a block")
                out.append((label, inner))
    return out


def _unlabelled(body: Body, key: str) -> list[Body]:
    entries = body.get(key, [])
    if not all(isinstance(e, dict) for e in entries):
        raise PolicyError(f"{key}: expected a block")
    return entries


def _string(block: Body, key: str) -> str | None:
    values = block.get(key)
    if not values:
        return None
    if not isinstance(values[-1], str):
        raise PolicyError(f"{key}: expected a string")
    return values[-1]


def _capabilities(block: Body, where: str, valid: frozenset[str]) -> list[str]:
    out: list[str] = []
    for value in block.get("capabilities", []):
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise PolicyError(f"capabilities in {where}: expected a list of strings")
        for cap in value:
            if cap not in valid:
                raise PolicyError(f"Invalid capability '{cap}' in {where}")
        out.extend(value)
    return out


# ---------------------------------------------------------------------- evaluation
def glob_match(pattern: str, name: str) -> bool:
    """go-glob's match: `*` stands for any run of characters, nothing else is special."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == name
    if not name.startswith(parts[0]):
        return False
    rest = name[len(parts[0]) :]
    for middle in parts[1:-1]:
        found = rest.find(middle)
        if found < 0:
            return False
        rest = rest[found + len(middle) :]
    return rest.endswith(parts[-1]) and len(rest) >= len(parts[-1])


@dataclass
class _RuleTable:
    """Capabilities by exact name, and by glob."""

    exact: dict[str, set[str]] = field(default_factory=dict)
    globs: dict[str, set[str]] = field(default_factory=dict)

    def entry(self, name: str, is_glob: bool) -> set[str]:
        return (self.globs if is_glob else self.exact).setdefault(name, set())

    def lookup(self, name: str) -> set[str] | None:
        if name in self.exact:
            return self.exact[name]
        best: tuple[int, str] | None = None
        # Walk in key order; a later glob ties over an earlier one (Nomad's sort keeps
        # the last of equal distance first).
        for pattern in sorted(self.globs):
            if glob_match(pattern, name):
                distance = len(name) - len(pattern) + pattern.count("*")
                if best is None or distance <= best[0]:
                    best = (distance, pattern)
        return self.globs[best[1]] if best else None

    def tables(self) -> Iterable[set[str]]:
        yield from self.exact.values()
        yield from self.globs.values()


class Permissions:
    """A token's policies compiled, as Nomad's `acl.ACL`; answers capability questions."""

    def __init__(self, policies: Iterable[Policy], management: bool = False) -> None:
        self.management = management
        self.namespaces = _RuleTable()
        self.variables = _RuleTable()
        self.coarse: dict[str, str] = {}
        for policy in policies:
            for rule in policy.namespaces:
                ns_glob = "*" in rule.name
                for spec, caps in rule.variable_paths:
                    key = f"{rule.name}\x00{spec}"
                    self.variables.entry(key, ns_glob or "*" in spec).update(caps)
                granted = self.namespaces.entry(rule.name, ns_glob)
                if DENY in granted:
                    continue
                if DENY in rule.capabilities:
                    granted.clear()
                    granted.add(DENY)
                else:
                    granted.update(rule.capabilities)
            for kind, level in policy.coarse:
                current = self.coarse.get(kind, "")
                self.coarse[kind] = level if _RANK[level] > _RANK[current] else current

    def allow_namespace_op(self, namespace: str, capability: str) -> bool:
        if self.management:
            return True
        if namespace == "*" and any(capability in t for t in self.namespaces.tables()):
            return True
        granted = self.namespaces.lookup(namespace)
        return granted is not None and capability in granted

    def allow_namespace(self, namespace: str) -> bool:
        """Any capability at all in the namespace (what namespace listings show)."""
        if self.management:
            return True
        granted = self.namespaces.lookup(namespace)
        return bool(granted) and DENY not in (granted or ())

    def allow_variable_op(self, namespace: str, path: str, capability: str) -> bool:
        if self.management:
            return True
        granted = self.variables.lookup(f"{namespace}\x00{path}")
        return granted is not None and capability in granted

    def allow(self, kind: str, write: bool) -> bool:
        """`agent`, `node`, `operator` or `quota`: read (or write) allowed."""
        if self.management:
            return True
        level = self.coarse.get(kind, "")
        return level == WRITE or (level == READ and not write)


MANAGEMENT = Permissions((), management=True)

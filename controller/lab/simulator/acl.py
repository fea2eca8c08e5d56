"""ACL: bootstrap, tokens, policies, and what a token's policies allow."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from controller.lab.simulator.acl_policy import (
    MANAGEMENT,
    Permissions,
    Policy,
    PolicyError,
    parse_policy,
)
from controller.lab.simulator.authz import denied
from controller.lab.simulator.jobspec import multierror
from controller.lab.simulator.store import Store
from controller.lab.simulator.util import (
    JSON,
    ApiError,
    bad_request,
    format_go_duration,
    iso_now,
    not_found,
    now_ns,
    parse_go_duration,
)

MAX_TOKEN_NAME = 256
# A token's TTL bounds (the server's acl token_min/max_expiration_ttl defaults).
MIN_TOKEN_TTL_NS, MAX_TOKEN_TTL_NS = 60 * 10**9, 24 * 3600 * 10**9
ONE_TIME_TOKEN_TTL_NS = 10 * 60 * 10**9
MAX_ROLE_DESCRIPTION = 256
_VALID_ROLE_NAME = re.compile(r"^[a-zA-Z0-9-]{1,128}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def is_uuid(text: str) -> bool:
    return bool(_UUID.match(text))


def iso_at(ns: int) -> str:
    """RFC 3339 with nanoseconds, UTC, as Go writes a time.Time."""
    seconds, fraction = divmod(ns, 10**9)
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}".rstrip("0")
    return f"{stamp}.{digits}Z" if digits else f"{stamp}Z"


def _parse_iso(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time (as iso_at writes them)."""
    head, _, rest = text.rstrip("Z").partition(".")
    seconds = int(datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())
    return seconds * 10**9 + int((rest or "0").ljust(9, "0")[:9])


def _nanoseconds(value: Any) -> int:
    """A Go time.Duration in JSON: nanoseconds (a number), or a duration string."""
    if value in (None, ""):
        return 0
    if isinstance(value, bool):
        raise bad_request("Failed to decode request body: ExpirationTTL must be a duration")
    if isinstance(value, int):
        return value
    try:
        return int(parse_go_duration(str(value)) * 1e9)
    except ValueError:
        raise bad_request(
            "Failed to decode request body: ExpirationTTL must be a duration"
        ) from None


# A request without a token acts as this one: the policy named "anonymous", if defined.
ANONYMOUS_TOKEN: JSON = {
    "AccessorID": "anonymous",
    "SecretID": "anonymous",
    "Name": "Anonymous Token",
    "Type": "client",
    "Policies": ["anonymous"],
    "Roles": None,
    "Global": False,
}


class Acl:
    def __init__(self, store: Store, enabled: bool) -> None:
        self.store = store
        self.enabled = enabled
        self.bootstrapped = False
        self.tokens: dict[str, JSON] = {}  # by AccessorID
        self.token_by_secret: dict[str, str] = {}
        self.policies: dict[str, JSON] = {}
        self._parsed: dict[str, Policy] = {}  # policy name -> its rules, parsed when stored
        self.roles: dict[str, JSON] = {}  # by ID
        self.one_time_tokens: dict[str, JSON] = {}  # by OneTimeSecretID

    def bootstrap(self, secret: str = "") -> JSON:
        """The first management token; `secret` (a UUID) is its SecretID when given."""
        if not self.enabled:
            raise bad_request("ACL support disabled")
        if self.bootstrapped:
            raise bad_request(
                f"ACL bootstrap already done (reset index: {self.store.table_index['acl_token']})"
            )
        if secret and not is_uuid(secret):
            raise bad_request("invalid acl token")
        self.bootstrapped = True
        body = {"Name": "Bootstrap Token", "Type": "management", "Global": True}
        if secret:
            body.update(AccessorID=self.store.new_id(), SecretID=secret)
        return self.upsert_token(body, upload=bool(secret))

    # ------------------------------------------------------------------ tokens
    def create_token(self, body: JSON, accessor: str | None = None) -> JSON:
        """Create a token, update the one with `accessor`, or (with an unknown `accessor`
        and a SecretID, both UUIDs, of a client token) upload one made elsewhere."""
        if accessor is not None:
            body = {**body, "AccessorID": accessor}
        return self.upsert_token(body)

    def upsert_token(self, body: JSON, upload: bool = False) -> JSON:
        """Nomad's UpsertTokens for one token: Canonicalize, Validate, the role links
        resolved (to the role's ID; shown with its current name)."""
        accessor = str(body.get("AccessorID") or "")
        secret = str(body.get("SecretID") or "")
        old = self.tokens.get(accessor) if accessor else None
        # An unknown accessor: an upload, if both IDs are UUIDs and it is no management token.
        uploadable = is_uuid(accessor) and is_uuid(secret) and body.get("Type") != "management"
        if accessor and old is None and not (upload or uploadable):
            raise bad_request(f"cannot find token {accessor}")
        policies = list(body.get("Policies") or [])
        roles = self._role_links(body.get("Roles"))
        ttl = _nanoseconds(body.get("ExpirationTTL"))
        errors = _token_errors(body, old, bool(policies or roles), ttl)
        if errors:
            raise bad_request(f"token 0 invalid: {multierror(errors)}")
        txn = self.store.txn("ACLTokenUpserted")
        if old is None:
            expires = iso_at(now_ns() + ttl) if ttl else None
            created = {"SecretID": secret or self.store.new_id(), "CreateTime": iso_now()}
            old = {**created, "ExpirationTime": expires, "ExpirationTTL": ttl}
            old["CreateIndex"] = txn.index
        token: JSON = {
            "AccessorID": accessor or self.store.new_id(),
            "SecretID": old["SecretID"],
            "Name": body.get("Name") or "",
            "Type": body["Type"],
            "Policies": policies or None,
            "Roles": [{"ID": r["ID"], "Name": ""} for r in roles] or None,
            "Global": bool(body.get("Global")),
            "CreateTime": old["CreateTime"],
            "ExpirationTime": old["ExpirationTime"],
            "ExpirationTTL": old.get("ExpirationTTL", 0),
            "CreateIndex": old["CreateIndex"],
            "ModifyIndex": txn.index,
        }
        self.tokens[token["AccessorID"]] = token
        self.token_by_secret[token["SecretID"]] = token["AccessorID"]
        txn.put("ACLToken", token["AccessorID"], _token_stub(token), "acl_token")
        self.store.commit(txn)
        return self.shown(token)

    def shown(self, token: JSON) -> JSON:
        """A token as the API shows it: its role links with the roles' current names."""
        links = [
            {"ID": link["ID"], "Name": self.roles[link["ID"]]["Name"]}
            for link in token.get("Roles") or []
            if link["ID"] in self.roles
        ]
        return {**token, "Roles": links or None}

    def _role_links(self, raw: Any) -> list[JSON]:
        """A token's role links, each naming an existing role by ID or name, deduplicated."""
        links: list[JSON] = []
        for link in raw or []:
            if not isinstance(link, dict):
                raise bad_request("Failed to decode request body: role links must be objects")
            key = link.get("ID") or link.get("Name") or ""
            role = self.roles.get(link["ID"]) if link.get("ID") else self._role_named(key)
            if role is None:
                raise bad_request(f"cannot find role {key}")
            if all(role["ID"] != seen["ID"] for seen in links):
                links.append(role)
        return links

    def _role_named(self, name: str) -> JSON | None:
        return next((r for r in self.roles.values() if r["Name"] == name), None)

    def expired(self, token: JSON) -> bool:
        expires = token.get("ExpirationTime")
        return isinstance(expires, str) and _parse_iso(expires) <= now_ns()

    # ------------------------------------------------------------------ one-time tokens
    def one_time_token(self, token: JSON | None) -> JSON:
        """A one-time token for the caller's own token, good for 10 minutes and one
        exchange."""
        if not self.enabled:
            raise bad_request("ACL support disabled")
        if token is None or token.get("AccessorID") not in self.tokens:
            raise denied()
        txn = self.store.txn("OneTimeTokenUpserted")
        txn.tables.add("one_time_token")
        ott = {
            "OneTimeSecretID": self.store.new_id(),
            "AccessorID": token["AccessorID"],
            "ExpiresAt": iso_at(now_ns() + ONE_TIME_TOKEN_TTL_NS),
            "CreateIndex": txn.index,
            "ModifyIndex": txn.index,
        }
        self.one_time_tokens[ott["OneTimeSecretID"]] = ott
        self.store.commit(txn)
        return {"OneTimeToken": ott, "Index": txn.index}

    def exchange_one_time_token(self, secret: Any) -> JSON:
        """The token a one-time secret was made for; the secret (and every other one of
        that token) is then used up."""
        if not self.enabled:
            raise bad_request("ACL support disabled")
        ott = self.one_time_tokens.get(str(secret or ""))
        if ott is None or _parse_iso(ott["ExpiresAt"]) < now_ns():
            raise denied()
        token = self.tokens.get(ott["AccessorID"])
        if token is None:
            raise denied()
        txn = self.store.txn("OneTimeTokenDeleted")
        txn.tables.add("one_time_token")
        for key in [
            k for k, o in self.one_time_tokens.items() if o["AccessorID"] == ott["AccessorID"]
        ]:
            del self.one_time_tokens[key]
        self.store.commit(txn)
        return {"Token": self.shown(token), "Index": txn.index}

    def delete_token(self, accessor: str) -> None:
        token = self.tokens.pop(accessor, None)
        if token is None:
            raise not_found("ACL token")
        self.token_by_secret.pop(token["SecretID"], None)
        txn = self.store.txn("ACLTokenDeleted")
        txn.put("ACLToken", accessor, _token_stub(token), "acl_token")
        self.store.commit(txn)

    def token_for(self, secret: str) -> JSON | None:
        accessor = self.token_by_secret.get(secret)
        return self.tokens.get(accessor) if accessor else None

    # ------------------------------------------------------------------ policies
    def put_policy(self, name: str, body: JSON) -> None:
        rules = body.get("Rules", "")
        try:
            parsed = parse_policy(rules if isinstance(rules, str) else "")
        except PolicyError as exc:
            raise ApiError(
                400, f"policy 0 invalid: 1 error occurred:\n\t* failed to parse rules: {exc}\n\n"
            ) from None
        self._parsed[name] = parsed
        txn = self.store.txn("ACLPolicyUpserted")
        old = self.policies.get(name)
        self.policies[name] = {
            "Name": name,
            "Description": body.get("Description", ""),
            "Rules": body.get("Rules", ""),
            "CreateIndex": old["CreateIndex"] if old else txn.index,
            "ModifyIndex": txn.index,
        }
        txn.put("ACLPolicy", name, self.policies[name], "acl_policy")
        self.store.commit(txn)

    def delete_policy(self, name: str) -> None:
        if self.policies.pop(name, None) is None:
            raise not_found("ACL policy")
        del self._parsed[name]
        txn = self.store.txn("ACLPolicyDeleted")
        txn.put("ACLPolicy", name, {"Name": name}, "acl_policy")
        self.store.commit(txn)

    # ------------------------------------------------------------------ roles
    def upsert_role(self, body: JSON, role_id: str = "") -> JSON:
        """Nomad's UpsertRoles for one role: a name unique among roles, at least one
        policy, each an existing one. With an ID (in the path), that role is updated."""
        name = body.get("Name")
        policies = body.get("Policies") or []
        errors = []
        if not isinstance(name, str) or not _VALID_ROLE_NAME.match(name):
            errors.append(f"invalid name '{name}'")
        if len(str(body.get("Description") or "")) > MAX_ROLE_DESCRIPTION:
            errors.append(f"description longer than {MAX_ROLE_DESCRIPTION}")
        if not policies:
            errors.append("at least one policy should be specified")
        if errors:
            raise bad_request(f"role 0 invalid: {multierror(errors)}")
        named = self._role_named(str(name))
        if named is not None and named["ID"] != role_id:
            raise bad_request(f"role with name {name} already exists")
        if role_id and role_id not in self.roles:
            raise bad_request(f"cannot find role {role_id}")
        links = []
        for link in policies:
            policy = link.get("Name") if isinstance(link, dict) else None
            if policy not in self.policies:
                raise bad_request(f"cannot find policy {policy}")
            links.append({"Name": policy})
        txn = self.store.txn("ACLRoleUpserted")
        old = self.roles.get(role_id)
        role_id = role_id or self.store.new_id()
        role: JSON = {
            "ID": role_id,
            "Name": name,
            "Description": body.get("Description") or "",
            "Policies": links,
            "CreateIndex": old["CreateIndex"] if old else txn.index,
            "ModifyIndex": txn.index,
        }
        self.roles[role_id] = role
        txn.put("ACLRole", role_id, role, "acl_roles")
        self.store.commit(txn)
        return role

    def delete_role(self, role_id: str) -> int:
        role = self.roles.pop(role_id, None)
        if role is None:
            raise bad_request(f"ACL role not found: {role_id}")
        txn = self.store.txn("ACLRoleDeleted")
        txn.put("ACLRole", role_id, role, "acl_roles")
        self.store.commit(txn)
        return txn.index

    def role_named(self, name: str) -> JSON | None:
        return self._role_named(name)

    # ------------------------------------------------------------------ evaluation
    def permissions(self, token: JSON | None) -> Permissions | None:
        """What `token` may do; None when ACLs are off (everything is allowed)."""
        if token is None:
            return None
        if token["Type"] == "management":
            return MANAGEMENT
        names = list(token.get("Policies") or [])
        for link in token.get("Roles") or []:
            role = self.roles.get(link["ID"])
            if role is not None:
                names.extend(p["Name"] for p in role["Policies"])
        # A policy deleted after the token was made grants nothing, as in Nomad.
        return Permissions(self._parsed[n] for n in dict.fromkeys(names) if n in self._parsed)

    def namespace_filter(
        self, token: JSON | None, namespace: str, capability: str
    ) -> Callable[[str], bool]:
        """For lists: whose namespaces' objects `token` sees; 403 when it may see none
        of `namespace` (`*`: of any namespace)."""
        permissions = self.permissions(token)
        if permissions is None:
            return lambda ns: True
        if not permissions.allow_namespace_op(namespace, capability):
            raise denied()
        return lambda ns: permissions.allow_namespace_op(ns, capability)

    def require(self, token: JSON | None, namespace: str, capability: str) -> None:
        """403 `Permission denied` unless `token` has `capability` in `namespace`."""
        permissions = self.permissions(token)
        if permissions is not None and not permissions.allow_namespace_op(namespace, capability):
            raise denied()


def _token_errors(body: JSON, old: JSON | None, linked: bool, ttl: int) -> list[str]:
    """Nomad's ACLToken.Validate, for a new token (`old` None) or an update."""
    errors = []
    if len(str(body.get("Name") or "")) > MAX_TOKEN_NAME:
        errors.append("token name too long")
    if body.get("Type") == "client":
        if not linked:
            errors.append("client token missing policies or roles")
    elif body.get("Type") == "management":
        if linked:
            errors.append("management token cannot be associated with policies or roles")
    else:
        errors.append("token type must be client or management")
    if old is not None:
        if bool(body.get("Global")) != old["Global"]:
            errors.append("cannot toggle global mode")
        if ttl != old.get("ExpirationTTL", 0):
            errors.append("cannot update expiration TTL")
    elif ttl < 0:
        errors.append(
            f"token expiration TTL '{format_go_duration(ttl / 1e9)}' should not be negative"
        )
    elif ttl and not MIN_TOKEN_TTL_NS <= ttl <= MAX_TOKEN_TTL_NS:
        bound, word = (
            (MAX_TOKEN_TTL_NS, "more") if ttl > MAX_TOKEN_TTL_NS else (MIN_TOKEN_TTL_NS, "less")
        )
        errors.append(
            f"expiration time cannot be {word} than {format_go_duration(bound / 1e9)} "
            f"in the future (was {format_go_duration(ttl / 1e9)})"
        )
    return errors


def _token_stub(token: JSON) -> JSON:
    return {k: v for k, v in token.items() if k != "SecretID"}

"""ACL: bootstrap, tokens, policies, and what a token's policies allow."""

from __future__ import annotations

from collections.abc import Callable

from controller.lab.simulator.acl_policy import (
    MANAGEMENT,
    Permissions,
    Policy,
    PolicyError,
    parse_policy,
)
from controller.lab.simulator.authz import denied
from controller.lab.simulator.store import Store
from controller.lab.simulator.util import JSON, ApiError, bad_request, iso_now, not_found

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

    def bootstrap(self) -> JSON:
        if not self.enabled:
            raise bad_request("ACL support disabled")
        if self.bootstrapped:
            raise bad_request(
                f"ACL bootstrap already done (reset index: {self.store.table_index['acl_token']})"
            )
        self.bootstrapped = True
        return self.create_token({"Name": "Bootstrap Token", "Type": "management", "Global": True})

    # ------------------------------------------------------------------ tokens
    def create_token(self, body: JSON, accessor: str | None = None) -> JSON:
        """Create a token, or update the one with `accessor`."""
        token_type = body.get("Type") or "client"
        if token_type not in ("client", "management"):
            raise bad_request(f'token type must be "client" or "management", got "{token_type}"')
        if token_type == "client" and not body.get("Policies") and not body.get("Roles"):
            raise bad_request("client token missing policy or role links")
        txn = self.store.txn("ACLTokenUpserted")
        old = self.tokens.get(accessor or "")
        if accessor is not None and old is None:
            raise not_found("ACL token")
        token: JSON = {
            "AccessorID": old["AccessorID"] if old else self.store.new_id(),
            "SecretID": old["SecretID"] if old else self.store.new_id(),
            "Name": body.get("Name", ""),
            "Type": token_type,
            "Policies": body.get("Policies"),
            "Roles": body.get("Roles"),
            "Global": bool(body.get("Global")),
            "CreateTime": old["CreateTime"] if old else iso_now(),
            "ExpirationTime": None,
            "CreateIndex": old["CreateIndex"] if old else txn.index,
            "ModifyIndex": txn.index,
        }
        self.tokens[token["AccessorID"]] = token
        self.token_by_secret[token["SecretID"]] = token["AccessorID"]
        txn.put("ACLToken", token["AccessorID"], _token_stub(token), "acl_token")
        self.store.commit(txn)
        return token

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

    # ------------------------------------------------------------------ evaluation
    def permissions(self, token: JSON | None) -> Permissions | None:
        """What `token` may do; None when ACLs are off (everything is allowed)."""
        if token is None:
            return None
        if token["Type"] == "management":
            return MANAGEMENT
        names = token.get("Policies") or []
        # A policy deleted after the token was made grants nothing, as in Nomad.
        return Permissions(self._parsed[n] for n in names if n in self._parsed)

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


def _token_stub(token: JSON) -> JSON:
    return {k: v for k, v in token.items() if k != "SecretID"}

"""Which JSON Schemas a constraint can take: valid ones (JSON Schema's own meta-schema, through
the jsonschema package) whose every keyword the grammar enforces.

xgrammar (0.2.9) builds its grammar from most of JSON Schema, but some keywords it reads past:
its grammar then admits values the schema rejects, and a completion that ends with
finish_reason "stop" may not validate. Measured by asking its grammar to accept a value that
breaks each keyword alone (tests/test_schema_support.py keeps that list honest): it ignores
multipleOf on non-integers, uniqueItems, contains, not, if / then / else, dependentRequired,
dependentSchemas, dependencies, unevaluatedProperties, every allOf member but the first, the
exclusivity of oneOf (its branches are read as anyOf's), and a "required" name that "properties"
does not define (never generated). Such a schema is refused in one line naming the keyword and
where it stands, before any row runs, rather than giving output the schema does not hold.
oneOf is taken where its branches are disjoint (a discriminated union: different types,
constants, or a required property of different constants), as anyOf then means the same.
"""

from __future__ import annotations

import json

# Keywords whose value is a schema, a list of schemas, or a mapping of names to schemas.
_ONE = ("items", "additionalItems", "additionalProperties", "propertyNames", "unevaluatedItems")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# Enforced nowhere in the grammar: present (and not a no-op) means refused.
_IGNORED = (
    "not", "if", "then", "else", "contains", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties",
)  # fmt: skip


def check_schema(schema: dict) -> None:
    """ValueError (one line) if schema is not a valid JSON Schema, or holds a keyword the
    grammar would not enforce (the module docstring)."""
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        at = f" (at /{where})" if where else ""
        raise ValueError(f"invalid JSON schema: {e.message}{at}") from None
    problem = _unsupported(schema, schema, "")
    if problem is not None:
        where, what = problem
        raise ValueError(
            f"JSON schema not supported: {what} at {where or '/'} (the grammar cannot enforce it, "
            "so the output could break the schema)"
        )


def _unsupported(node, root: dict, path: str) -> tuple[str, str] | None:
    """(where, what) of the first keyword under node the grammar would not enforce."""
    if not isinstance(node, dict):
        return None
    for key in _IGNORED:
        if key in node:
            return path, f"'{key}'"
    if node.get("uniqueItems") is True:
        return path, "'uniqueItems'"
    if "multipleOf" in node and node.get("type") != "integer":
        return path, "'multipleOf' on a non-integer type"
    if len(node.get("allOf", ())) > 1:
        return path, "'allOf' of more than one schema"
    branches = node.get("oneOf", ())
    for i, a in enumerate(branches):
        for b in branches[i + 1 :]:
            if not _disjoint(_resolve(a, root), _resolve(b, root), root):
                return path, "'oneOf' whose branches can overlap (anyOf, if that is meant)"
    defined = node.get("properties", {})
    if "patternProperties" not in node:
        for name in node.get("required", ()):
            if name not in defined:
                return path, f"'required' naming {name!r}, which 'properties' does not define"
    for key in _ONE:
        if (found := _unsupported(node.get(key), root, f"{path}/{key}")) is not None:
            return found
    for key in (*_LISTS, "items"):  # "items" as a list: draft 4-7's tuple form
        for i, sub in enumerate(node.get(key) if isinstance(node.get(key), list) else ()):
            if (found := _unsupported(sub, root, f"{path}/{key}/{i}")) is not None:
                return found
    for key in _MAPS:
        for name, sub in (node.get(key) or {}).items():
            if (found := _unsupported(sub, root, f"{path}/{key}/{name}")) is not None:
                return found
    return None


def _resolve(node, root: dict):
    """node, or the local definition its "$ref" names ("#/$defs/X", "#/definitions/X")."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return node
    target = root
    for part in ref[2:].split("/"):
        if not isinstance(target, dict) or part not in target:
            return node
        target = target[part]
    return target


def _constants(node) -> set[str] | None:
    """The values node allows, as JSON text, where it names them (const or enum); else None."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return {json.dumps(node["const"], sort_keys=True)}
    if isinstance(node.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in node["enum"]}
    return None


def _types(node) -> set[str] | None:
    """The JSON types node allows where it says ("number" takes in "integer"); else None."""
    kind = node.get("type") if isinstance(node, dict) else None
    if kind is None:
        return None
    kinds = set(kind) if isinstance(kind, list) else {kind}
    return kinds | {"integer"} if "number" in kinds else kinds


def _disjoint(a, b, root: dict) -> bool:
    """No value can satisfy both schemas, as far as their types, constants and a required
    property's constants show (False where that cannot be told this way)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ca, cb = _constants(a), _constants(b)
    if ca is not None and cb is not None:
        return not ca & cb
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    shared = set(a.get("required", ())) & set(b.get("required", ()))
    for name in shared:
        pa = _resolve(a.get("properties", {}).get(name), root)
        pb = _resolve(b.get("properties", {}).get(name), root)
        ca, cb = _constants(pa), _constants(pb)
        if ca is not None and cb is not None and not ca & cb:
            return True
    return False

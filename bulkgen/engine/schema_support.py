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
# Keywords that assert nothing: harmless beside any other keyword.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "$defs", "definitions", "deprecated", "readOnly", "writeOnly",
    # OpenAPI's, which JSON Schema (and the grammar) ignores: pydantic's discriminated unions
    "discriminator", "nullable",
})  # fmt: skip
# xgrammar reads only the first of these a node holds and drops every other keyword beside it.
_ALONE = ("$ref", "anyOf", "oneOf", "allOf")
# Keywords xgrammar drops beside the first (it reads the string's format, or its pattern, only).
_READ_ALONE = {
    "format": ("pattern", "minLength", "maxLength"),
    "pattern": ("minLength", "maxLength"),
}
# Keywords xgrammar drops in a node without a "type" (it reads such a node as any value).
_TYPED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
          "maxLength", "pattern", "format", "minItems", "maxItems", "minProperties",
          "maxProperties")  # fmt: skip


def check_schema(schema: dict) -> None:
    """ValueError (one line) if schema is not a valid JSON Schema, or holds a keyword the
    grammar would not enforce (the module docstring)."""
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except RecursionError:
        raise ValueError("invalid JSON schema: it nests too deeply to check") from None
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        at = f" (at /{where})" if where else ""
        raise ValueError(f"invalid JSON schema: {e.message}{at}") from None
    try:
        problem = _unsupported(schema, schema, "")
    except RecursionError:
        raise ValueError("invalid JSON schema: it nests too deeply to check") from None
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
    if "multipleOf" in node and (
        node.get("type") != "integer" or not float(node["multipleOf"]).is_integer()
    ):
        return path, "'multipleOf' on a non-integer type, or of a fraction"
    if len(node.get("allOf", ())) > 1:
        return path, "'allOf' of more than one schema"
    ref = node.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        return path, f"'$ref' {ref!r} (only local JSON pointers such as '#/$defs/x' are followed)"
    asserting = [k for k in node if k not in _ANNOTATIONS and not k.startswith("x-")]
    alone = next((k for k in _ALONE if k in node), None)
    if alone is not None and len(asserting) > 1:
        other = next(k for k in asserting if k != alone)
        return path, f"'{other}' beside '{alone}' (the grammar reads only the '{alone}')"
    for key in ("const", "enum"):
        if key in node and len(asserting) > 1 and not _values_obey(node, key, root):
            what = f"'{key}' holding a value the keywords beside it refuse"
            return path, f"{what} (the grammar reads only the '{key}')"
    if "const" not in node and "enum" not in node:
        for leader, dropped in _READ_ALONE.items():
            if leader in node and (other := next((k for k in dropped if k in node), None)):
                return path, f"'{other}' beside '{leader}' (the grammar reads only the '{leader}')"
        if "type" not in node and alone is None:
            if key := next((k for k in _TYPED if k in node), None):
                return path, f"'{key}' without a 'type' (the grammar reads the node as any value)"
    branches = node.get("oneOf", ())
    for i, a in enumerate(branches):
        for b in branches[i + 1 :]:
            if not _disjoint(_resolve(a, root), _resolve(b, root), root):
                return path, "'oneOf' whose branches can overlap (anyOf, if that is meant)"
    defined = node.get("properties", {})
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


def _values_obey(node: dict, key: str, root: dict) -> bool:
    """Every value node[key] (const or enum) allows is valid under the node's other keywords."""
    from jsonschema import validators

    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}  # for rest's $refs
    rest = {**defs, **{k: v for k, v in node.items() if k != key}}
    values = [node["const"]] if key == "const" else node[key]
    try:
        check = validators.validator_for(root)(rest)
        return all(check.is_valid(v) for v in values)
    except Exception:  # a $ref it cannot follow, say: refuse rather than guess
        return False


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
        return {json.dumps(_same_numbers(node["const"]), sort_keys=True)}
    if isinstance(node.get("enum"), list):
        return {json.dumps(_same_numbers(v), sort_keys=True) for v in node["enum"]}
    return None


def _same_numbers(value):
    """value with whole floats as ints: JSON Schema's 1 and 1.0 are one value."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_same_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _same_numbers(v) for k, v in value.items()}
    return value


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

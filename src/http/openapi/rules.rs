//! What the server enforces on what a client sends, written into the served document: the
//! patterns and bounds of names, owners, reasons, tokens and batches, exactly as the
//! validators check them (`fence::name`, `locks::parse_owner`, `store::admin::validate_reason`,
//! `FencingToken::parse`, `batch::parse_ops`), and the bounds the configuration sets
//! (`kv.max_key_bytes`, `kv.max_batch_ops`, `locks.max_ttl_ms`).
//!
//! A generator such as schemathesis takes the document at its word both ways: what it allows
//! must be accepted, what it forbids must be refused. So each pattern here is the validator's
//! rule, not an approximation. One thing JSON Schema cannot say: `maxLength` counts characters
//! and fencegate's limits count UTF-8 bytes; each description says so.
//!
//! Applied to the document's JSON once per router (`http::app`): every schema and parameter it
//! names must exist, or building the router panics (and `tests/api/openapi.rs` fails), so a
//! renamed field cannot silently lose its rule.

use serde_json::{json, Map, Value};

/// The bounds the configuration sets.
pub struct Bounds {
    pub max_key_bytes: usize,
    pub max_batch_ops: usize,
    pub max_ttl_ms: u64,
}

/// `char::is_control` (Unicode Cc): what no name, owner or reason may hold.
const CONTROL: &str = r"\u0000-\u001f\u007f-\u009f";

/// A key, scope, lock name or owner: non-empty, no control characters.
pub fn name_pattern() -> String {
    format!("^[^{CONTROL}]+$")
}

/// A key prefix: as a name, and may be empty.
fn prefix_pattern() -> String {
    format!("^[^{CONTROL}]*$")
}

/// An audit reason: no control characters, and not only white space (`str::trim`, Unicode
/// White_Space, of which the controls are excluded already).
fn reason_pattern() -> String {
    let space = r"\u0020\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";
    format!("^[^{CONTROL}]*[^{CONTROL}{space}][^{CONTROL}]*$")
}

/// A decimal in `0..=max` without leading zeros: the alternation of every shorter length, and,
/// at max's length, each digit position below max's digit there.
pub fn decimal_at_most(max: u64) -> String {
    let digits: Vec<u8> = max.to_string().bytes().map(|b| b - b'0').collect();
    let n = digits.len();
    let mut alternatives = vec!["0".to_owned()];
    if n > 1 {
        alternatives.push(format!("[1-9][0-9]{{0,{}}}", n - 2));
    }
    for (i, &d) in digits.iter().enumerate() {
        let low = if i == 0 { 1 } else { 0 };
        if d > low {
            let prefix: String = digits[..i].iter().map(|d| d.to_string()).collect();
            let rest = n - i - 1;
            let class = if d - 1 == low {
                low.to_string()
            } else {
                format!("[{low}-{}]", d - 1)
            };
            let tail = if rest > 0 {
                format!("[0-9]{{{rest}}}")
            } else {
                String::new()
            };
            alternatives.push(format!("{prefix}{class}{tail}"));
        }
    }
    alternatives.push(max.to_string());
    alternatives.join("|")
}

/// A fencing token: `FencingToken::parse`, exactly.
pub fn token_pattern() -> String {
    format!("^(?:{})$", decimal_at_most(i64::MAX as u64))
}

/// A name as `X-Fencing-Scope` carries it: printable ASCII, percent-escapes of UTF-8 that
/// decodes to no control character, no white space at either end (HTTP trims it).
fn percent_name_pattern() -> String {
    let hex = "[0-9A-Fa-f]";
    let cont = "%[89ABab][0-9A-Fa-f]";
    let escape = [
        // ASCII, printable.
        format!("%(?:[2-6]{hex}|7[0-9A-Ea-e])"),
        // Two bytes, from U+00A0 (U+0080..U+009F are controls).
        format!("%[Cc]2%[ABab]{hex}"),
        format!("%(?:[Cc][3-9A-Fa-f]|[Dd]{hex}){cont}"),
        // Three bytes, no overlong forms, no surrogates.
        format!("%[Ee]0%[ABab]{hex}{cont}"),
        format!("%(?:[Ee][1-9A-Ca-c]|[Ee][EFef]){cont}{cont}"),
        format!("%[Ee][Dd]%[89]{hex}{cont}"),
        // Four bytes, up to U+10FFFF.
        format!("%[Ff]0%[9ABab]{hex}{cont}{cont}"),
        format!("%[Ff][1-3]{cont}{cont}{cont}"),
        format!("%[Ff]4%8{hex}{cont}{cont}"),
    ]
    .join("|");
    let edge = format!("(?:[\\x21-\\x24\\x26-\\x7e]|{escape})");
    let inner = format!("(?:[\\x20-\\x24\\x26-\\x7e]|{escape})");
    format!("^{edge}(?:{inner}*{edge})?$")
}

/// `since` of the refusals: milliseconds (digits, as `i64` parses them) or an RFC 3339 UTC
/// time as `admin::since_ms` reads it.
fn since_pattern() -> String {
    format!(
        "^(?:0*(?:{})|[0-9]{{4}}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?Z)$",
        decimal_at_most(i64::MAX as u64)
    )
}

/// Writes the rules into the document's JSON.
pub fn apply(doc: &mut Value, bounds: &Bounds) {
    let max = bounds.max_key_bytes;
    let bytes = format!(
        "At most {max} bytes of UTF-8 (kv.max_key_bytes; maxLength counts characters, so a name of \
         non-ASCII characters reaches the limit sooner), no control characters."
    );
    let name =
        json!({"type": "string", "minLength": 1, "maxLength": max, "pattern": name_pattern()});
    parameters(doc, |location, param_name, schema, description| {
        match (location, param_name) {
            ("path", "key" | "scope" | "name") => {
                merge(schema, &name);
                append(description, &bytes);
            }
            ("header", "X-Fencing-Scope") => {
                merge(
                    schema,
                    &json!({"minLength": 1, "maxLength": max, "pattern": percent_name_pattern()}),
                );
                append(
                    description,
                    &format!(
                        "Printable ASCII and %-escapes of UTF-8 (no control character once decoded); at most {max} \
                         bytes once decoded (maxLength counts the characters sent: a longer header whose escapes \
                         decode within the limit is accepted too)."
                    ),
                );
            }
            ("header", "X-Fencing-Token") => {
                merge(schema, &json!({"pattern": token_pattern()}));
            }
            ("query", "kind") => {
                merge(
                    schema,
                    &json!({"enum": ["stale", "not_issued", "jump", "scope_mismatch", "bad_proof"]}),
                );
            }
            ("query", "since") => merge(schema, &json!({"pattern": since_pattern()})),
            ("query", "key" | "scope" | "actor") => merge(schema, &json!({"maxLength": 4096})),
            _ => {}
        }
    });
    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
        .expect("the document has component schemas");
    let owner = json!({"type": "string", "minLength": 1, "maxLength": crate::locks::MAX_OWNER_BYTES,
        "pattern": name_pattern(),
        "description": format!("Who holds the lock, for humans: 1..={} bytes of UTF-8 (maxLength counts characters), no control characters.", crate::locks::MAX_OWNER_BYTES)});
    let ttl = json!({"type": "integer", "format": "int64", "minimum": 1, "maximum": bounds.max_ttl_ms,
        "description": "The lease in milliseconds: 1..=locks.max_ttl_ms."});
    let reason = json!({"type": "string", "minLength": 1, "maxLength": 1000, "pattern": reason_pattern(),
        "description": "Why, recorded in the audit log: 1..=1000 bytes of UTF-8 (maxLength counts characters), \
                        not only white space, no control characters."});
    let scope_or_null = json!({"oneOf": [name, {"type": "null"}],
        "description": "A scope, or null for none."});
    property(schemas, "AcquireRequest", "owner", owner);
    property(schemas, "AcquireRequest", "ttl_ms", ttl.clone());
    property(schemas, "RenewRequest", "ttl_ms", ttl);
    property(schemas, "RetireRequest", "reason", reason.clone());
    required(schemas, "RetireRequest", &["reason"]);

    // One body for three resets, with a rule each: a scope's fence takes `to` and no `scope`;
    // a key or row takes `to`, `scope`, or both.
    // `"to": null` is taken as no `to` (serde's `Option`).
    let token = json!({"$ref": "#/components/schemas/FencingToken"});
    property(schemas, "ResetRequest", "reason", reason.clone());
    property(schemas, "ResetRequest", "scope", scope_or_null.clone());
    property(
        schemas,
        "ResetRequest",
        "to",
        json!({"oneOf": [token, {"type": "null"}],
            "description": "The new fence, below the current one (a token as a JSON string); null: none."}),
    );
    required(schemas, "ResetRequest", &["reason"]);
    let mut fence_reset = schemas["ResetRequest"].clone();
    fence_reset["properties"]
        .as_object_mut()
        .expect("properties")
        .remove("scope");
    fence_reset["properties"]["to"] = json!({"$ref": "#/components/schemas/FencingToken",
        "description": "The new fence, below the current one (a token as a JSON string)."});
    fence_reset["required"] = json!(["reason", "to"]);
    schemas.insert("FenceResetRequest".into(), fence_reset);
    schemas["ResetRequest"]["anyOf"] = json!([
        {"required": ["to"], "properties": {"to": token}},
        {"required": ["scope"]}
    ]);
    request_body(
        doc,
        "/v1/admin/fences/{scope}/reset",
        "post",
        "FenceResetRequest",
    );

    // One body for two rebinds: keys name a `prefix`; a table is rebound whole.
    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
        .expect("component schemas");
    property(schemas, "RebindRequest", "reason", reason);
    property(schemas, "RebindRequest", "scope", scope_or_null);
    property(
        schemas,
        "RebindRequest",
        "prefix",
        json!({"type": "string", "maxLength": max, "pattern": prefix_pattern(),
            "description": format!("Every key starting with it (\"\": every key): at most {max} bytes, no control characters.")}),
    );
    let mut table_rebind = schemas["RebindRequest"].clone();
    table_rebind["properties"]
        .as_object_mut()
        .expect("properties")
        .remove("prefix");
    // `"prefix": null` is taken as no prefix (serde's `Option`).
    table_rebind["properties"]["prefix"] = json!({"type": "null"});
    table_rebind["required"] = json!(["reason", "scope"]);
    schemas.insert("TableRebindRequest".into(), table_rebind);
    required(schemas, "RebindRequest", &["prefix", "reason", "scope"]);
    request_body(
        doc,
        "/v1/admin/tables/{resource}/rebind",
        "post",
        "TableRebindRequest",
    );

    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
        .expect("component schemas");
    property(
        schemas,
        "BatchRequest",
        "ops",
        json!({"type": "array", "minItems": 1, "maxItems": bounds.max_batch_ops,
            "items": {"$ref": "#/components/schemas/OpRequest"},
            "description": "1..=kv.max_batch_ops operations, applied all or nothing."}),
    );
    required(schemas, "BatchRequest", &["ops"]);
    schemas.insert("OpRequest".into(), op_request(&name));
}

/// A batch op, as `batch::parse_ops` takes them: a kv put or delete, or a table put, patch
/// or delete (`resource`); each shape its own fields and no other.
fn op_request(name: &Value) -> Value {
    let row_key = json!({"type": "string", "minLength": 1,
        "description": "The row key's URL form: the key columns' values in order, joined by ',', each percent-encoded (docs/tables.md)."});
    let resource = json!({"type": "string", "description": "A [[resources]] name from the configuration; unknown: 404."});
    let value = json!({"description": "Any JSON value (strings without \\u0000, which PostgreSQL's jsonb cannot store)."});
    let row = json!({"type": "object", "description": "The row's columns (put) or those to change (patch)."});
    // A field sent as null is taken as absent (serde's `Option`), except `value` (null is a
    // value).
    let absent = json!({"type": "null"});
    let shape = |op: Value, props: Value, required: &[&str]| {
        json!({"type": "object", "additionalProperties": false, "required": required,
            "properties": merged(json!({"op": op}), props)})
    };
    json!({
        "description": "One op: {\"op\": \"put\", \"key\", \"value\"}, {\"op\": \"delete\", \"key\"}, or a table op with \
                        \"resource\" (then \"key\" is the row key's URL form) and \"row\" (put, patch).",
        "oneOf": [
            shape(json!({"const": "put"}), json!({"key": name, "value": value, "resource": absent, "row": absent}),
                  &["op", "key", "value"]),
            shape(json!({"const": "delete"}), json!({"key": name, "resource": absent, "row": absent}), &["op", "key"]),
            shape(json!({"enum": ["put", "patch"]}), json!({"key": row_key, "resource": resource, "row": row}),
                  &["op", "key", "resource", "row"]),
            shape(json!({"const": "delete"}), json!({"key": row_key, "resource": resource, "row": absent}),
                  &["op", "key", "resource"]),
        ]
    })
}

fn merged(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// Calls `f` with each parameter's location, name, schema and description, in every operation.
fn parameters(doc: &mut Value, mut f: impl FnMut(&str, &str, &mut Value, &mut Value)) {
    let paths = doc["paths"]
        .as_object_mut()
        .expect("the document has paths");
    for item in paths.values_mut() {
        for operation in item.as_object_mut().expect("a path item").values_mut() {
            let Some(params) = operation
                .get_mut("parameters")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for param in params {
                let location = param["in"].as_str().unwrap_or_default().to_owned();
                let name = param["name"].as_str().unwrap_or_default().to_owned();
                let param = param.as_object_mut().expect("a parameter");
                let mut description = param.remove("description").unwrap_or(Value::Null);
                let schema = param.entry("schema").or_insert_with(|| json!({}));
                f(&location, &name, schema, &mut description);
                if !description.is_null() {
                    param.insert("description".into(), description);
                }
            }
        }
    }
}

fn merge(schema: &mut Value, rules: &Value) {
    let schema = schema.as_object_mut().expect("a schema object");
    for (k, v) in rules.as_object().expect("rules are an object") {
        schema.insert(k.clone(), v.clone());
    }
}

fn append(description: &mut Value, text: &str) {
    *description = match description.as_str() {
        Some(before) => Value::from(format!("{before} {text}")),
        None => Value::from(text),
    };
}

fn property(schemas: &mut Map<String, Value>, schema: &str, name: &str, rule: Value) {
    let properties = schemas
        .get_mut(schema)
        .and_then(|s| s.get_mut("properties"))
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("the document has no schema {schema} with properties"));
    let described = properties
        .get(name)
        .unwrap_or_else(|| panic!("schema {schema} has no property {name}"));
    let mut rule = rule;
    if rule.get("description").is_none() {
        if let Some(description) = described.get("description") {
            rule["description"] = description.clone();
        }
    }
    properties.insert(name.into(), rule);
}

fn required(schemas: &mut Map<String, Value>, schema: &str, names: &[&str]) {
    let schema = schemas
        .get_mut(schema)
        .unwrap_or_else(|| panic!("the document has no schema {schema}"));
    schema["required"] = json!(names);
}

fn request_body(doc: &mut Value, path: &str, method: &str, schema: &str) {
    let pointer = format!(
        "/paths/{}/{method}/requestBody/content/application~1json/schema",
        path.replace('~', "~0").replace('/', "~1")
    );
    let body = doc
        .pointer_mut(&pointer)
        .unwrap_or_else(|| panic!("{method} {path} has no JSON request body"));
    *body = json!({"$ref": format!("#/components/schemas/{schema}")});
}

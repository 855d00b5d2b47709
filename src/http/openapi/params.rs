//! The parameters of the operations: each extractor says what it reads (`IntoParams`), and
//! the path parameters no extractor stands for are named here.

use utoipa::{
    openapi::{
        path::{Parameter, ParameterBuilder, ParameterIn},
        schema::{ObjectBuilder, Schema, Type},
        RefOr, Required,
    },
    IntoParams, PartialSchema,
};

use crate::{
    fence::FencingToken,
    http::extract::{KeyPath, Proof, ScopeHeader, ScopePath, Token},
};

fn header_param(
    name: &str,
    required: bool,
    schema: impl Into<RefOr<Schema>>,
    description: &str,
) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(if required {
            Required::True
        } else {
            Required::False
        })
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

fn path_param(name: &str, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1)),
        ))
        .build()
}

impl IntoParams for Token {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "X-Fencing-Token",
            true,
            FencingToken::schema(),
            "The fencing token of the lock the writer holds: a canonical decimal in 0..=9223372036854775807, \
             exactly one header. Missing: 428 missing-token; anything else: 400 malformed-token.",
        )]
    }
}

impl IntoParams for ScopeHeader {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "X-Fencing-Scope",
            false,
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1)),
            "Write under this scope's fence (normally the lock's name) instead of the key's own. \
             Percent-decoded like a path segment (caf%C3%A9 is café). Invalid: 400 invalid-scope.",
        )]
    }
}

impl IntoParams for Proof {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "X-Fencing-Proof",
            false,
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[A-Za-z0-9_-]+$")),
            "Required under a scope an [[issuers]] entry covers: base64url (no padding) of the issuer's \
             signature over \"fencegate-token-v1\\n{scope}\\n{token}\". Missing: 422 missing-token-proof; \
             wrong: 422 invalid-token-proof, also on any write when it is empty or not base64url.",
        )]
    }
}

impl IntoParams for crate::http::idempotency::IdemKey {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "Idempotency-Key",
            false,
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(255))
                .pattern(Some("^[!-~]+$")),
            "Makes a retry unambiguous (the IETF httpapi draft's header): an accepted write's answer is \
             kept with it for kv.idempotency_ttl_ms; the same key and request again answer it with \
             Idempotent-Replayed: true; the same key with another request is 422 idempotency-key-reused. \
             1..=255 visible ASCII bytes; else 400 invalid-request.",
        )]
    }
}

impl IntoParams for KeyPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![path_param(
            "key",
            "The key: one percent-decoded path segment (%2F is '/'), UTF-8, 1..=kv.max_key_bytes bytes, \
             no control characters. Invalid: 400 invalid-key.",
        )]
    }
}

impl IntoParams for ScopePath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![path_param(
            "scope",
            "The scope: one percent-decoded path segment, the rules of a key.",
        )]
    }
}

/// `{name}` of `/v1/locks/{name}` (a `ScopePath` too: a lock's name is its scope).
pub struct LockName;

impl IntoParams for LockName {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![path_param(
            "name",
            "The lock's name, also the scope its tokens fence: the rules of a key.",
        )]
    }
}

/// `{resource}/{key}` of the legacy-table routes.
pub struct RowParams;

impl IntoParams for RowParams {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            path_param("resource", "A [[resources]] name from the config file; unknown: 404 not-found."),
            path_param(
                "key",
                "The row key: the key columns' values in order, joined by ',', each percent-encoded \
                 (docs/tables.md). Invalid: 400 invalid-key.",
            ),
        ]
    }
}

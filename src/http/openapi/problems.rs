//! Which problem types each operation can answer, as its responses grouped by status; and the
//! credential's (401, 403, and the security requirement), from the route's access.

use std::collections::BTreeMap;

use utoipa::openapi::{
    content::ContentBuilder,
    response::ResponseBuilder,
    schema::{AllOfBuilder, ObjectBuilder, Schema, Type},
    Ref, RefOr, Response as ApiResponse,
};

use crate::http::problem::{kinds, ProblemType};

/// A string that is one of these problem types' URIs.
pub(super) fn type_enum(kinds: &[ProblemType]) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(kinds.iter().map(ProblemType::uri)))
}

/// Each operation's security and its credential's refusals (401, 403), from its route's
/// access (`routes::ALL`): the one place a route is open or guarded, here as in the gate.
/// Guarded operations inherit the document's `bearer` requirement.
pub fn describe_access(doc: &mut utoipa::openapi::OpenApi) {
    use crate::http::routes::{self, Access};
    use utoipa::openapi::security::SecurityRequirement;
    for (path, item) in doc.paths.paths.iter_mut() {
        let access = routes::access(Some(path));
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            let open = SecurityRequirement::default();
            match access {
                Access::Probe | Access::Open => operation.security = Some(vec![open]),
                Access::Metrics => {
                    operation.security = Some(vec![
                        open,
                        SecurityRequirement::new("bearer", Vec::<String>::new()),
                    ])
                }
                Access::Guarded => {}
            }
            if matches!(access, Access::Metrics | Access::Guarded) {
                for (status, response) in
                    problem_responses(&[kinds::UNAUTHENTICATED, kinds::FORBIDDEN])
                {
                    let listed = operation.responses.responses.insert(status, response);
                    assert!(listed.is_none(), "{path}: the credential's refusals are the route's access, not its handler's");
                }
            }
        }
    }
}

/// The problem types of an operation as responses, one per status, each naming its types.
pub fn problem_responses(kinds: &[ProblemType]) -> BTreeMap<String, RefOr<ApiResponse>> {
    let mut by_status: BTreeMap<u16, Vec<ProblemType>> = BTreeMap::new();
    for kind in kinds {
        let list = by_status.entry(kind.status).or_default();
        if !list.contains(kind) {
            list.push(*kind);
        }
    }
    by_status
        .into_iter()
        .map(|(status, kinds)| {
            let names: Vec<String> = kinds
                .iter()
                .map(|k| format!("{} ({})", k.slug, k.title))
                .collect();
            let schema = AllOfBuilder::new()
                .item(Ref::from_schema_name("Problem"))
                .item(ObjectBuilder::new().property("type", type_enum(&kinds)))
                .build();
            let response = ResponseBuilder::new()
                .description(names.join("; "))
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Schema::AllOf(schema)))
                        .build(),
                )
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// `problems!(Name: KIND, ...)`: a type listing those problem types as responses, for the
/// `responses(...)` of a `#[utoipa::path]`.
macro_rules! problems {
    ($($(#[$doc:meta])* $name:ident: [$($kind:ident),* $(,)?] $(+ $more:ident)*;)*) => {$(
        $(#[$doc])*
        pub struct $name;
        impl $name {
            pub fn kinds() -> Vec<ProblemType> {
                #[allow(unused_mut)]
                let mut kinds = vec![$(kinds::$kind),*];
                $(kinds.extend($more::kinds());)*
                kinds
            }
        }
        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<ApiResponse>> {
                problem_responses(&Self::kinds())
            }
        }
    )*};
}

problems! {
    /// Anything the edge refuses on any route (`edge::admit`: two Host headers or a bad
    /// Content-Length, the Host check, a transfer coding, a body it cannot take, overload,
    /// failure): a body sent to a route that takes none is read and checked like any other.
    /// The credential's refusals (401, 403) are added from the route's access by
    /// [`describe_access`].
    Edge: [INVALID_REQUEST, MISDIRECTED_REQUEST, METHOD_NOT_ALLOWED, UNAVAILABLE, INTERNAL] + Body;
    /// What the edge refuses of a body, on any route.
    Body: [INVALID_JSON, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, UNSUPPORTED_TRANSFER_CODING, BODY_TIMEOUT];
    /// A fenced write's refusals (nothing is written).
    Fenced: [MISSING_TOKEN, MALFORMED_TOKEN, INVALID_SCOPE, STALE_TOKEN, SCOPE_MISMATCH, TOKEN_NOT_ISSUED,
             TOKEN_JUMP, MISSING_TOKEN_PROOF, INVALID_TOKEN_PROOF];
    /// A write that takes an `Idempotency-Key`: a bad key, a key reused for another request.
    Keyed: [INVALID_REQUEST, IDEMPOTENCY_KEY_REUSED];
    KvPut: [INVALID_KEY] + Edge + Body + Fenced + Keyed;
    KvDelete: [INVALID_KEY] + Edge + Fenced + Keyed;
    KvGet: [INVALID_KEY, NOT_FOUND] + Edge;
    Batch: [INVALID_BATCH, INVALID_KEY, INVALID_ROW, INVALID_VALUE, NOT_FOUND] + Edge + Body + Fenced + Keyed;
    FenceClaim: [MISSING_TOKEN, MALFORMED_TOKEN, INVALID_SCOPE, STALE_TOKEN, TOKEN_NOT_ISSUED, TOKEN_JUMP,
                 MISSING_TOKEN_PROOF, INVALID_TOKEN_PROOF] + Edge + Keyed;
    FenceGet: [INVALID_SCOPE, NOT_FOUND] + Edge;
    LockAcquire: [INVALID_SCOPE, INVALID_REQUEST, LOCK_HELD, LOCK_EXHAUSTED, SCOPE_HAS_ISSUER] + Edge + Body;
    LockRenew: [INVALID_SCOPE, MISSING_TOKEN, MALFORMED_TOKEN, INVALID_REQUEST, LOCK_LOST] + Edge + Body;
    LockRelease: [INVALID_SCOPE, MISSING_TOKEN, MALFORMED_TOKEN, LOCK_LOST] + Edge;
    LockGet: [INVALID_SCOPE, NOT_FOUND] + Edge;
    TableWrite: [NOT_FOUND, INVALID_KEY, INVALID_ROW, INVALID_VALUE] + Edge + Body + Fenced + Keyed;
    TableDelete: [NOT_FOUND, INVALID_KEY] + Edge + Fenced + Keyed;
    TableGet: [NOT_FOUND, INVALID_KEY] + Edge;
    Reset: [INVALID_REQUEST, INVALID_KEY, INVALID_SCOPE, INVALID_ROW, NOT_FOUND, RESET_NOT_BELOW, BINDING_CONFLICT] + Edge + Body;
    Retire: [INVALID_REQUEST, INVALID_SCOPE, NOT_FOUND] + Edge + Body;
    Rebind: [INVALID_REQUEST, INVALID_SCOPE, NOT_FOUND, BINDING_CONFLICT] + Edge + Body;
    Audit: [INVALID_REQUEST] + Edge;
    Readiness: [UNAVAILABLE] + Edge;
}

//! Request extractors: the only way request text becomes a token, key, scope or JSON value.
//! Each refuses bad input with the problem a client should see.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, MatchedPath, Request},
    http::{request::Parts, HeaderMap, HeaderName},
};

use super::{problem::ApiError, AppState};
use crate::fence::{FencingToken, Key, Scope};

pub const TOKEN_HEADER: &str = "x-fencing-token";
pub const SCOPE_HEADER: &str = "x-fencing-scope";
pub const PROOF_HEADER: &str = "x-fencing-proof";

// The same names as `HeaderName`s, made once: looking a header up by a `&str` parses and
// lowercases the name on every call (a few hundred instructions per header per request).
static TOKEN: HeaderName = HeaderName::from_static(TOKEN_HEADER);
static SCOPE: HeaderName = HeaderName::from_static(SCOPE_HEADER);
static PROOF: HeaderName = HeaderName::from_static(PROOF_HEADER);

/// The single `X-Fencing-Token` header: missing -> 428, anything not canonical -> 400.
pub struct Token(pub FencingToken);

impl<S: Send + Sync> FromRequestParts<S> for Token {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match single_header(&parts.headers, &TOKEN) {
            Header::Missing => Err(ApiError::MissingToken),
            Header::Repeated => Err(ApiError::MalformedToken(
                "the X-Fencing-Token header appears more than once; send exactly one".into(),
            )),
            Header::One(raw) => Ok(Token(FencingToken::parse(raw)?)),
        }
    }
}

/// The optional `X-Fencing-Scope` header, percent-decoded exactly like a path segment
/// (`crate::percent`), so `caf%C3%A9` names the scope of `/v1/locks/caf%C3%A9`.
pub struct ScopeHeader(pub Option<Scope>);

impl FromRequestParts<AppState> for ScopeHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match single_header(&parts.headers, &SCOPE) {
            Header::Missing => Ok(ScopeHeader(None)),
            Header::Repeated => Err(ApiError::InvalidScope(
                "the X-Fencing-Scope header appears more than once; send exactly one".into(),
            )),
            Header::One(raw) => {
                let text = crate::percent::decode_strict(raw).map_err(|why| {
                    ApiError::InvalidScope(format!("the X-Fencing-Scope header: {why}"))
                })?;
                Scope::parse(&text, state.kv.max_key_bytes)
                    .map(|s| ScopeHeader(Some(s)))
                    .map_err(ApiError::invalid_scope)
            }
        }
    }
}

/// The optional `X-Fencing-Proof` header: an issuer's signature of the token (`crate::issuers`).
/// Checked against the scope the write ends up under (after `[[scopes]]` bindings), by
/// [`Proof::check`], before any database work.
pub struct Proof(Option<Vec<u8>>);

impl<S: Send + Sync> FromRequestParts<S> for Proof {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match single_header(&parts.headers, &PROOF) {
            Header::Missing => Ok(Proof(None)),
            Header::Repeated => Err(ApiError::Proof(crate::issuers::ProofError::Invalid {
                issuer: "-".into(),
                why: "the X-Fencing-Proof header appears more than once; send exactly one",
            })),
            // base64url without padding, as the document's pattern says: checked on every
            // write that sends one (not only under an issuer), so an empty or garbled header
            // is refused rather than ignored.
            Header::One(raw)
                if raw.is_empty()
                    || !raw
                        .iter()
                        .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') =>
            {
                Err(ApiError::Proof(crate::issuers::ProofError::Invalid {
                    issuer: "-".into(),
                    why: "the X-Fencing-Proof header must be non-empty base64url without padding                           (A-Z a-z 0-9 - _); send the issuer's signature, or no header",
                }))
            }
            Header::One(raw) => Ok(Proof(Some(raw.to_vec()))),
        }
    }
}

impl Proof {
    pub fn bytes(&self) -> Option<&[u8]> {
        self.0.as_deref()
    }

    /// 422 unless the issuer covering `guard`'s scope (if any) signed its token for it.
    pub fn check(&self, state: &AppState, guard: &crate::fence::Guard) -> Result<(), ApiError> {
        match guard.scope() {
            Some(scope) => Ok(state.issuers.check(scope, guard.token, self.0.as_deref())?),
            None => Ok(()),
        }
    }
}

enum Header<'a> {
    Missing,
    Repeated,
    One(&'a [u8]),
}

fn single_header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Header<'a> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Header::Missing,
        (Some(_), Some(_)) => Header::Repeated,
        (Some(value), None) => Header::One(value.as_bytes()),
    }
}

/// The `{key}` path segment, percent-decoded and validated.
pub struct KeyPath(pub Key);

impl FromRequestParts<AppState> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state)
            .await
            .map_err(ApiError::InvalidKey)?;
        Key::parse(&raw, state.kv.max_key_bytes)
            .map(KeyPath)
            .map_err(ApiError::invalid_key)
    }
}

/// The `{scope}` path segment, percent-decoded and validated.
pub struct ScopePath(pub Scope);

impl FromRequestParts<AppState> for ScopePath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state)
            .await
            .map_err(ApiError::InvalidScope)?;
        Scope::parse(&raw, state.kv.max_key_bytes)
            .map(ScopePath)
            .map_err(ApiError::invalid_scope)
    }
}

/// The route's `{...}` parameter, strictly percent-decoded (`crate::percent`): an invalid
/// escape is refused rather than kept as literal text, so a name has one spelling. Taken from
/// the raw request path at the position of the parameter in the route's template: axum's own
/// extractors (even `RawPathParams`) hand out leniently decoded text.
async fn path_segment(parts: &mut Parts, _: &AppState) -> Result<String, String> {
    let template = parts
        .extensions
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
        .unwrap_or_default();
    let raw = template
        .split('/')
        .position(|segment| segment.starts_with('{'))
        .and_then(|index| parts.uri.path().split('/').nth(index))
        .ok_or_else(|| "this route has no path parameter".to_owned())?;
    crate::percent::decode_strict(raw.as_bytes()).map_err(|why| format!("the path segment: {why}"))
}

/// A JSON body of any shape. Over the body limit -> 413; not JSON -> 400.
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read_body(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The whole body, within the configured limit (413 past it).
pub(super) async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let limit = req
        .extensions()
        .get::<BodyLimit>()
        .map(|l| l.0)
        .unwrap_or_default();
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { limit }
        } else {
            ApiError::InvalidJson(format!(
                "the body could not be read: {}",
                rejection.body_text()
            ))
        }
    })
}

/// A body as JSON of type `T`: empty or not JSON -> 400.
pub(super) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::InvalidJson(
            "the body is empty; send a JSON document".into(),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::InvalidJson(e.to_string()))
}

/// The configured body limit, put in request extensions so 413 problems can state it.
#[derive(Clone, Copy)]
pub struct BodyLimit(pub usize);

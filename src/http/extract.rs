//! Request extractors: the only way request text becomes a token, key, scope or JSON value.
//! Each refuses bad input with the problem a client should see.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Request},
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

/// Puts a read's `X-Fencing-Token` into its answer. The value is sent never indexed by
/// HTTP/2's header compression (as the request id is): tokens differ from key to key, so the
/// HPACK table would store one per read, compare each new one with every token it holds, and
/// evict the fields that do repeat (content-type, date). HTTP/1.1 sends the same bytes as before.
pub(super) fn answer_token(headers: &mut HeaderMap, token: FencingToken) {
    let mut value = axum::http::HeaderValue::from(token.get());
    value.set_sensitive(true);
    headers.insert(TOKEN.clone(), value);
}

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

pub(super) enum Header<'a> {
    Missing,
    Repeated,
    One(&'a [u8]),
}

/// The values of `name`, found by walking the request's headers rather than looking the name
/// up: a lookup hashes the whole name and probes the table, about 170-240 instructions for
/// each of the fencing headers a PUT asks for, present or not (callgrind), where a request
/// carries a handful of headers and a walk compares each name's length first. Bounded: hyper
/// takes at most 100 headers over HTTP/1.1, and `server.http2_max_header_list_bytes` bounds
/// them over HTTP/2.
pub(super) fn single_header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Header<'a> {
    let mut found = Header::Missing;
    for (_, value) in headers.iter().filter(|(n, _)| *n == name) {
        found = match found {
            Header::Missing => Header::One(value.as_bytes()),
            _ => return Header::Repeated,
        };
    }
    found
}

/// The `{key}` path segment, percent-decoded and validated.
pub struct KeyPath(pub Key);

impl FromRequestParts<AppState> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state)
            .await
            .map_err(ApiError::InvalidKey)?;
        Key::parse_owned(raw, state.kv.max_key_bytes)
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
        Scope::parse_owned(raw, state.kv.max_key_bytes)
            .map(ScopePath)
            .map_err(ApiError::invalid_scope)
    }
}

/// The route's `{...}` parameter, strictly percent-decoded (`crate::percent`): an invalid
/// escape is refused rather than kept as literal text, so a name has one spelling. Taken from
/// the raw request path at the position of the parameter in the route's template: axum's own
/// extractors (even `RawPathParams`) hand out leniently decoded text.
async fn path_segment(parts: &mut Parts, _: &AppState) -> Result<String, String> {
    let template = super::routes::template(&parts.extensions).unwrap_or_default();
    let raw = parameter_segment(template, parts.uri.path())
        .ok_or_else(|| "this route has no path parameter".to_owned())?;
    crate::percent::decode_strict(raw.as_bytes()).map_err(|why| format!("the path segment: {why}"))
}

/// The segment of `path` at the position of `template`'s first `{...}` segment, found on
/// bytes: `/` is ASCII, so each cut falls on a character boundary (`str::split` with a `char`
/// pattern cost about 700 instructions per request here).
fn parameter_segment<'a>(template: &str, path: &'a str) -> Option<&'a str> {
    fn slashes(s: &str) -> impl Iterator<Item = usize> + '_ {
        s.as_bytes()
            .iter()
            .enumerate()
            .filter_map(|(at, b)| (*b == b'/').then_some(at))
    }
    // Segment n starts after the n-th `/` (segment 0 is what precedes the first).
    let n = slashes(template).position(|at| template.as_bytes().get(at + 1) == Some(&b'{'))? + 1;
    let mut cuts = slashes(path).skip(n - 1);
    let start = cuts.next()? + 1;
    let end = cuts.next().unwrap_or(path.len());
    Some(&path[start..end])
}

/// A JSON body of any shape. Over the body limit -> 413; not JSON -> 400.
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let bytes = read_body(req)?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The whole body, as the edge read it (within the configured limit: 413 past it).
pub(super) fn read_body(mut req: Request) -> Result<Bytes, ApiError> {
    match req.extensions_mut().remove::<Admitted>() {
        Some(Admitted(body)) => Ok(body),
        // Every route is behind the gate, whose edge reads each body within the limits; a
        // handler reached another way must fail loudly rather than read a body unbounded.
        None => Err(ApiError::Internal(
            "the request's body was not read by the edge".into(),
        )),
    }
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

/// A request's body as the edge read it in full, put in the request's extensions by the gate.
/// Handlers take the bytes from here: the edge already holds them, and reading them again
/// through a body (axum's `Bytes` extractor: a limit wrapper, a boxed body and a list of
/// frames) cost about 1,400 instructions per request.
#[derive(Clone)]
pub struct Admitted(pub Bytes);

#[cfg(test)]
mod tests {
    use super::parameter_segment;

    /// What `str::split` finds (the way it was found before), for every template and path.
    #[test]
    fn the_parameter_segment_is_the_one_split_finds() {
        let templates = [
            "/v1/kv/{key}",
            "/v1/fences/{scope}",
            "/v1/locks/{name}/renew",
            "/v1/admin/kv/{key}/reset",
            "/v1/tables/{resource}/{key}",
            "/healthz",
        ];
        let paths = [
            "/v1/kv/a",
            "/v1/kv/",
            "/v1/kv",
            "/v1/kv/%C3%A9t%C3%A9",
            "/v1/kv/é/x",
            "/v1/locks/n/renew",
            "/v1/admin/kv/k/reset",
            "/v1/tables/t/k",
            "/",
            "",
            "//",
        ];
        for template in templates {
            for path in paths {
                let split = template
                    .split('/')
                    .position(|segment| segment.starts_with('{'))
                    .and_then(|index| path.split('/').nth(index));
                assert_eq!(
                    parameter_segment(template, path),
                    split,
                    "{template} {path}"
                );
            }
        }
    }
}

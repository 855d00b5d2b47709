//! `Idempotency-Key` on the write routes (the IETF httpapi draft's header): parsing the key,
//! the request's fingerprint, and the answer of a keyed write (first or replayed). What is
//! kept, where, and for how long: `store::idempotency`.
//!
//! The fingerprint is a SHA-256 over what decides a write's effect: the method, the route, the
//! path (its parameters) and query, the fencing headers (token, scope, proof) and the body. A
//! retry with the same key must send the same request; another one is 422.

use std::{borrow::Cow, sync::Arc};

use axum::{
    extract::{FromRequest, FromRequestParts, Request},
    http::{header, request::Parts, HeaderName, HeaderValue, StatusCode},
    response::Response,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{
    extract::{single_header, Header, PROOF_HEADER, SCOPE_HEADER, TOKEN_HEADER},
    problem::{accepted, ApiError},
    report::Accepted,
    AppState,
};
use crate::{
    auth::Actor,
    store::{Answer, Done, IdemId, Keep, Keyed},
};

pub const KEY_HEADER: &str = "idempotency-key";
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The longest key, in bytes (the draft leaves it to the server).
pub const MAX_KEY_BYTES: usize = 255;

static KEY: HeaderName = HeaderName::from_static(KEY_HEADER);
static REPLAYED: HeaderName = HeaderName::from_static(REPLAYED_HEADER);

/// The `Idempotency-Key` of a write, if sent, with the fingerprint of everything but the body
/// so far. Absent: nothing is computed (a write without a key pays for nothing here).
pub struct IdemKey(pub Option<Pending>);

/// A key and its request's fingerprint in the making.
pub struct Pending {
    key: String,
    route: String,
    hasher: Sha256,
}

/// Length-prefixed, so no two different requests hash the same parts to the same stream.
fn part(hasher: &mut Sha256, bytes: Option<&[u8]>) {
    match bytes {
        None => hasher.update([0u8]),
        Some(bytes) => {
            hasher.update([1u8]);
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        }
    }
}

/// The key's value, if it is one: 1..=255 bytes of visible ASCII, sent once.
pub fn parse_key(parts: &Parts) -> Result<Option<String>, ApiError> {
    let bytes = match single_header(&parts.headers, &KEY) {
        Header::Missing => return Ok(None),
        Header::Repeated => {
            return Err(ApiError::InvalidIdempotencyKey(
                "the Idempotency-Key header appears more than once; send exactly one".into(),
            ))
        }
        Header::One(bytes) => bytes,
    };
    if bytes.is_empty() || bytes.len() > MAX_KEY_BYTES {
        return Err(ApiError::InvalidIdempotencyKey(format!(
            "the Idempotency-Key header must be 1 to {MAX_KEY_BYTES} bytes, got {}",
            bytes.len()
        )));
    }
    if !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ApiError::InvalidIdempotencyKey(
            "the Idempotency-Key header must be visible ASCII (no spaces or control characters); \
             a UUID or 32 hex digits will do"
                .into(),
        ));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

impl<S: Send + Sync> FromRequestParts<S> for IdemKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(key) = parse_key(parts)? else {
            return Ok(IdemKey(None));
        };
        let template = super::routes::template(&parts.extensions).unwrap_or_default();
        let route = format!("{} {template}", parts.method);
        let mut hasher = Sha256::new();
        part(&mut hasher, Some(route.as_bytes()));
        part(&mut hasher, Some(parts.uri.path().as_bytes()));
        part(&mut hasher, parts.uri.query().map(str::as_bytes));
        for name in [TOKEN_HEADER, SCOPE_HEADER, PROOF_HEADER] {
            let mut values = parts.headers.get_all(name).iter();
            part(&mut hasher, values.next().map(HeaderValue::as_bytes));
            // The extractors refuse a repeated header; hash it anyway, to be exact.
            for more in values {
                part(&mut hasher, Some(more.as_bytes()));
            }
        }
        Ok(IdemKey(Some(Pending { key, route, hasher })))
    }
}

impl Pending {
    /// What to keep for this write: the key namespaced by `actor` and the route, and the
    /// request's fingerprint with `body` (the raw body's digest, if the route takes one).
    pub fn keep(
        self,
        state: &AppState,
        actor: &Actor,
        body: Option<[u8; 32]>,
        render: Render,
    ) -> Keep {
        let mut hasher = self.hasher;
        part(&mut hasher, body.as_ref().map(|d| &d[..]));
        Keep {
            id: IdemId {
                actor: actor.name().unwrap_or_default().to_owned(),
                route: self.route,
                key: self.key,
            },
            fingerprint: hex(&hasher.finalize()),
            ttl_ms: i64::try_from(state.kv.idempotency_ttl_ms).unwrap_or(i64::MAX),
            render: render.0,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A handler's rendering of what its write did, for the store to keep with the write.
pub struct Render(pub crate::store::Render);

impl Render {
    pub fn new(render: impl Fn(Done<'_>) -> Answer + Send + Sync + 'static) -> Self {
        Render(Arc::new(render))
    }
}

/// A JSON answer: the status and the serialized body (a write's answers carry no other header
/// than their content type).
pub fn json_answer(status: StatusCode, body: &impl Serialize) -> Answer {
    json_text_answer(
        status,
        serde_json::to_vec(body).expect("a response body serializes"),
    )
}

/// A JSON answer whose body is already JSON text.
pub fn json_text_answer(status: StatusCode, body: Vec<u8>) -> Answer {
    Answer {
        status: status.as_u16(),
        headers: vec![(
            Cow::Borrowed(header::CONTENT_TYPE.as_str()),
            Cow::Borrowed(JSON),
        )],
        body,
    }
}

const JSON: &str = "application/json";

/// The response for `answer`; `replayed`: with `Idempotent-Replayed: true`.
pub fn respond(answer: Answer, replayed: bool) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let mut response = Response::new(axum::body::Body::from(answer.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    let mut typed = false;
    for (name, value) in &answer.headers {
        // Headers fencegate wrote itself are static and valid: taken as they are. Those read
        // back from a kept row are checked, and one that is not a header is left out.
        let parsed = match (name, value) {
            (Cow::Borrowed(name), Cow::Borrowed(value)) => Some((
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            )),
            _ => HeaderName::from_bytes(name.as_bytes())
                .ok()
                .zip(HeaderValue::from_str(value).ok()),
        };
        if let Some((name, value)) = parsed {
            typed |= name == header::CONTENT_TYPE;
            headers.insert(name, value);
        }
    }
    if !typed {
        // A kept answer without a usable type (never one fencegate wrote): bytes, as ever.
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    if replayed {
        headers.insert(REPLAYED.clone(), HeaderValue::from_static("true"));
    }
    response
}

/// The answer to a keyed write: rendered now if it was judged now, else the first answer
/// (replayed), or 422 for a key reused with another request.
pub fn finish<T>(
    keyed: Keyed<T>,
    render: impl FnOnce(&T) -> Answer,
) -> Result<Accepted<Response>, ApiError> {
    match keyed {
        Keyed::Fresh(outcome) => Ok(Accepted(respond(render(&accepted(outcome)?), false))),
        Keyed::Replayed(answer) => Ok(Accepted(respond(answer, true))),
        Keyed::Reused => Err(ApiError::IdempotencyKeyReused),
    }
}

/// A JSON body (as `extract::JsonBody`) and, when the request has an `Idempotency-Key`, the
/// SHA-256 of its raw bytes for the fingerprint.
pub struct KeyedJson<T> {
    pub value: T,
    pub digest: Option<[u8; 32]>,
}

impl<T, S> FromRequest<S> for KeyedJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let keyed = req.headers().contains_key(&KEY);
        let bytes = super::extract::read_body(req)?;
        let value = super::extract::parse_json(&bytes)?;
        let digest = keyed.then(|| Sha256::digest(&bytes).into());
        Ok(KeyedJson { value, digest })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh answer, a kept one read back (owned headers) and a kept one with no type all
    /// answer as the first answer did.
    #[test]
    fn answers_keep_their_type_fresh_and_replayed() {
        let fresh = respond(
            json_answer(StatusCode::CREATED, &serde_json::json!({"a": 1})),
            false,
        );
        assert_eq!(fresh.status(), StatusCode::CREATED);
        assert_eq!(fresh.headers()[header::CONTENT_TYPE], JSON);
        assert!(fresh.headers().get(REPLAYED_HEADER).is_none());
        let kept = Answer {
            status: 200,
            headers: vec![(
                Cow::Owned("content-type".into()),
                Cow::Owned("application/json".into()),
            )],
            body: b"{}".to_vec(),
        };
        let replayed = respond(kept, true);
        assert_eq!(replayed.headers()[header::CONTENT_TYPE], JSON);
        assert_eq!(replayed.headers()[REPLAYED_HEADER], "true");
        let untyped = Answer {
            status: 200,
            headers: Vec::new(),
            body: b"x".to_vec(),
        };
        assert_eq!(
            respond(untyped, true).headers()[header::CONTENT_TYPE],
            "application/octet-stream"
        );
    }
}

//! Authentication and authorization over HTTP.
//!
//! - [`authenticate`], called by the gate for every route that needs a credential (which
//!   ones: [`super::routes`]), turns the `Authorization` header (or, without one, the
//!   connection's verified client certificate, a request extension set by `conn`) into an
//!   [`Actor`] in the request's extensions, or answers 401. It is not called at all when auth
//!   is off.
//! - Handlers take the [`Actor`] extractor and call [`check`] (or [`check_table`],
//!   [`check_admin`]) next to the route, before any store call: a refused request changes
//!   nothing.

use axum::{
    extract::{FromRequestParts, Request},
    http::{header::AUTHORIZATION, request::Parts},
    response::{IntoResponse, Response},
};

use super::{problem::ApiError, routes::Credential, AppState};
use crate::auth::{Actor, Authenticator, ClientCert, Right, Unauthenticated};

// The kind of name a right is checked on lives with the rights (both this module and
// `problem` name it; neither owns it).
pub use crate::auth::Named;

/// 401 unless the request carries a valid credential; 403 if `need` is the admin right and
/// the credential lacks it. The actor goes into the request's extensions, for the handler, and
/// its name onto the request's span. Called by the gate ([`super::gate`]) on every route whose
/// [`Access`](super::routes::Access) asks for a credential; never with auth off.
// The refusal is the response itself, built once, on the refusal path only: boxing it would
// cost every caller an indirection for nothing.
#[allow(clippy::result_large_err)]
pub fn authenticate(
    auth: &Authenticator,
    need: Credential,
    req: &mut Request,
) -> Result<Actor, Response> {
    let cert = req
        .extensions()
        .get::<std::sync::Arc<ClientCert>>()
        .map(|c| &**c);
    let mut values = req.headers().get_all(AUTHORIZATION).iter();
    let found = match (values.next(), values.next()) {
        (None, _) => auth.authenticate(None, cert),
        (Some(_), Some(_)) => Err(Unauthenticated::Malformed),
        (Some(value), None) => auth.authenticate(Some(value.as_bytes()), cert),
    };
    let actor = found.map_err(|why| ApiError::Unauthenticated(why).into_response())?;
    if need == Credential::Admin {
        check_admin(&actor).map_err(IntoResponse::into_response)?;
    }
    if let Some(name) = actor.name() {
        tracing::Span::current().record("actor", name);
    }
    req.extensions_mut().insert(actor.clone());
    Ok(actor)
}

impl FromRequestParts<AppState> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match parts.extensions.get::<Actor>() {
            Some(actor) => Ok(actor.clone()),
            None if state.auth.is_none() => Ok(Actor::open()),
            // Auth is on but the middleware let this request through (an open route): no rights.
            None => Err(ApiError::Unauthenticated(Unauthenticated::Missing)),
        }
    }
}

/// `right` on the key, scope or lock `name` (decoded), else 403.
pub fn check(actor: &Actor, right: Right, named: Named, name: &str) -> Result<(), ApiError> {
    if actor.allows(right, name) {
        Ok(())
    } else {
        Err(ApiError::Forbidden {
            right,
            refused: Some((named, name.to_owned())),
        })
    }
}

/// `right` on the legacy-table `resource`, else 403.
pub fn check_table(actor: &Actor, right: Right, resource: &str) -> Result<(), ApiError> {
    if actor.allows_table(right, resource) {
        Ok(())
    } else {
        Err(ApiError::Forbidden {
            right,
            refused: Some((Named::Resource, resource.to_owned())),
        })
    }
}

/// The `admin` right (`/v1/admin/*`, a protected `/metrics`), else 403.
pub fn check_admin(actor: &Actor) -> Result<(), ApiError> {
    if actor.is_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden {
            right: Right::Admin,
            refused: None,
        })
    }
}

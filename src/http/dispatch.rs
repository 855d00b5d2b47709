//! The application as one service: a request for a key (`GET`, `PUT` or `DELETE` of
//! `/v1/kv/{key}`) goes to its handler through the very same layers as every route, without
//! axum's router; every other request goes through the router.
//!
//! Why: on the hottest route the router's own work was about 2,000 instructions of a lone PUT
//! (callgrind): matching the path; percent-decoding `{key}` into `UrlParams` (two `Arc<str>`s
//! and a `Vec` in the request's extensions, which no handler here reads: `extract` takes the
//! key from the path itself); and a boxed clone of the layered route and of the handler's
//! route, each with its future boxed again. Here: one comparison of the path, and the layers
//! call the handler directly.
//!
//! What is taken here is exactly what the router would send to the kv route's handlers (a unit
//! test holds the two to each other for every route): those three methods, and a path of
//! `/v1/kv/` and one non-empty segment. `HEAD`, `OPTIONS` (a CORS preflight) and any other
//! method, and every other path, go to the router, which answers them as before (the `GET`
//! handler for `HEAD`, 405 with `Allow`, the preflight, 404). The layers are the router's own
//! values, cloned: request ids, metrics, in-flight slots and credentials are shared.

use std::{convert::Infallible, future::Future, pin::Pin, task::Context, task::Poll};

use axum::{extract::Request, handler::Handler, http::Method, response::Response, Router};
use futures_util::{future::Map, FutureExt as _};
use tower::{util::Either, Service, ServiceExt as _};
use tower_http::cors::Cors;

use super::{gate::Gate, kv, observe::Observe, routes, AppState};

/// The layers over the kv handlers: the router's, in the same order.
type KvStack = Observe<Either<Cors<Gate<KvRoute>>, Gate<KvRoute>>>;

/// Every route: the kv route's requests straight to their handlers, the rest through `router`.
#[derive(Clone)]
pub struct App {
    router: Router,
    kv: KvStack,
}

impl App {
    pub(super) fn new(router: Router, kv: KvStack) -> Self {
        App { router, kv }
    }

    /// The response to `req`. Only the half that serves it is cloned into the future (a
    /// clone of the kv stack is half a dozen reference counts, paid by every request if `serve`
    /// took the whole `App`).
    pub fn serve(&self, mut req: Request) -> impl Future<Output = Response> + Send + 'static {
        let target = if is_kv(req.method(), req.uri().path()) {
            req.extensions_mut().insert(routes::Matched(routes::KV));
            Either::Left(self.kv.clone())
        } else {
            Either::Right(self.router.clone())
        };
        // A `map` of the call rather than an `async` block that makes it: the block would hold
        // the service and the request beside the call that took them.
        target.oneshot(req).map(|Ok(response)| response)
    }
}

/// Whether axum's router would send this request to a kv handler (the route `/v1/kv/{key}`,
/// whose `{key}` is one non-empty path segment, and a method it has a handler for).
fn is_kv(method: &Method, path: &str) -> bool {
    const PREFIX: &str = "/v1/kv/";
    (*method == Method::PUT || *method == Method::GET || *method == Method::DELETE)
        && path
            .strip_prefix(PREFIX)
            .is_some_and(|key| !key.is_empty() && !key.contains('/'))
}

/// The kv handlers by method, called as the router calls them (`Handler::call` with the state).
#[derive(Clone)]
pub(super) struct KvRoute(pub(super) AppState);

type Handled = Pin<Box<dyn Future<Output = Response> + Send>>;

impl Service<Request> for KvRoute {
    type Response = Response;
    type Error = Infallible;
    type Future = Map<Handled, fn(Response) -> Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let state = self.0.clone();
        let handled: Handled = match *req.method() {
            Method::PUT => Handler::call(kv::put, req, state),
            Method::DELETE => Handler::call(kv::delete, req, state),
            // `is_kv` lets only GET through besides.
            _ => Handler::call(kv::get, req, state),
        };
        handled.map(Ok as fn(Response) -> Result<Response, Infallible>)
    }
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, extract::MatchedPath, routing::any};

    use super::*;

    /// The router's verdict: the template it matched for `path`, if any.
    async fn routed(router: &Router, path: &str) -> Option<String> {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
        let response = router.clone().oneshot(req).await.unwrap();
        let body = axum::body::to_bytes(response.into_body(), 1 << 10)
            .await
            .unwrap();
        (!body.is_empty()).then(|| String::from_utf8(body.to_vec()).unwrap())
    }

    /// `KvRoute` calls the handlers the router has on the kv route: the document, which is made
    /// of what the router serves, names exactly these operations there.
    #[test]
    fn the_router_has_the_same_kv_handlers() {
        let doc = serde_json::to_value(super::super::routers().2).unwrap();
        let item = doc["paths"][routes::KV].as_object().unwrap();
        let mut ops: Vec<(String, String)> = item
            .iter()
            .filter_map(|(method, op)| {
                Some((method.clone(), op.get("operationId")?.as_str()?.to_owned()))
            })
            .collect();
        ops.sort();
        let expected = [
            ("delete", "kv_delete"),
            ("get", "kv_get"),
            ("put", "kv_put"),
        ]
        .map(|(m, id)| (m.to_owned(), id.to_owned()));
        assert_eq!(
            ops, expected,
            "the kv route's handlers changed: change KvRoute with them"
        );
    }

    #[tokio::test]
    async fn takes_exactly_what_the_router_sends_to_the_kv_route() {
        // Every route template, each answering with the template it matched.
        let mut router = Router::new();
        for route in routes::ALL {
            router = router.route(
                route.path,
                any(|matched: MatchedPath| async move { matched.as_str().to_owned() }),
            );
        }
        let router = router.fallback(|| async { "" });
        let mut paths: Vec<String> = routes::ALL
            .iter()
            .map(|r| r.path.replace("{key}", "k").replace(['{', '}'], ""))
            .collect();
        paths.extend(
            [
                "/v1/kv/",
                "/v1/kv",
                "/v1/kv//",
                "/v1/kv//k",
                "/v1/kv/k/",
                "/v1/kv/k/reset",
                "/v1/kv/a%2Fb",
                "/v1/kv/%20",
                "/v1/kv/{key}",
                "/v1/kv/..",
                "/v1/kv/k?x=/y",
                "/v1/kvx/k",
                "/V1/kv/k",
                "/v1/admin/kv/k/reset",
                "/v1/kv/rebind",
                "/",
            ]
            .map(str::to_owned),
        );
        for path in &paths {
            let uri: axum::http::Uri = path.parse().unwrap();
            let router_says = routed(&router, path).await;
            let kv = router_says.as_deref() == Some(routes::KV);
            for method in [Method::GET, Method::PUT, Method::DELETE] {
                assert_eq!(is_kv(&method, uri.path()), kv, "{method} {path}");
            }
            for method in [Method::HEAD, Method::POST, Method::OPTIONS, Method::PATCH] {
                assert!(!is_kv(&method, uri.path()), "{method} {path}");
            }
        }
    }
}

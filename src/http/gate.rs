//! Everything between `observe` and a handler, in one service: the panic guard, the edge
//! ([`super::edge`]: Host, Content-Type, the body read in full), the in-flight limit with load
//! shedding, the request timeout, and authentication.
//!
//! These were eight layers (tower-http's `CatchPanic`, an axum `from_fn` for the edge, two
//! `Extension`s, `HandleError` + `LoadShed` + `GlobalConcurrencyLimit` + `Timeout`, and a
//! `from_fn` for auth). Applied to a `Router`, each `.layer` boxes every route again: per
//! request a clone of a boxed service and a boxed future per level, and the futures moved
//! into those boxes were the largest single item of a lone PUT's instructions (memcpy 6%,
//! callgrind, bench/RESULTS.md). Here: one boxed future per request, and the order is read
//! top to bottom in [`Gate::call`].
//!
//! One gate serves every route; what it asks of a request is the route's
//! [`Access`](super::routes::Access) (`routes::ALL`): the probes and the API's description are
//! never shed and need no credential, the console's assets need none, `/metrics` needs one only
//! when protected. Every route gets the edge and the timeout.

use std::{
    convert::Infallible,
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    extract::Request,
    response::{IntoResponse, Response},
};
use futures_util::FutureExt as _;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::{
    auth,
    edge::Edge,
    extract::Admitted,
    problem::ApiError,
    routes::{self, Credential},
};
use crate::auth::Live;

/// What the gate enforces, shared by every route.
struct Rules {
    edge: Edge,
    /// `server.max_in_flight` slots, one semaphore for every route that is shed.
    in_flight: Arc<Semaphore>,
    timeout: Duration,
    /// `None`: auth is off.
    auth: Option<Arc<Live>>,
}

#[derive(Clone)]
pub struct GateLayer(Arc<Rules>);

impl GateLayer {
    pub fn new(
        edge: Edge,
        max_in_flight: usize,
        timeout: Duration,
        auth: Option<Arc<Live>>,
    ) -> Self {
        GateLayer(Arc::new(Rules {
            edge,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            timeout,
            auth,
        }))
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            inner,
            rules: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    rules: Arc<Rules>,
}

impl<S> Service<Request> for Gate<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // The clone that was made ready serves this request; the fresh one waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let rules = self.rules.clone();
        // Everything runs inside the future, so inside `observe`'s span (auth records the actor
        // on it), and a panic anywhere in it becomes a 500 here. A `map`, not an `async` block:
        // a block would hold the request it passes on beside the future it awaits.
        Box::pin(
            AssertUnwindSafe(pass(rules, inner, req))
                .catch_unwind()
                .map(|guarded| {
                    Ok(guarded.unwrap_or_else(|_| {
                        ApiError::Internal("handler panicked".into()).into_response()
                    }))
                }),
        )
    }
}

/// The request through every check, in order, then the handler.
async fn pass<S>(rules: Arc<Rules>, mut inner: S, req: Request) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    let access = routes::access(routes::template(req.extensions()));
    // 1. The edge: Host, Content-Type, the body read in full (its bytes held until the handler
    //    is done with them).
    let (mut req, _body_bytes) = match rules.edge.admit(req).await {
        Ok((mut req, body, permit)) => {
            req.extensions_mut().insert(Admitted(body));
            (req, permit)
        }
        Err(err) => return err.into_response(),
    };
    // 2. An in-flight slot, taken only once the body is read: a client trickling a body holds
    //    a connection, never a slot. None free: 503 at once (shed), not a queue.
    let _slot = if access.shed() {
        match rules.in_flight.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => {
                metrics::counter!("fencegate_shed_requests_total").increment(1);
                return ApiError::Overloaded.into_response();
            }
        }
    } else {
        None
    };
    // 3. The timeout, over authentication and the handler.
    let handled = async {
        // 4. A credential, if the route asks for one.
        let actor = match &rules.auth {
            None => None,
            Some(live) => {
                let auth = live.current();
                match access.credential(auth.protect_metrics) {
                    Credential::None => None,
                    need => match auth::authenticate(&auth, need, &mut req) {
                        Ok(actor) => Some(actor),
                        Err(refused) => return refused,
                    },
                }
            }
        };
        let Ok(mut response) = inner.call(req).await;
        if let Some(actor) = actor {
            // For `observe`'s log line of a failed request.
            response.extensions_mut().insert(actor);
        }
        response
    };
    match tokio::time::timeout(rules.timeout, handled).await {
        Ok(response) => response,
        Err(_elapsed) => ApiError::Timeout.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::{body::Body, http::StatusCode};
    use tower::{service_fn, ServiceExt as _};

    use super::*;

    fn edge() -> Edge {
        Edge {
            body_limit: 1024,
            body_timeout: Duration::from_secs(5),
            min_body_rate: 0,
            max_number_digits: 100,
            buffered: Arc::new(Semaphore::new(1 << 20)),
            loopback_hosts_only: false,
        }
    }

    fn get() -> Request {
        Request::builder()
            .uri("/v1/kv/k")
            .body(Body::empty())
            .unwrap()
    }

    async fn problem_type(response: Response) -> (StatusCode, String) {
        let status = response.status();
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (
            status,
            problem["type"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_owned(),
        )
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_500_problem_and_the_gate_serves_the_next_request() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let handler = service_fn(move |_req: Request| {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n == 0 {
                    panic!("a handler bug");
                }
                Ok::<_, Infallible>(StatusCode::NO_CONTENT.into_response())
            }
        });
        let gate = GateLayer::new(edge(), 8, Duration::from_secs(5), None).layer(handler);
        let (status, kind) = problem_type(gate.clone().oneshot(get()).await.unwrap()).await;
        assert_eq!(
            (status, kind.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
        assert_eq!(
            gate.oneshot(get()).await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
    }

    /// A guarded route is shed beyond the slots (503 at once, no queue); a probe never is. A
    /// slot comes back when its request is answered.
    #[tokio::test]
    async fn guarded_routes_are_shed_beyond_the_slots_and_probes_never_are() {
        let (release, released) = tokio::sync::watch::channel(false);
        let handler = service_fn(move |_req: Request| {
            let mut released = released.clone();
            async move {
                released.wait_for(|r| *r).await.unwrap();
                Ok::<_, Infallible>(StatusCode::NO_CONTENT.into_response())
            }
        });
        let router = axum::Router::new()
            .route_service(routes::HEALTHZ, handler.clone())
            .route_service(routes::KV, handler)
            .layer(GateLayer::new(edge(), 1, Duration::from_secs(5), None));
        let at = |path: &str| Request::builder().uri(path).body(Body::empty()).unwrap();
        for (path, sheds) in [("/v1/kv/k", true), ("/healthz", false)] {
            release.send_replace(false);
            let held = tokio::spawn(router.clone().oneshot(at(path)));
            tokio::time::sleep(Duration::from_millis(50)).await;
            let second = tokio::spawn(router.clone().oneshot(at(path)));
            tokio::time::sleep(Duration::from_millis(50)).await;
            if sheds {
                assert!(second.is_finished(), "shed at once, not queued");
            }
            release.send_replace(true);
            assert_eq!(
                held.await.unwrap().unwrap().status(),
                StatusCode::NO_CONTENT
            );
            let second = second.await.unwrap().unwrap();
            if sheds {
                let (status, kind) = problem_type(second).await;
                assert_eq!(
                    (status, kind.as_str()),
                    (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
                );
            } else {
                assert_eq!(second.status(), StatusCode::NO_CONTENT);
            }
            release.send_replace(false);
            let after = tokio::spawn(router.clone().oneshot(at(path)));
            tokio::time::sleep(Duration::from_millis(50)).await;
            release.send_replace(true);
            assert_eq!(
                after.await.unwrap().unwrap().status(),
                StatusCode::NO_CONTENT,
                "the slot came back"
            );
        }
    }

    #[tokio::test]
    async fn a_handler_past_the_timeout_is_a_503_and_its_slot_comes_back() {
        let handler = service_fn(|req: Request| async move {
            if req.uri().path() == "/slow" {
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(StatusCode::NO_CONTENT.into_response())
        });
        let gate = GateLayer::new(edge(), 1, Duration::from_millis(100), None).layer(handler);
        let slow = Request::builder().uri("/slow").body(Body::empty()).unwrap();
        let (status, kind) = problem_type(gate.clone().oneshot(slow).await.unwrap()).await;
        assert_eq!(
            (status, kind.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        );
        assert_eq!(
            gate.oneshot(get()).await.unwrap().status(),
            StatusCode::NO_CONTENT
        );
    }
}

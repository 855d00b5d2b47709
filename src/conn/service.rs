//! The application (`http::App`) as hyper calls it for one connection: each request's phase, and the end of a
//! streamed response, reported to the watchdog.

use std::{
    future::Future,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll},
};

use axum::{body::Body, extract::Request, response::Response};
use futures_util::FutureExt as _;

use crate::http::App;
use hyper::body::Incoming;

use super::{
    state::{State, Watch, BODY, HANDLING},
    unread::{Charged, Unread},
};

/// What a refused HTTP/2 stream gets: hyper resets it with the reason found in the error,
/// `REFUSED_STREAM` (nothing was done; the client may send it again).
type Refused = Box<dyn std::error::Error + Send + Sync>;

fn refused() -> Refused {
    metrics::counter!("fencegate_http2_refused_streams_total").increment(1);
    Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM))
}

/// A streaming response's body: the connection goes back to idle when it ends (or is dropped,
/// e.g. the client went away).
struct Streaming {
    body: Body,
    _request: InFlight,
}

impl axum::body::HttpBody for Streaming {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A request being handled: counted from hyper calling the router until its response is ready
/// (or, a stream, has ended), or until its future is dropped (the client went away, or reset
/// the HTTP/2 stream).
struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.handled();
    }
}

/// The router for one connection: marks the phase of each request, gives it the connection's
/// verified client certificate, and charges HTTP/2 responses to the unread budget (`unread`).
#[derive(Clone)]
pub(super) struct Serve {
    pub(super) app: App,
    pub(super) state: Arc<State>,
    pub(super) cert: Option<Arc<crate::auth::ClientCert>>,
    pub(super) unread: Arc<Unread>,
}

impl hyper::service::Service<Request<Incoming>> for Serve {
    type Response = Response;
    type Error = Refused;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Refused>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        use axum::body::HttpBody;
        let multiplexed = req.version() == hyper::Version::HTTP_2;
        if multiplexed && self.unread.full(&self.state) {
            // The client holds as many unread response bytes as it may (or all clients do).
            return Box::pin(std::future::ready(Err(refused())));
        }
        // A read can be refused after it was handled: it changed nothing.
        let safe = matches!(*req.method(), hyper::Method::GET | hyper::Method::HEAD);
        let (state, unread) = (self.state.clone(), self.unread.clone());
        self.state.active.fetch_add(1, Ordering::AcqRel);
        let request = InFlight(self.state.clone());
        if multiplexed {
            // Streams overlap: the connection is handling while any is (the edge's body
            // timeout and rate bound each stream's body).
            self.state.multiplexed.store(true, Ordering::Relaxed);
            self.state.phase.store(HANDLING, Ordering::Release);
        } else {
            let phase = if req.body().is_end_stream() {
                HANDLING
            } else {
                BODY
            };
            self.state.phase.store(phase, Ordering::Release);
        }
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(Watch(self.state.clone()));
        if let Some(cert) = &self.cert {
            req.extensions_mut().insert(cert.clone());
        }
        // What follows the response is a `map`: an `async` block awaiting `served` would hold
        // it twice (as captured, and as awaited), and the box is copied at its full size.
        let served = self.app.serve(req);
        Box::pin(served.map(move |mut response| {
            if multiplexed {
                // `Connection: close` (after a 401, or a body left unread) means nothing in
                // HTTP/2, where a refused stream leaves the others and the connection whole.
                response
                    .headers_mut()
                    .remove(axum::http::header::CONNECTION);
            }
            if let Some(size) = response.body().size_hint().exact() {
                // The whole body is at hand (every response but a stream): it is written next,
                // under the write timeout, and the request is done.
                drop(request);
                if !multiplexed || size == 0 {
                    return Ok(response);
                }
                let Some(charge) = unread.charge(&state, size as usize, !safe) else {
                    return Err(refused());
                };
                return Ok(response.map(|body| Body::new(Charged::new(body, charge))));
            }
            // A stream (the console's events): the request is handled until its body ends, so
            // that shutdown lets it finish rather than cutting it as an idle connection.
            Ok(response.map(|body| {
                Body::new(Streaming {
                    body,
                    _request: request,
                })
            }))
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        future::Future,
        pin::Pin,
        sync::{
            atomic::{AtomicBool, AtomicUsize, Ordering},
            Arc,
        },
        task::{Context, Poll},
    };

    use http_body_util::BodyExt as _;
    use hyper::{body::Incoming, Request, Response};
    use tokio::io::AsyncWriteExt as _;

    /// Counts the polls of a request's future made after its body was read.
    struct Counted<F> {
        inner: Pin<Box<F>>,
        body_read: Arc<AtomicBool>,
        polls: Arc<AtomicUsize>,
    }

    impl<F: Future> Future for Counted<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            if self.body_read.load(Ordering::SeqCst) {
                self.polls.fetch_add(1, Ordering::SeqCst);
            }
            self.inner.as_mut().poll(cx)
        }
    }

    /// hyper (vendor/hyper/FENCEGATE.md) does not wake the connection's task when a request
    /// takes a body that arrived in one piece: once the body is read and the request waits
    /// (here for `release`, as a write waits for the database), nothing polls it again until
    /// what it waits for is ready. Upstream's wake-up polled every request with a body once
    /// more, every layer of its future included.
    #[tokio::test]
    async fn a_request_that_read_its_body_is_not_polled_again_for_nothing() {
        let (mut client, server) = tokio::io::duplex(4096);
        let body_read = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let released = Arc::new(tokio::sync::Mutex::new(Some(released)));
        let service = {
            let (body_read, polls) = (body_read.clone(), polls.clone());
            hyper::service::service_fn(move |req: Request<Incoming>| {
                let (flag, released) = (body_read.clone(), released.clone());
                Counted {
                    inner: Box::pin(async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        flag.store(true, Ordering::SeqCst);
                        if let Some(released) = released.lock().await.take() {
                            let _ = released.await;
                        }
                        Ok::<_, hyper::Error>(Response::new(http_body_util::Full::new(body)))
                    }),
                    body_read: body_read.clone(),
                    polls: polls.clone(),
                }
            })
        };
        let conn = tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(server), service),
        );
        client
            .write_all(b"PUT /v1/kv/k HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
            .await
            .unwrap();
        for _ in 0..50 {
            if body_read.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            body_read.load(Ordering::SeqCst),
            "the request read its body"
        );
        // Time for any wake-up to be acted on.
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(
            polls.load(Ordering::SeqCst),
            0,
            "the request was polled again after reading its body, with nothing to wake it"
        );
        release.send(()).unwrap();
        let mut answer = vec![0u8; 256];
        let n = tokio::io::AsyncReadExt::read(&mut client, &mut answer)
            .await
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("hello"), "{answer}");
        assert_eq!(polls.load(Ordering::SeqCst), 1, "one poll, when released");
        drop(client);
        let _ = conn.await;
    }

    /// The vendored hyper looks for connection-specific response headers in one walk of the
    /// response's headers before removing them by name (vendor/hyper/FENCEGATE.md). Each such
    /// field, sent alone in a response (and a header a `Connection` field names, sent with it),
    /// must still be gone from what an HTTP/2 client receives, and every other header must
    /// arrive as it was. h2 refuses to send most of them (the stream would be reset), but lets
    /// `te: trailers` through, so a walk that missed `te` would show here as that field.
    #[tokio::test]
    async fn http2_responses_lose_their_connection_specific_headers_and_keep_the_rest() {
        use hyper::header::{HeaderName, HeaderValue};
        async fn fetch(fields: &'static [(&'static str, &'static str)]) -> hyper::HeaderMap {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let service = hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                let mut response = Response::new(http_body_util::Full::new(
                    hyper::body::Bytes::from_static(b"ok"),
                ));
                let headers = response.headers_mut();
                headers.insert("x-kept", HeaderValue::from_static("yes"));
                headers.insert("content-type", HeaderValue::from_static("text/plain"));
                for (name, value) in fields {
                    headers.insert(
                        HeaderName::from_static(name),
                        HeaderValue::from_static(value),
                    );
                }
                Ok::<_, hyper::Error>(response)
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(server), service),
            );
            let (mut h2, connection) = h2::client::handshake(client).await.unwrap();
            tokio::spawn(connection);
            let request = Request::get("http://localhost/").body(()).unwrap();
            let (response, _) = h2.send_request(request, true).unwrap();
            let response = response
                .await
                .unwrap_or_else(|e| panic!("the response with {fields:?} was not sent: {e}"));
            assert_eq!(response.status(), 200);
            response.headers().clone()
        }
        let cases: [&[(&str, &str)]; 8] = [
            &[],
            &[("keep-alive", "1")],
            &[("proxy-connection", "1")],
            &[("transfer-encoding", "chunked")],
            &[("upgrade", "websocket")],
            &[("te", "trailers")],
            &[("connection", "close")],
            &[
                ("connection", "x-named-by-connection"),
                ("x-named-by-connection", "1"),
            ],
        ];
        for fields in cases {
            let headers = fetch(fields).await;
            assert_eq!(headers.get("x-kept").unwrap(), "yes", "{headers:?}");
            assert_eq!(headers.get("content-type").unwrap(), "text/plain");
            for (name, _) in fields {
                assert!(
                    !headers.contains_key(*name),
                    "{name} reached the client: {headers:?}"
                );
            }
        }
    }
}

//! Pages and assets built into the binary (the console's, `/docs`), served with the headers
//! every one of them needs.

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
};

/// A page or asset built into the binary (the console's, `/docs`), with the headers every one
/// of them needs: its policy, no sniffing, no referrer, no framing, and revalidation.
pub fn page(body: &'static str, content_type: &'static str, csp: HeaderValue) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CONTENT_SECURITY_POLICY, csp),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            // Embedded in the binary: a new binary may serve a new page at the same URL.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

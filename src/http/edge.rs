//! The edge: what a request must be before any handler, limit or database sees it
//! (docs/security.md; docs/wire.md).
//!
//! In order:
//! 1. **Host**: never twice (400). When auth is off on a loopback listener, only a loopback address or
//!    `localhost` — a page on `http://evil.example` whose name was rebound to 127.0.0.1 sends
//!    `Host: evil.example`, and must not reach an unauthenticated fencegate (DNS rebinding).
//! 2. **Content-Type**: a request with a body must say `application/json` (or `…+json`), so a
//!    browser page cannot post to fencegate with a form or a "simple" `text/plain` request,
//!    which browsers send cross-site without a preflight. No body, no Content-Type needed.
//! 3. **Transfer-Encoding** other than plain `chunked` (`gzip, chunked`): 501 — hyper removes
//!    the chunking but decodes nothing else, so the body would be stored as it came.
//! 4. **Content-Length** over `server.body_limit_bytes`: 413 at once, without waiting for a
//!    body that may never come.
//! 5. **The body, read in full here**, within `server.body_timeout_ms`, and after its first
//!    second at `server.min_body_rate_bytes_per_s` on average (else 408). Its bytes are charged
//!    against `server.max_buffered_bytes` **as they arrive** (else 503), never as declared: a
//!    socket that declares 1 MiB and sends nothing holds nothing. The first
//!    [`FREE_BODY_BYTES`] of every body are not charged, so a small body (a lease renewal, a
//!    small value) never waits on or is refused by the budget large bodies hold; what they take
//!    is bounded by the connection cap instead. Only then does the request go on to
//!    `max_in_flight`: a client trickling a body holds a connection (bounded by the rate and the
//!    timeout), never one of the slots well-behaved requests need.
//! 6. **Numbers** in the body whose decimal expansion exceeds `kv.max_number_digits`: 400
//!    `invalid-json` on every backend, before any database work. A 9-byte `1e131071` is
//!    131,072 digits on every read from PostgreSQL; it never gets that far, and never joins a
//!    coalesced statement whose neighbours would then be retried one by one.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes, HttpBody},
    extract::Request,
    http::{header, HeaderMap, HeaderValue},
};
use http_body_util::BodyExt;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use super::problem::ApiError;

/// The first bytes of every body, which `max_buffered_bytes` does not count. 16 KiB holds any
/// renewal, release, lock request and most values; at most this much per connection, so what
/// all of them hold is bounded by `max_connections` (160 MiB at the default 10,000, less than
/// hyper's own read buffers may hold for the same connections).
pub const FREE_BODY_BYTES: usize = 16 * 1024;

/// How long a body may take before `min_body_rate_bytes_per_s` applies: a client's first write,
/// and TCP's slow start, need not keep up with an average from the first millisecond.
const RATE_GRACE: Duration = Duration::from_secs(1);

/// What the edge checks, built once from the settings.
#[derive(Clone)]
pub struct Edge {
    pub body_limit: usize,
    pub body_timeout: Duration,
    /// After [`RATE_GRACE`], a body must have arrived at this many bytes a second on average
    /// since its headers; 0: no minimum.
    pub min_body_rate: u64,
    pub max_number_digits: usize,
    /// One permit per body byte held in memory beyond each body's first [`FREE_BODY_BYTES`],
    /// across all requests.
    pub buffered: Arc<Semaphore>,
    /// Serve only requests whose `Host` names a loopback address or `localhost`.
    pub loopback_hosts_only: bool,
}

impl Edge {
    /// The request as the handler will see it, its body read in full and returned beside it
    /// (the gate hands it on as `extract::Admitted`; the request's own body is then empty),
    /// with the permit of the body's bytes; or why it is refused.
    pub(super) async fn admit(
        &self,
        mut req: Request,
    ) -> Result<(Request, Bytes, Option<OwnedSemaphorePermit>), ApiError> {
        let heads = Heads::of(req.headers());
        // RFC 9112 3.2: a request with more than one Host is 400. Were only the first checked,
        // `Host: localhost` then `Host: evil.example` would pass the rebinding check below.
        if heads.hosts > 1 {
            return Err(ApiError::InvalidRequest(
                "a request must carry exactly one Host header".into(),
            ));
        }
        if self.loopback_hosts_only {
            check_host(req.uri(), heads.host)?;
        }
        if heads.transfer_coded {
            check_transfer_coding(req.headers())?;
        }
        if req.body().is_end_stream() {
            body_read(req.extensions_mut());
            return Ok((req, Bytes::new(), None));
        }
        check_content_type(heads.content_type)?;
        let declared = declared_length(heads.content_length)?;
        if declared.is_some_and(|len| len > self.body_limit as u64) {
            return Err(ApiError::PayloadTooLarge {
                limit: self.body_limit,
            });
        }
        // A declared body that cannot fit in what is free now is refused before any of it is
        // read (a clean 503, not a cut upload). Nothing is reserved: only arrived bytes count.
        if declared.is_some_and(|len| {
            (len as usize).saturating_sub(FREE_BODY_BYTES) > self.buffered.available_permits()
        }) {
            return Err(ApiError::BufferFull);
        }
        let (mut parts, body) = req.into_parts();
        let started = Instant::now();
        let read = read_body(self, body, started);
        let outcome = by(started + self.body_timeout, read).await;
        body_read(&mut parts.extensions);
        let (bytes, permit) = outcome.ok_or_else(|| ApiError::BodyTimeout(self.body_timeout))??;
        if !bytes.is_empty() {
            check_numbers(&bytes, self.max_number_digits, self.body_limit)
                .map_err(ApiError::InvalidJson)?;
        }
        // The length of the body as read (a chunked one declared none; a declared one is what
        // was read, or hyper would have failed the body). The request itself goes on with an
        // empty body: handlers take the bytes from `extract::Admitted` (the gate puts them
        // there), never through axum's body extractors.
        if declared != Some(bytes.len() as u64) {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        }
        Ok((Request::from_parts(parts, Body::empty()), bytes, permit))
    }
}

/// The headers the edge judges, found in one pass over the request's headers: a lookup by
/// name hashes the name again, and five of them cost a lone PUT about 500 instructions
/// (callgrind). Each field holds the first value of its name, as `HeaderMap::get` would.
#[derive(Default)]
struct Heads<'a> {
    /// How many `Host` values there are (more than one is refused).
    hosts: usize,
    host: Option<&'a HeaderValue>,
    content_type: Option<&'a HeaderValue>,
    content_length: Option<&'a HeaderValue>,
    /// Any `Transfer-Encoding` at all: rare, so its values are judged by their own lookup.
    transfer_coded: bool,
}

impl<'a> Heads<'a> {
    fn of(headers: &'a HeaderMap) -> Self {
        let mut heads = Heads::default();
        for (name, value) in headers {
            if name == header::HOST {
                heads.hosts += 1;
                heads.host.get_or_insert(value);
            } else if name == header::CONTENT_TYPE {
                heads.content_type.get_or_insert(value);
            } else if name == header::CONTENT_LENGTH {
                heads.content_length.get_or_insert(value);
            } else if name == header::TRANSFER_ENCODING {
                heads.transfer_coded = true;
            }
        }
        heads
    }
}

/// Tells the connection's watchdog the request has no body left to wait for. The watch is
/// taken out of the request, as nothing after the edge needs it: the request's extensions
/// then hold one entry fewer when the gate adds the body (at most three), and their table is
/// not grown and rehashed on every request.
fn body_read(extensions: &mut axum::http::Extensions) {
    if let Some(watch) = extensions.remove::<crate::conn::Watch>() {
        watch.body_read();
    }
}

/// Reads the whole body, holding a permit per byte beyond the first [`FREE_BODY_BYTES`], taken
/// as the bytes arrive; refuses it when it falls below the minimum rate.
async fn read_body(
    edge: &Edge,
    mut body: Body,
    started: Instant,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), ApiError> {
    let mut permit: Option<OwnedSemaphorePermit> = None;
    let mut charged = 0usize;
    // A body that came in one frame (the usual small one) is kept as it came, without a copy;
    // a second frame starts `buf`.
    let mut first: Option<Bytes> = None;
    let mut buf = Vec::new();
    loop {
        let received = first.as_ref().map_or(buf.len(), Bytes::len);
        let next = match rate_deadline(started, received, edge.min_body_rate) {
            None => body.frame().await,
            Some(at) => by(at, body.frame())
                .await
                .ok_or_else(|| ApiError::BodyTooSlow(edge.min_body_rate))?,
        };
        let Some(frame) = next else { break };
        let frame = frame
            .map_err(|err| ApiError::InvalidJson(format!("the body could not be read: {err}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = received + data.len();
        if len > edge.body_limit {
            return Err(ApiError::PayloadTooLarge {
                limit: edge.body_limit,
            });
        }
        let owed = len.saturating_sub(FREE_BODY_BYTES) - charged;
        if owed > 0 {
            // One frame's worth: at most hyper's read buffer, far below u32::MAX.
            let n = u32::try_from(owed).map_err(|_| ApiError::BufferFull)?;
            let more = edge
                .buffered
                .clone()
                .try_acquire_many_owned(n)
                .map_err(|_| ApiError::BufferFull)?;
            match &mut permit {
                Some(held) => held.merge(more),
                None => permit = Some(more),
            }
            charged += owed;
        }
        if data.is_empty() {
            continue;
        }
        if buf.is_empty() && first.is_none() {
            first = Some(data);
            continue;
        }
        if let Some(first) = first.take() {
            buf.reserve(len);
            buf.extend_from_slice(&first);
        }
        buf.extend_from_slice(&data);
    }
    Ok((first.unwrap_or_else(|| Bytes::from(buf)), permit))
}

/// `work`, or `None` if it has not ended by `deadline`: `tokio::time::timeout_at`, with its
/// timer made only if `work` does not end at its first poll. A body that arrived with its
/// headers (the usual small one) is then read without a timer: making one and dropping it cost
/// a lone PUT about 350 instructions (callgrind). The timer is boxed, as only a body that has
/// to be waited for needs one. As with `timeout_at`, work that is ready is taken even past the
/// deadline, and the timer is polled outside tokio's cooperative budget, so that work which
/// spends the budget cannot hold the deadline off.
fn by<F: std::future::Future>(deadline: Instant, work: F) -> By<F> {
    By {
        work,
        deadline,
        timer: None,
    }
}

pin_project_lite::pin_project! {
    struct By<F> {
        #[pin]
        work: F,
        deadline: Instant,
        timer: Option<Pin<Box<tokio::task::Unconstrained<tokio::time::Sleep>>>>,
    }
}

impl<F: std::future::Future> std::future::Future for By<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(done) = this.work.poll(cx) {
            return Poll::Ready(Some(done));
        }
        let deadline = *this.deadline;
        this.timer
            .get_or_insert_with(|| {
                Box::pin(tokio::task::unconstrained(tokio::time::sleep_until(
                    deadline,
                )))
            })
            .as_mut()
            .poll(cx)
            .map(|()| None)
    }
}

/// When a body that started at `started` and has `received` bytes falls below `rate` bytes a
/// second (after the grace) if no more of it comes; `None`: no minimum rate.
fn rate_deadline(started: Instant, received: usize, rate: u64) -> Option<Instant> {
    (rate > 0)
        .then(|| started + RATE_GRACE + Duration::from_secs_f64(received as f64 / rate as f64))
}

/// Plain `chunked` only (any case, in one header or several). hyper takes the chunking off a
/// body whose last coding is `chunked` and leaves any other (`gzip, chunked`) undecoded.
fn check_transfer_coding(headers: &HeaderMap) -> Result<(), ApiError> {
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let text = String::from_utf8_lossy(value.as_bytes());
        for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return Err(ApiError::UnsupportedTransferCoding(format!(
                    "Transfer-Encoding {coding:?} is not supported: send the body uncompressed, with Content-Length or Transfer-Encoding: chunked; nothing was stored"
                )));
            }
        }
    }
    Ok(())
}

fn declared_length(value: Option<&HeaderValue>) -> Result<Option<u64>, ApiError> {
    match value {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| ApiError::InvalidRequest("Content-Length is not a number".into())),
    }
}

/// `application/json` or `application/<anything>+json`, with any parameters (`; charset=utf-8`).
fn check_content_type(value: Option<&HeaderValue>) -> Result<(), ApiError> {
    let Some(value) = value else {
        return Err(ApiError::UnsupportedMediaType(
            "a request body needs Content-Type: application/json (curl --json sets it)".into(),
        ));
    };
    // Compared without case and without a lowered copy: this runs on every write. Split and
    // trimmed as bytes: `to_str` has let through only visible ASCII and tabs, where str's
    // Unicode-aware split and trim find what these do, at a third of the cost.
    let mime = value
        .to_str()
        .unwrap_or("")
        .as_bytes()
        .split(|b| *b == b';')
        .next()
        .unwrap_or(b"")
        .trim_ascii();
    let json = mime.eq_ignore_ascii_case(b"application/json")
        || mime
            .split_at_checked(b"application/".len())
            .filter(|(kind, _)| kind.eq_ignore_ascii_case(b"application/"))
            .and_then(|(_, sub)| sub.split_at_checked(sub.len().checked_sub(b"+json".len())?))
            .is_some_and(|(name, suffix)| {
                !name.is_empty() && suffix.eq_ignore_ascii_case(b"+json")
            });
    if json {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "request bodies must be Content-Type: application/json, not {:?} (curl --json sets it)",
            String::from_utf8_lossy(value.as_bytes())
        )))
    }
}

/// The `Host` header (or an absolute-form target's authority) must name a loopback address or
/// `localhost`, with any port. A request with neither (HTTP/1.0) cannot come from a browser
/// and is served.
fn check_host(uri: &axum::http::Uri, host: Option<&HeaderValue>) -> Result<(), ApiError> {
    let host = match uri.authority() {
        Some(authority) => Some(authority.host()),
        None => match host {
            None => None,
            Some(value) => Some(host_of(
                value.to_str().map_err(|_| misdirected("<not text>"))?,
            )),
        },
    };
    match host {
        Some(host) if !is_loopback_host(host) => Err(misdirected(host)),
        _ => Ok(()),
    }
}

/// 421 rather than 400: the request is well formed, but names a server this one is not — the
/// status RFC 9110 has for exactly that ("misdirected"), which says to the operator that the
/// Host, not the request, is wrong.
fn misdirected(host: &str) -> ApiError {
    ApiError::Misdirected(format!(
        "this fencegate runs without authentication on a loopback address and serves only Host: localhost or a loopback IP, not {host:?} (DNS rebinding)"
    ))
}

/// `host[:port]` or `[v6][:port]` -> the host (brackets kept for IPv6). `value` passed
/// `to_str` (visible ASCII and tabs), so it is trimmed and split as bytes, which find what
/// str's Unicode-aware trim and split would, for less: this runs on every request.
fn host_of(value: &str) -> &str {
    let value = value.trim_ascii();
    if value.starts_with('[') {
        return value.find(']').map_or(value, |end| &value[..=end]);
    }
    let bytes = value.as_bytes();
    match bytes.iter().rposition(|b| *b == b':') {
        // An ASCII ':' is a char boundary.
        Some(colon) if bytes[colon + 1..].iter().all(u8::is_ascii_digit) => &value[..colon],
        _ => value,
    }
}

fn is_loopback_host(host: &str) -> bool {
    // The usual two first, without parsing an address.
    if host == "127.0.0.1" || host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Refuses a JSON text holding a number whose decimal expansion is longer than `max` digits,
/// or whose numbers all together would read back more than `max_growth` bytes longer than they
/// were sent: PostgreSQL's jsonb spells every number out, so 174,000 copies of the 5-byte
/// `1e999` (each within `max`) are a 1 MiB request that reads back as 174 MB. With
/// `max_growth` = the body limit, no stored value reads back larger than twice what a client
/// may send.
///
/// A lexer, not a parser: it finds numbers outside strings and measures each from its mantissa
/// and exponent without expanding it. Invalid JSON gets whatever answer (the parser refuses it
/// next anyway).
pub fn check_numbers(json: &[u8], max: usize, max_growth: usize) -> Result<(), String> {
    let mut grown: u128 = 0;
    let mut i = 0;
    let mut in_string = false;
    while i < json.len() {
        let b = json[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < json.len()
                    && matches!(json[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                let text = &json[start..i];
                let digits = expansion_digits(text);
                if digits > max as u128 {
                    let shown = String::from_utf8_lossy(&text[..text.len().min(40)]);
                    return Err(format!(
                        "the number {shown}{} would be {digits} digits long; at most {max} are allowed (kv.max_number_digits)",
                        if text.len() > 40 { "…" } else { "" }
                    ));
                }
                grown += digits.saturating_sub(text.len() as u128);
                if grown > max_growth as u128 {
                    return Err(format!(
                        "the numbers in this value would read back more than {max_growth} bytes longer than they were sent \
                         (stored numbers are spelled out in full: 1e999 is 1000 digits); at most server.body_limit_bytes \
                         of growth is allowed: send such numbers as strings"
                    ));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Digits in the decimal expansion of a JSON number, as PostgreSQL's numeric prints it (the
/// scale a mantissa's fraction and a negative exponent give it is kept: `1.50` is 3 digits,
/// `1e-3` is `0.001`, 4). Saturates rather than overflows on absurd exponents.
fn expansion_digits(number: &[u8]) -> u128 {
    let number = number.strip_prefix(b"-").unwrap_or(number);
    let (mantissa, exponent) = match number.iter().position(|b| matches!(b, b'e' | b'E')) {
        Some(at) => (&number[..at], &number[at + 1..]),
        None => (number, &b""[..]),
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(at) => (&mantissa[..at], &mantissa[at + 1..]),
        None => (mantissa, &b""[..]),
    };
    const CAP: i128 = 1_000_000_000_000_000;
    let (negative, exp_digits) = match exponent.first() {
        Some(b'-') => (true, &exponent[1..]),
        Some(b'+') => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    let mut exp: i128 = 0;
    for &d in exp_digits {
        exp = (exp * 10 + i128::from(d.wrapping_sub(b'0') % 10)).min(CAP);
    }
    if negative {
        exp = -exp;
    }
    let (int_len, frac_len) = (int.len() as i128, frac.len() as i128);
    // Digits left of the decimal point, counting from the mantissa's first digit.
    let point = int_len + exp;
    let frac_digits = (frac_len - exp).max(0);
    let first_nonzero = int.iter().chain(frac).position(|&d| d != b'0');
    let int_digits = match first_nonzero {
        None => 1,
        Some(at) => (point - at as i128).max(1),
    };
    (int_digits + frac_digits) as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_is_measured_not_computed() {
        for (text, digits) in [
            ("0", 1),
            ("-0", 1),
            ("7", 1),
            ("100", 3),
            ("1e5", 6),
            ("1E+5", 6),
            ("1.5", 2),
            ("1.50", 3),
            ("0.001", 4),
            ("1e-3", 4),
            ("1.5e-3", 5),
            ("12.5e1", 3),
            ("12.5e-1", 3),
            ("0.0e5", 1),
            ("1e131071", 131_072),
            ("-1e999999", 1_000_000),
            ("123456789012345678901234567890", 30),
        ] {
            assert_eq!(expansion_digits(text.as_bytes()), digits, "{text}");
        }
        assert!(expansion_digits(b"1e99999999999999999999999999999999") >= 1_000_000_000_000_000);
        assert!(expansion_digits(b"1e-99999999999999999999999999999999") >= 1_000_000_000_000_000);
    }

    #[test]
    fn numbers_inside_strings_and_keys_are_not_numbers() {
        assert!(check_numbers(br#"{"1e999999": "1e999999 \" 1e999999"}"#, 10, 0).is_ok());
        assert!(check_numbers(br#"{"a": [1, 2.5, -3e2, {"b": 1e10}]}"#, 11, 100).is_ok());
        assert!(check_numbers(br#"{"a": [1, 2.5, -3e2, {"b": 1e11}]}"#, 11, 100).is_err());
        assert!(check_numbers(br#"["\\", 1e999999]"#, 1000, usize::MAX).is_err());
        assert!(check_numbers(b"1e999", 1000, 995).is_ok());
        assert!(check_numbers(b"1e1000", 1000, usize::MAX).is_err());
    }

    #[test]
    fn numbers_may_not_grow_past_the_budget_all_together() {
        // Each within the digit limit; together they grow by 995 bytes each.
        let many = format!("[{}]", vec!["1e999"; 100].join(","));
        assert!(check_numbers(many.as_bytes(), 1000, 995 * 100).is_ok());
        assert!(check_numbers(many.as_bytes(), 1000, 995 * 100 - 1).is_err());
        // Numbers that read back as sent (or shorter) cost nothing.
        let plain = format!("[{}]", vec!["123456789"; 1000].join(","));
        assert!(check_numbers(plain.as_bytes(), 1000, 0).is_ok());
    }

    #[test]
    fn only_plain_chunked_is_a_transfer_coding() {
        let coded = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(header::TRANSFER_ENCODING, HeaderValue::from_str(v).unwrap());
            }
            check_transfer_coding(&headers).is_ok()
        };
        assert!(coded(&[]) && coded(&["chunked"]) && coded(&["Chunked"]) && coded(&[" chunked "]));
        assert!(
            !coded(&["gzip, chunked"])
                && !coded(&["gzip", "chunked"])
                && !coded(&["identity,chunked"])
        );
    }

    #[test]
    fn json_media_types_in_any_case_with_parameters() {
        let judged = |v: &str| check_content_type(Some(&HeaderValue::from_str(v).unwrap())).is_ok();
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ;x=y",
            "application/merge-patch+json",
            "APPLICATION/VND.EXAMPLE+JSON",
            "\tapplication/json\t;charset=utf-8",
            "application/json;",
        ] {
            assert!(judged(ok), "{ok}");
        }
        for bad in [
            "",
            "text/json",
            "application/jsonx",
            "application/+json",
            "application/json+xml",
            "applicatio/json",
            "text/plain; x=application/json",
            "application/é+json",
        ] {
            assert!(!judged(bad), "{bad}");
        }
        assert!(check_content_type(None).is_err());
    }

    #[test]
    fn one_pass_finds_what_lookups_would() {
        let mut headers = HeaderMap::new();
        headers.append(header::HOST, HeaderValue::from_static("localhost"));
        headers.append(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.append(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.append(header::HOST, HeaderValue::from_static("evil.example"));
        headers.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let heads = Heads::of(&headers);
        assert_eq!(heads.hosts, 2);
        assert_eq!(heads.host, headers.get(header::HOST));
        assert_eq!(heads.content_type, headers.get(header::CONTENT_TYPE));
        assert_eq!(heads.content_length, headers.get(header::CONTENT_LENGTH));
        assert!(!heads.transfer_coded);
        headers.append(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(Heads::of(&headers).transfer_coded);
        assert_eq!(Heads::of(&HeaderMap::new()).hosts, 0);
    }

    #[test]
    fn the_minimum_rate_starts_after_the_grace_and_moves_with_each_byte() {
        let started = Instant::now();
        assert_eq!(rate_deadline(started, 0, 0), None);
        assert_eq!(rate_deadline(started, 0, 1000), Some(started + RATE_GRACE));
        assert_eq!(
            rate_deadline(started, 500, 1000),
            Some(started + RATE_GRACE + Duration::from_millis(500))
        );
    }

    #[test]
    fn hosts() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:80",
            "127.9.9.9:1",
            "[::1]",
            "[::1]:8080",
            " 127.0.0.1:80\t",
            "127.0.0.1:",
        ] {
            assert!(is_loopback_host(host_of(ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "[::2]:1",
            "0.0.0.0",
            "",
            "127.0.0.1:8o",
            "127.0.0.1.evil.example",
            "127.0.0.1:80:80",
        ] {
            assert!(!is_loopback_host(host_of(bad)), "{bad}");
        }
    }
}

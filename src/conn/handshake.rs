//! Before TLS: a connection on the TLS port that does not start a handshake.

use tokio::net::TcpStream;

/// Why a connection was closed before it was served (the metric's reason).
pub(super) struct Closed(pub(super) &'static str);

/// Whether the connection starts with a TLS record (a handshake: byte 0x16) rather than, say,
/// a plain HTTP request. Waits for its first byte.
pub(super) async fn tls_record_first(stream: &TcpStream) -> Result<bool, Closed> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => Err(Closed("closed before the TLS handshake")),
        Ok(_) => Ok(!first[0].is_ascii_uppercase()),
    }
}

/// A plain HTTP request on the TLS port: answered in plain HTTP, saying what to do, then closed.
pub(super) async fn refuse_plain_http(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt as _;
    const BODY: &str = "this port serves HTTPS: use an https:// URL\n";
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

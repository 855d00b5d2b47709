//! `fencegate kv get|put|delete`, `fencegate fence get|claim` and `fencegate lock-info`: one
//! request each. The
//! response body goes to stdout whatever the status (scripts branch on the exit status); a
//! non-2xx also gets one line on stderr.

use std::{io::Read, time::Duration};

use reqwest::{header::CONTENT_TYPE, Method};

use super::{
    http::{exit, segment, Answer, Api, SCOPE, TOKEN},
    Endpoint, FenceCommand, Fencing, KvCommand, LockInfo,
};

pub async fn kv(command: KvCommand) -> u8 {
    match command {
        KvCommand::Get { key, endpoint } => {
            let Some(api) = api(&endpoint) else {
                return exit::USAGE;
            };
            let rb = api.request(Method::GET, &format!("/v1/kv/{}", segment(&key)));
            report(api.send(rb).await)
        }
        KvCommand::Put {
            key,
            json,
            fencing,
            endpoint,
        } => {
            let Some(api) = api(&endpoint) else {
                return exit::USAGE;
            };
            let body = match json {
                Some(json) => json,
                None => {
                    let mut text = String::new();
                    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
                        eprintln!("fencegate: cannot read the value from stdin: {e}");
                        return exit::USAGE;
                    }
                    text
                }
            };
            let rb = api.request(Method::PUT, &format!("/v1/kv/{}", segment(&key)));
            // Sent as given: the server checks it (400 invalid-json), and numbers keep every digit.
            let rb = fenced(rb, &fencing)
                .header(CONTENT_TYPE, "application/json")
                .body(body);
            report(api.send(rb).await)
        }
        KvCommand::Delete {
            key,
            fencing,
            endpoint,
        } => {
            let Some(api) = api(&endpoint) else {
                return exit::USAGE;
            };
            let rb = api.request(Method::DELETE, &format!("/v1/kv/{}", segment(&key)));
            report(api.send(fenced(rb, &fencing)).await)
        }
    }
}

pub async fn fence(command: FenceCommand) -> u8 {
    match command {
        FenceCommand::Get { scope, endpoint } => {
            let Some(api) = api(&endpoint) else {
                return exit::USAGE;
            };
            let rb = api.request(Method::GET, &format!("/v1/fences/{}", segment(&scope)));
            report(api.send(rb).await)
        }
        FenceCommand::Claim {
            scope,
            token,
            endpoint,
        } => {
            let Some(api) = api(&endpoint) else {
                return exit::USAGE;
            };
            let rb = api
                .request(Method::POST, &format!("/v1/fences/{}", segment(&scope)))
                .header(TOKEN, token);
            report(api.send(rb).await)
        }
    }
}

/// `GET /v1/locks/NAME`: who holds it and for how long (exit 3: nobody).
pub async fn lock_info(args: LockInfo) -> u8 {
    let Some(api) = api(&args.endpoint) else {
        return exit::USAGE;
    };
    let rb = api.request(Method::GET, &format!("/v1/locks/{}", segment(&args.name)));
    report(api.send(rb).await)
}

fn api(endpoint: &Endpoint) -> Option<Api> {
    Api::new(
        &endpoint.url,
        Duration::from_millis(endpoint.timeout_ms.max(1)),
        &endpoint.tls,
    )
    .map_err(|e| eprintln!("fencegate: {e}"))
    .ok()
}

/// The token, and the scope unless it is empty (an empty FENCEGATE_SCOPE means none).
fn fenced(rb: reqwest::RequestBuilder, fencing: &Fencing) -> reqwest::RequestBuilder {
    let rb = rb.header(TOKEN, fencing.token.trim());
    match fencing.scope.as_deref().filter(|s| !s.is_empty()) {
        Some(scope) => rb.header(SCOPE, segment(scope)),
        None => rb,
    }
}

/// Body to stdout, a summary of a failure to stderr; the exit status of the answer.
fn report(answer: Answer) -> u8 {
    if let Answer::Status { body, .. } = &answer {
        if body.ends_with('\n') {
            print!("{body}");
        } else {
            println!("{body}");
        }
    }
    let code = answer.exit_code();
    if code != exit::OK {
        eprintln!("fencegate: {}", answer.summary());
    }
    code
}

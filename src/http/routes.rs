//! Every route template, who may call it, and the fenced writes it serves: the one table the
//! gate (shedding and authentication), the OpenAPI document (security and the 401/403
//! responses) and `observe` (the `route` and `op` labels) read. A route is open or guarded here
//! and nowhere else.

use super::report::Op;

pub const KV: &str = "/v1/kv/{key}";
pub const TABLES: &str = "/v1/tables/{resource}/{key}";
pub const BATCH: &str = "/v1/batch";
pub const FENCES: &str = "/v1/fences/{scope}";
pub const LOCKS: &str = "/v1/locks/{name}";
pub const LOCK_RENEW: &str = "/v1/locks/{name}/renew";
pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
pub const ADMIN_FENCE_RESET: &str = "/v1/admin/fences/{scope}/reset";
pub const ADMIN_KV_RESET: &str = "/v1/admin/kv/{key}/reset";
pub const ADMIN_TABLE_RESET: &str = "/v1/admin/tables/{resource}/{key}/reset";
pub const ADMIN_AUDIT: &str = "/v1/admin/audit";
pub const ADMIN_LOCK_RETIRE: &str = "/v1/admin/locks/{name}/retire";
pub const ADMIN_KV_REBIND: &str = "/v1/admin/kv/rebind";
pub const ADMIN_REFUSALS: &str = "/v1/admin/refusals";
pub const ADMIN_TABLE_REBIND: &str = "/v1/admin/tables/{resource}/rebind";
pub const OPENAPI: &str = "/openapi.json";
pub const DOCS: &str = "/docs";
pub const ADMIN_OVERVIEW: &str = "/v1/admin/overview";
pub const ADMIN_EVENTS: &str = "/v1/admin/events";
pub const UI: &str = "/ui";
pub const UI_SCRIPT: &str = "/ui/console.js";
pub const UI_STYLE: &str = "/ui/console.css";

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential, and never shed: the probes and this API's description. A load balancer
    /// that sees /healthz 503 under load restarts a healthy process.
    Probe,
    /// No credential, but shed under load like the API: the console's page and assets, which
    /// hold no data (the page asks for a credential when the data routes answer 401).
    Open,
    /// Open unless `auth.protect_metrics`, then the admin right.
    Metrics,
    /// A credential; the handler checks its rights.
    Guarded,
}

/// What a gate asks of a request's caller, once auth is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    None,
    /// Any valid credential; the handler checks the rights it needs.
    Any,
    /// A credential with the admin right, checked before the handler.
    Admin,
}

impl Access {
    /// Whether the in-flight limit applies (sheds with 503 when every slot is taken).
    pub fn shed(self) -> bool {
        self != Access::Probe
    }

    /// The credential this route needs when auth is on.
    pub fn credential(self, protect_metrics: bool) -> Credential {
        match self {
            Access::Probe | Access::Open => Credential::None,
            Access::Metrics if protect_metrics => Credential::Admin,
            Access::Metrics => Credential::None,
            Access::Guarded => Credential::Any,
        }
    }
}

/// A route template, who may call it, and which of its methods are fenced writes.
pub struct Route {
    pub path: &'static str,
    pub access: Access,
    /// (method, write): the `op` of `fencegate_writes_total`, for every answer to that method,
    /// the handler's or a refusal before it.
    pub writes: &'static [(&'static str, Op)],
}

impl Route {
    /// The fenced write `method` on this route is, if any.
    pub fn write(&self, method: &str) -> Option<Op> {
        self.writes
            .iter()
            .find(|(m, _)| *m == method)
            .map(|(_, op)| *op)
    }
}

const fn route(path: &'static str, access: Access) -> Route {
    Route {
        path,
        access,
        writes: &[],
    }
}

const fn writes(path: &'static str, writes: &'static [(&'static str, Op)]) -> Route {
    Route {
        path,
        access: Access::Guarded,
        writes,
    }
}

/// Every route the router serves (a unit test holds this to the OpenAPI document).
pub const ALL: &[Route] = &[
    route(HEALTHZ, Access::Probe),
    route(READYZ, Access::Probe),
    route(OPENAPI, Access::Probe),
    route(DOCS, Access::Probe),
    route(UI, Access::Open),
    route(UI_SCRIPT, Access::Open),
    route(UI_STYLE, Access::Open),
    route(METRICS, Access::Metrics),
    writes(KV, &[("PUT", Op::Put), ("DELETE", Op::Delete)]),
    writes(
        TABLES,
        &[
            ("PUT", Op::TablePut),
            ("PATCH", Op::TablePatch),
            ("DELETE", Op::TableDelete),
        ],
    ),
    writes(BATCH, &[("POST", Op::Batch)]),
    writes(FENCES, &[("POST", Op::Claim)]),
    writes(
        LOCKS,
        &[("POST", Op::LockAcquire), ("DELETE", Op::LockRelease)],
    ),
    writes(LOCK_RENEW, &[("POST", Op::LockRenew)]),
    route(ADMIN_FENCE_RESET, Access::Guarded),
    route(ADMIN_KV_RESET, Access::Guarded),
    route(ADMIN_TABLE_RESET, Access::Guarded),
    route(ADMIN_AUDIT, Access::Guarded),
    route(ADMIN_LOCK_RETIRE, Access::Guarded),
    route(ADMIN_KV_REBIND, Access::Guarded),
    route(ADMIN_TABLE_REBIND, Access::Guarded),
    route(ADMIN_REFUSALS, Access::Guarded),
    route(ADMIN_OVERVIEW, Access::Guarded),
    route(ADMIN_EVENTS, Access::Guarded),
];

/// The template of a request that `dispatch` sent to its route without axum's router (which
/// sets `MatchedPath` for the requests it routes).
#[derive(Clone, Copy, Debug)]
pub struct Matched(pub &'static str);

/// The route template a request matched, whichever way it was routed; `None`: no route (the
/// fallback).
pub fn template(extensions: &axum::http::Extensions) -> Option<&str> {
    match extensions.get::<axum::extract::MatchedPath>() {
        Some(matched) => Some(matched.as_str()),
        None => extensions.get::<Matched>().map(|m| m.0),
    }
}

/// The route of a matched template; `None` for a request no route matched (the fallback).
pub fn find(template: &str) -> Option<&'static Route> {
    ALL.iter().find(|r| r.path == template)
}

/// Who may call the route `template` matched; the fallback (`None`: no route matched) is
/// guarded, so an unknown path tells a caller without a credential nothing but 401.
pub fn access(template: Option<&str>) -> Access {
    template
        .and_then(find)
        .map_or(Access::Guarded, |r| r.access)
}

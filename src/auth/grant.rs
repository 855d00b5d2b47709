//! Rights, and what one actor was granted: the answers `http::auth` asks of every request.

use std::{fmt, sync::Arc};

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    Read,
    Write,
    Lock,
    Fence,
    Admin,
}

/// The kind of name a right is checked on (a 403 names it, in the problem's field of that name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Key,
    Scope,
    Lock,
    Resource,
}

impl Named {
    pub fn field(self) -> &'static str {
        match self {
            Named::Key => "key",
            Named::Scope => "scope",
            Named::Lock => "lock",
            Named::Resource => "resource",
        }
    }
}

impl Right {
    pub const ALL: [Right; 5] = [
        Right::Read,
        Right::Write,
        Right::Lock,
        Right::Fence,
        Right::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Lock => "lock",
            Right::Fence => "fence",
            Right::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Right> {
        Right::ALL.into_iter().find(|r| r.as_str() == text)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one actor was granted: rights, on names starting with one of `prefixes`, and on the
/// legacy-table resources in `tables`.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The namespaced actor (`key:NAME`, `jwt:SUB`): recorded in logs, the audit log, and as
    /// the actor a lease belongs to.
    pub actor: String,
    rights: u8,
    prefixes: Vec<String>,
    tables: Vec<String>,
}

impl Grant {
    /// Unknown right names are refused (a typo must not silently grant less, or more).
    pub fn new(
        actor: String,
        rights: &[String],
        prefixes: Vec<String>,
        tables: Vec<String>,
    ) -> Result<Grant, String> {
        let mut bits = 0;
        for right in rights {
            let Some(right) = Right::parse(right) else {
                return Err(format!(
                    "unknown right {right:?}; use read, write, lock, fence or admin"
                ));
            };
            bits |= right.bit();
        }
        Ok(Grant {
            actor,
            rights: bits,
            prefixes,
            tables,
        })
    }

    pub fn is_admin(&self) -> bool {
        self.rights & Right::Admin.bit() != 0
    }

    /// `right` on the (decoded) `name` of a key, scope or lock.
    pub fn allows(&self, right: Right, name: &str) -> bool {
        self.is_admin()
            || (self.rights & right.bit() != 0
                && self.prefixes.iter().any(|p| name.starts_with(p.as_str())))
    }

    /// `right` on the legacy-table `resource`.
    pub fn allows_table(&self, right: Right, resource: &str) -> bool {
        self.is_admin()
            || (self.rights & right.bit() != 0 && self.tables.iter().any(|t| t == resource))
    }
}

/// Who is asking. With auth off there is no actor, and every request has every right.
#[derive(Debug, Clone)]
pub struct Actor(Option<Arc<Grant>>, Option<u64>);

impl Actor {
    /// The actor of a server with no credentials configured: every right, no name.
    pub fn open() -> Actor {
        Actor(None, None)
    }

    /// An actor whose credential never expires (an API key).
    pub fn authenticated(grant: Arc<Grant>) -> Actor {
        Actor(Some(grant), None)
    }

    /// An actor whose credential expires at `exp` (seconds since the epoch: a JWT's `exp`).
    pub fn expiring(grant: Arc<Grant>, exp: u64) -> Actor {
        Actor(Some(grant), Some(exp))
    }

    /// When the credential stops being valid (seconds since the epoch); `None`: never. What a
    /// long-lived response (an event stream) must end at.
    pub fn expires_at(&self) -> Option<u64> {
        self.1
    }

    /// The namespaced actor (`key:NAME`, `jwt:SUB`); `None` with auth off.
    pub fn name(&self) -> Option<&str> {
        self.0.as_ref().map(|g| g.actor.as_str())
    }

    pub fn allows(&self, right: Right, name: &str) -> bool {
        self.0.as_ref().is_none_or(|g| g.allows(right, name))
    }

    pub fn allows_table(&self, right: Right, resource: &str) -> bool {
        self.0
            .as_ref()
            .is_none_or(|g| g.allows_table(right, resource))
    }

    pub fn is_admin(&self) -> bool {
        self.0.as_ref().is_none_or(|g| g.is_admin())
    }

    /// The actor a renew or release must come from to touch a lease: `None` (anyone with the
    /// `lock` right on the name) with auth off, and for an admin.
    pub fn lease_must_match(&self) -> Option<&str> {
        match &self.0 {
            Some(grant) if !grant.is_admin() => Some(grant.actor.as_str()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(rights: &[&str], prefixes: &[&str]) -> Grant {
        let rights: Vec<String> = rights.iter().map(|r| r.to_string()).collect();
        Grant::new(
            "t".into(),
            &rights,
            prefixes.iter().map(|p| p.to_string()).collect(),
            vec!["orders".into()],
        )
        .unwrap()
    }

    #[test]
    fn prefixes_and_rights() {
        let g = grant(&["read"], &["billing/"]);
        assert!(g.allows(Right::Read, "billing/"));
        assert!(g.allows(Right::Read, "billing/x"));
        assert!(!g.allows(Right::Read, "billing"));
        assert!(!g.allows(Right::Write, "billing/x"));
        assert!(g.allows_table(Right::Read, "orders"));
        assert!(!g.allows_table(Right::Write, "orders"));
        assert!(grant(&["write"], &[""]).allows(Right::Write, "anything"));
        assert!(!grant(&["write"], &[]).allows(Right::Write, "anything"));
        let admin = grant(&["admin"], &[]);
        assert!(admin.allows(Right::Fence, "x") && admin.allows_table(Right::Write, "other"));
        assert!(Grant::new("t".into(), &["raed".into()], vec![], vec![]).is_err());
    }
}

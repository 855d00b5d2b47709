//! The SQL spelling of the fence rules, shared by both backends: the accept rule, the scope
//! rule and the poisoning guards, each turned into SQL in exactly one place. Every fenced
//! statement of either dialect is assembled from these (PostgreSQL: `pg/sql.rs` and
//! `pg/tables/sql.rs`; SQLite: `sqlite/sql.rs`); `IS NOT DISTINCT FROM`, scalar subqueries and
//! `$n` parameters mean the same on both.

pub use crate::fence::Checks;
use crate::fence::{JumpCap, Reserved, Rule, ScopeRule};

/// One of something per accept rule: the statements of a backend are built once for each.
pub(crate) struct ByRule<T> {
    pub inclusive: T,
    pub strict: T,
}

impl<T> ByRule<T> {
    pub fn build(mut make: impl FnMut(Rule) -> T) -> Self {
        ByRule {
            inclusive: make(Rule::Inclusive),
            strict: make(Rule::Strict),
        }
    }

    pub fn get(&self, rule: Rule) -> &T {
        match rule {
            Rule::Inclusive => &self.inclusive,
            Rule::Strict => &self.strict,
        }
    }
}

/// THE fence check in SQL: the fence `fence` admits the token `token` under `rule` (both are
/// SQL expressions: columns, parameters). The one place [`Rule::accepts`] is turned into SQL;
/// every statement that raises a fence, of either backend, checks it with this.
pub(crate) fn fence_admits(rule: Rule, fence: &str, token: &str) -> String {
    let op = match rule {
        Rule::Inclusive => "<=",
        Rule::Strict => "<",
    };
    format!("{fence} {op} {token}")
}

/// The SQL spelling of [`ScopeRule::admits`] for a row that exists: `remembered` is the row's
/// scope column, `presented` the write's scope (NULL: unscoped). The one place the scope rule
/// is turned into SQL; every fenced statement that writes a key or a row is built with it,
/// next to [`fence_admits`]. `IS NOT DISTINCT FROM` is NULL-safe equality on PostgreSQL and on
/// SQLite (3.39+), so both backends share the spelling.
pub(crate) fn sql_scope_check(scopes: ScopeRule, remembered: &str, presented: &str) -> String {
    match scopes {
        ScopeRule::Sticky => format!("{remembered} IS NOT DISTINCT FROM {presented}"),
        ScopeRule::Free => "TRUE".to_owned(),
    }
}

/// The SQL spelling of [`crate::fence::issued`]: if the built-in lock named `scope` has a
/// (not retired) grant, `token` is within `1..=` its latest one; if it has none, the scope must
/// not be reserved for the built-in locks (`[locks] names`, [`Reserved`]), whose latest issued
/// token is 0 until the first grant. Every statement that raises a scope's fence for a write or
/// a claim is gated by it (lock grants pass it by construction: the grant updates the lock row
/// first, in the same transaction). Evaluated on the statement's snapshot: a grant committed
/// after it is not seen. On a reserved scope that can only refuse more, and so on SQLite, whose
/// writing statements read under its one write lock. On PostgreSQL, on a scope that is not
/// reserved, a write whose snapshot predates the lock's first grant (or its first grant after
/// a retire) passes, and once the grant commits it may raise the fence past the granted token:
/// the write's token was admissible a moment earlier, when it would have made the grant issue
/// above it. The fence still never goes down, so no token below it is admitted; the holder is
/// refused (412) and the lock's next grant issues above the fence. Reserve the scope (`[locks]
/// names`) to have the built-in lock as its one token source from the start.
pub(crate) fn sql_issued_check(scope: &str, token: &str, reserved: &Reserved) -> String {
    format!(
        "COALESCE((SELECT {token} BETWEEN 1 AND issued.token FROM fencegate_locks AS issued \
                   WHERE issued.name = {scope} AND NOT issued.retired), NOT {reserved})",
        reserved = sql_reserved(reserved, scope)
    )
}

/// The SQL spelling of [`Reserved::covers`]: `scope` starts with one of the prefixes. They are
/// literals from the validated configuration ([`Reserved::new`] refuses anything that could end
/// a string literal); `substr` counts characters on both backends, as `chars().count()` does.
fn sql_reserved(reserved: &Reserved, scope: &str) -> String {
    let mut any = Vec::with_capacity(reserved.prefixes().len());
    for prefix in reserved.prefixes() {
        if prefix.is_empty() {
            return "TRUE".to_owned();
        }
        any.push(format!(
            "substr({scope}, 1, {}) = '{prefix}'",
            prefix.chars().count()
        ));
    }
    if any.is_empty() {
        "FALSE".to_owned()
    } else {
        format!("({})", any.join(" OR "))
    }
}

/// The SQL spelling of [`JumpCap::admits`]: `token` does not exceed the fence `fence` (a column,
/// or a scalar subquery; NULL: no fence, counted as 0) by more than the cap. Both operands are
/// non-negative bigints, so the subtraction cannot overflow. The cap is a number from the
/// validated configuration, never request text. PostgreSQL's statements check a scope's cap
/// twice: in the row they insert (on the statement's snapshot) and in the `DO UPDATE .. WHERE`
/// on the row as locked, since an admin reset may lower a fence after the snapshot was taken;
/// a key's cap on the row as locked, and for a key the write creates in a trigger
/// (`pg/sql.rs`). SQLite's check it once, in the row to insert: there a writing statement reads
/// under the database's one write lock, so its snapshot is the row as locked (`sqlite/sql.rs`).
pub(crate) fn sql_jump_check(jump: JumpCap, fence: &str, token: &str) -> String {
    match jump {
        JumpCap(0) => "TRUE".to_owned(),
        JumpCap(cap) => format!("{token} - COALESCE({fence}, 0) <= {cap}"),
    }
}

/// A scope's fence and the latest token granted by the built-in lock of that name: what
/// explains a refused claim. `$1` the scope; one text for both backends (sqlx binds `$n` on
/// SQLite too). Decoded by [`super::scope_state_from`].
pub(crate) const SCOPE_STATE: &str = "SELECT (SELECT fence_token FROM fencegate_fences WHERE scope = $1),
                                             (SELECT token FROM fencegate_locks WHERE name = $1 AND NOT retired)";

/// How many migrations have been applied: readiness, on either backend.
pub(crate) const MIGRATIONS_APPLIED: &str = "SELECT count(*) FROM _sqlx_migrations WHERE success";

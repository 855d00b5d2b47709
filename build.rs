//! Rebuilds when a migration is added or changed: `sqlx::migrate!` embeds migrations/ at
//! compile time, and cargo would otherwise only notice a change under src/.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! `sqlx::migrate!` embeds `migrations/` at compile time; without this, cargo would not
//! rebuild the crate when a migration is added.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! The limits the attacks configure most: one request a window, in TOML.

use ratelimit_core::MemoryStore;
use ratelimit_tower::config::Config;
use ratelimit_tower::{HttpRejections, RateLimitLayer};

/// The TOML table of a policy `name`: one request a fixed window of 1,000
/// days (no window edge falls within a test).
pub(crate) fn one_a_window(name: &str) -> String {
    format!("[policies.{name}]\nalgorithm = \"fixed-window\"\nlimit = 1\nwindow = \"1000d\"\n")
}

/// One request a window per route (`key = "route"`, the policy `p`) on
/// `routes`, a TOML array of prefixes.
pub(crate) fn per_route(routes: &str) -> String {
    let policy = one_a_window("p");
    format!("{policy}\n[[rules]]\npolicy = \"p\"\nkey = \"route\"\nroutes = {routes}\n")
}

/// A layer of the TOML configuration `rules` on a fresh `MemoryStore`.
pub(crate) fn layer_of(rules: &str) -> RateLimitLayer<MemoryStore, Config, HttpRejections> {
    RateLimitLayer::with_rules(MemoryStore::new(), Config::from_toml(rules).expect("valid"))
}

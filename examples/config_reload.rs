//! Limits from a configuration file, reloaded while the server runs.
//!
//! ```text
//! cargo run --example config_reload                                   # examples/ratelimit.toml on 127.0.0.1:3000
//! cargo run --example config_reload -- --config my.toml --listen 0.0.0.0:8080
//! PORT=8080 cargo run --example config_reload                         # another port
//! for i in 1 2 3 4 5 6; do curl -si http://127.0.0.1:3000/api/items | head -1; done
//! ```
//!
//! Options:
//!
//! - `--config FILE`: the rules, TOML or JSON by extension (default: the
//!   `ratelimit.toml` next to this example);
//! - `--listen ADDR`: the address to serve on (default `127.0.0.1:$PORT`,
//!   `PORT` defaulting to 3000);
//! - `--poll DURATION`: how often the file is checked for changes (default `1s`).
//!
//! Edit the file while the server runs: once it has been unchanged for one
//! poll, the next request is limited by the new rules. A file that does not
//! load is reported (with the field at fault) and the rules in force stay; so
//! is one that drops rules or policies (an empty or truncated file reads like
//! that), as this example does not allow dropping them.
//!
//! Routes: `GET /`, `GET /api/items`, `POST /login`. Once bound, the server
//! prints one line, `listening on http://ADDR`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use clap::Parser;
use ratelimit_axum::RateLimitInfo;
use ratelimit_core::MemoryStore;
use ratelimit_examples::{exit_with_flag_error, listen_addr_from_env, nonzero_duration, serve_on};
use ratelimit_tower::RateLimitLayer;
use ratelimit_tower::config::ReloadableRules;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "config_reload",
    about = "Limits from a configuration file, reloaded while the server runs."
)]
struct Options {
    /// The rules, TOML or JSON by extension.
    #[arg(long, value_name = "FILE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/ratelimit.toml"))]
    config: PathBuf,
    /// The address to serve on [default: 127.0.0.1:$PORT, PORT defaulting to 3000].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// How often the file is checked for changes.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = nonzero_duration)]
    poll: Duration,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Reload successes and failures are logged with `tracing`.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let options = Options::parse();
    let listen = match options.listen {
        Some(listen) => listen,
        None => listen_addr_from_env()
            .unwrap_or_else(|message| exit_with_flag_error::<Options>(message)),
    };

    // A configuration that does not load at start-up is fatal: there is no
    // previous one to keep.
    let rules = ReloadableRules::from_file(&options.config)?;
    let _watch = rules.watch_file(&options.config, options.poll);

    let limit = RateLimitLayer::with_rules(MemoryStore::new(), rules);
    let app = Router::new()
        .route("/", get(hello))
        .route("/api/items", get(items))
        .route("/login", post(login))
        .layer(limit);

    serve_on(listen, app).await?;
    Ok(())
}

/// What is left of each limit that applied (none when no rule matched).
fn quota(info: Option<&RateLimitInfo>) -> String {
    let mut text = String::new();
    for entry in info.iter().flat_map(|info| info.iter()) {
        text.push_str(&format!(
            "{}: {} of {} left\n",
            entry.policy().name(),
            entry.decision().remaining(),
            entry.decision().limit()
        ));
    }
    text
}

async fn hello(info: Option<RateLimitInfo>) -> String {
    format!("Hello!\n{}", quota(info.as_ref()))
}

async fn items(info: Option<RateLimitInfo>) -> String {
    format!("[\"apple\", \"pear\"]\n{}", quota(info.as_ref()))
}

async fn login(info: Option<RateLimitInfo>) -> String {
    format!("Welcome.\n{}", quota(info.as_ref()))
}

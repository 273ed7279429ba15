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
//! Edit the file while the server runs: within one poll the next request is
//! limited by the new rules. A file that does not load is reported (with the
//! field at fault) and the rules in force stay.
//!
//! Routes: `GET /`, `GET /api/items`, `POST /login`. Once bound, the server
//! prints one line, `listening on http://ADDR`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use ratelimit_axum::RateLimitInfo;
use ratelimit_core::MemoryStore;
use ratelimit_examples::parse_duration;
use ratelimit_tower::RateLimitLayer;
use ratelimit_tower::config::ReloadableRules;

/// The command line.
struct Options {
    config: PathBuf,
    listen: SocketAddr,
    poll: Duration,
}

fn options() -> Result<Options, String> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|_| format!("PORT must be a port number, not {port:?}"))?,
        Err(_) => 3000,
    };
    let mut options = Options {
        config: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ratelimit.toml"),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        poll: Duration::from_secs(1),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--config" => options.config = PathBuf::from(value()?),
            "--listen" => {
                let text = value()?;
                options.listen = text
                    .parse()
                    .map_err(|_| format!("--listen: not an address: {text:?}"))?;
            }
            "--poll" => options.poll = parse_duration(&value()?)?,
            other => {
                return Err(format!(
                    "unknown option {other:?} (use --config FILE, --listen ADDR, --poll DURATION)"
                ));
            }
        }
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Reload successes and failures are logged with `tracing`.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let options = options()?;

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

    let listener = tokio::net::TcpListener::bind(options.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
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

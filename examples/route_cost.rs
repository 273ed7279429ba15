//! What configuration route rules cost a request whose path a client chose
//! to be costly to read: an axum app with eight route rules, the layer on
//! the router and around it, called in process (no sockets) with an
//! ordinary path, a plain 2 KiB path, and paths holding every kind of
//! character hops read otherwise (escapes hidden under `%25` or not, dot
//! segments, backslashes, `;`, tabs, empty segments), 400 bytes and 2 KiB
//! long.
//!
//! ```sh
//! cargo bench -p ratelimit-examples --bench route_cost            # 2,000 requests a path
//! cargo bench -p ratelimit-examples --bench route_cost -- 10000
//! ```
//!
//! Prints, per placement and path, the microseconds a request takes and
//! that against the plain 2 KiB path.

use std::process::ExitCode;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use ratelimit_core::MemoryStore;
use ratelimit_tower::RateLimitLayer;
use ratelimit_tower::config::Config;
use tower::{Layer, ServiceExt};

/// Eight rules, each on its own routes, under a limit no run reaches.
fn config() -> Result<Config, String> {
    let routes = [
        "/files/private",
        "/admin/keys",
        "/{tenant}/{project}/export",
        "/api/v1/admin",
        "/download-private",
        "/static/private",
        "/users/{id}/tokens",
        "/billing/",
    ];
    let mut text = String::from(
        "[policies.wide]\nalgorithm = \"fixed-window\"\nlimit = 1000000000\nwindow = \"1h\"\n",
    );
    for route in routes {
        text.push_str(&format!(
            "[[rules]]\npolicy = \"wide\"\nkey = \"global\"\nroutes = [\"{route}\"]\n"
        ));
    }
    Config::from_toml(&text).map_err(|error| error.to_string())
}

/// The app's routes: a catch-all below a parameter and a file server's.
fn routes() -> Router {
    Router::new()
        .route("/{tenant}/{*rest}", get(|| async { "ok" }))
        .route("/files/{*path}", get(|| async { "file" }))
}

/// `piece` repeated after `/files/` up to about `len` bytes.
fn path_of(piece: &str, len: usize) -> String {
    format!("/files/{}", piece.repeat(len / piece.len()))
}

fn main() -> ExitCode {
    let requests: u32 = match std::env::args().skip(1).find(|arg| arg != "--bench") {
        None => 2_000,
        Some(arg) => match arg.parse() {
            Ok(requests) if requests > 0 => requests,
            _ => {
                eprintln!("route_cost: the number of requests a path, at least 1");
                return ExitCode::FAILURE;
            }
        },
    };
    let config = match config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("route_cost: {error}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        eprintln!("route_cost: no runtime");
        return ExitCode::FAILURE;
    };
    let costly = "a%252F..%5C;x%3B%09/.%2e/";
    let paths = [
        ("ordinary", String::from("/files/reports/2026/q3.pdf")),
        ("plain 2 KiB", path_of("abc/", 2000)),
        ("costly 400 B", path_of(costly, 400)),
        ("costly 2 KiB", path_of(costly, 2000)),
        ("costly 2 KiB b", path_of("a%2F%2e%2e;x%5C%3F/%09//", 2000)),
    ];
    let layer = || RateLimitLayer::with_rules(MemoryStore::new(), config.clone());
    let placements = [
        ("on the router", routes().layer(layer())),
        (
            "around it",
            Router::new().fallback_service(layer().layer(routes())),
        ),
    ];
    println!(
        "{:<14} {:<13} {:>12} {:>9}",
        "layer", "path", "µs/request", "× plain"
    );
    for (placement, app) in placements {
        let mut plain = None;
        for (name, path) in &paths {
            let started = Instant::now();
            for _ in 0..requests {
                let request = Request::get(path.as_str()).body(Body::empty());
                let Ok(request) = request else {
                    eprintln!("route_cost: {name} is no request target");
                    return ExitCode::FAILURE;
                };
                let served = runtime.block_on(app.clone().oneshot(request));
                if served.is_err() {
                    eprintln!("route_cost: {name} was not served");
                    return ExitCode::FAILURE;
                }
            }
            let micros = started.elapsed().as_secs_f64() * 1e6 / f64::from(requests);
            if *name == "plain 2 KiB" {
                plain = Some(micros);
            }
            let ratio = plain.map_or(String::from("-"), |plain| format!("{:.1}", micros / plain));
            println!("{placement:<14} {name:<15} {micros:>12.1} {ratio:>9}");
        }
    }
    ExitCode::SUCCESS
}

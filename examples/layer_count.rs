//! The HTTP benchmark's app (`http_apps`) called in process, without
//! sockets, for a given number of requests from one client, so that a
//! counter (`valgrind --tool=callgrind`, as `scripts/count-layer` runs it,
//! counting only inside `serve`) sees what each limiter adds to a request,
//! whatever else runs on the machine. Built without the package's `metrics` feature, as a
//! default `ratelimit-axum` user gets the layer. The router is given its
//! state first, as `axum::serve` does: called without it, axum would build
//! every route and apply its layers again for each request, a cost a served
//! app never pays (and a larger one for a larger layer).
//!
//! ```sh
//! cargo bench -p ratelimit-examples --no-default-features --bench layer_count --no-run
//! target/release/deps/layer_count-* <none|none-fields|memory|memory-no-headers|governor|governor-headers> <requests>
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::body::Body;
use axum::extract::ConnectInfo;
use clap::ValueEnum;
use http::Request;
use ratelimit_examples::http_apps::{Variant, app};
use tower::{Service, ServiceExt};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [variant, requests] = args.as_slice() else {
        eprintln!("usage: layer_count <variant> <requests>");
        return ExitCode::FAILURE;
    };
    let (Ok(variant), Ok(requests)) = (Variant::from_str(variant, true), requests.parse::<u64>())
    else {
        eprintln!("layer_count: an in-process variant and a number of requests");
        return ExitCode::FAILURE;
    };
    if variant == Variant::Redis {
        eprintln!("layer_count: the redis variant needs a server; use scripts/bench-http");
        return ExitCode::FAILURE;
    }
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        eprintln!("layer_count: no runtime");
        return ExitCode::FAILURE;
    };
    // As `axum::serve` does once (`into_make_service*`): the routes and
    // their layers are built here, not again for every request.
    let app = match runtime.block_on(app(variant, "")) {
        Ok(app) => app.with_state::<()>(()),
        Err(error) => {
            eprintln!("layer_count: {error}");
            return ExitCode::FAILURE;
        }
    };
    let served = serve(&runtime, app, requests);
    match served {
        Ok(ok) if ok == requests => ExitCode::SUCCESS,
        Ok(ok) => {
            eprintln!("layer_count: {ok} of {requests} requests succeeded");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("layer_count: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Serves `requests` requests from one client with `app`: all that
/// `scripts/count-layer` counts (callgrind's `--toggle-collect`), so that
/// the store's start-up (a clock's calibration, which takes a different
/// number of instructions every run) is left out.
#[inline(never)]
fn serve(
    runtime: &tokio::runtime::Runtime,
    mut app: axum::Router,
    requests: u64,
) -> Result<u64, Box<dyn std::error::Error>> {
    let peer = ConnectInfo(SocketAddr::from(([203, 0, 113, 7], 40_000)));
    runtime.block_on(async {
        let mut ok = 0_u64;
        for _ in 0..requests {
            let mut req = Request::new(Body::empty());
            req.extensions_mut().insert(peer);
            let ready = ServiceExt::<Request<Body>>::ready(&mut app).await?;
            let response = ready.call(req).await?;
            ok += u64::from(response.status().is_success());
        }
        Ok(ok)
    })
}

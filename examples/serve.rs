//! How the examples serve their routers and key their requests: one way,
//! instead of each writing its own.

use std::io::{self, Write};
use std::net::SocketAddr;

use axum::Router;
use ratelimit_tower::{Fallback, HeaderKey, PeerIp};
use tokio::net::TcpListener;

/// `127.0.0.1:$PORT`, `PORT` defaulting to 3000: where the examples without
/// a `--listen` flag serve.
///
/// # Errors
///
/// When `PORT` is set to something other than a port number.
pub fn listen_addr_from_env() -> Result<SocketAddr, String> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|_| format!("PORT must be a port number, not {port:?}"))?,
        Err(_) => 3000,
    };
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Binds `addr`, given as `flag` on the command line: the listener and the
/// address it is bound to (the port chosen when `addr`'s is 0).
///
/// # Errors
///
/// When `addr` cannot be bound; the message names `flag` and `addr`.
pub async fn bind_listener(
    flag: &str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), String> {
    let bound = async {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok::<_, io::Error>((listener, local))
    };
    bound.await.map_err(|e| format!("{flag} {addr}: {e}"))
}

/// Binds `addr` and serves `app` there as [`serve`] does, until the
/// process ends: the end of most examples' `main`.
///
/// # Errors
///
/// When the address cannot be bound, or as [`serve`].
pub async fn serve_on(addr: SocketAddr, app: Router) -> io::Result<()> {
    serve(TcpListener::bind(addr).await?, app).await
}

/// Prints `listening on http://ADDR` on stdout (flushed at once, for the
/// tools that wait for it), then serves `app` on `listener` as
/// [`serve_with_peers`] does, until the process ends.
///
/// # Errors
///
/// When stdout or the listener fails.
pub async fn serve(listener: TcpListener, app: Router) -> io::Result<()> {
    let addr = listener.local_addr()?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}")?;
    stdout.flush()?;
    drop(stdout);
    serve_with_peers(listener, app).await
}

/// Serves `app` on `listener` with each connection's peer address in the
/// requests' extensions (`ConnectInfo<SocketAddr>`, which
/// [`PeerIp`](struct@ratelimit_tower::PeerIp) reads), until the process ends.
///
/// # Errors
///
/// When the listener fails.
pub async fn serve_with_peers(listener: TcpListener, app: Router) -> io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

/// Binds `addr` and serves `app` there in the background, for a second
/// listener beside the main one (metrics, an admin API, a mock); returns the
/// address bound. An error while serving goes to stderr, naming `what`.
///
/// # Errors
///
/// When `addr` cannot be bound.
pub async fn spawn_serve(addr: SocketAddr, app: Router, what: &str) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let what = what.to_owned();
    tokio::spawn(async move {
        if let Err(e) = serve_with_peers(listener, app).await {
            eprintln!("error: serving {what} on {bound}: {e}");
        }
    });
    Ok(bound)
}

/// The header [`api_key_or_peer_ip`] keys requests by.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The key of a client: its `x-api-key` header
/// ([`HeaderKey`], hashed, so keys never reach the store, metrics or logs
/// as sent), else its IP as
/// [`PeerIp`](struct@ratelimit_tower::PeerIp) keys it (an IPv6 client by its
/// /64).
///
/// The API key is the client's to choose: a client that sends a new one with
/// every request has a new budget with every request. Use this key beside a
/// rule on [`PeerIp`](struct@ratelimit_tower::PeerIp) alone, which every
/// request counts against whatever key it sends (as the `distributed`
/// example does), or check the key before limiting by it (the `tiers`
/// example).
///
/// Without a peer address (a server that does not give one, a wiring
/// mistake) a request has no key, for a reason the layer refuses with `500`,
/// never lets through:
///
/// ```
/// use axum::body::Body;
/// use axum::http::Request;
/// use ratelimit_tower::{KeyExtractor, NoKey};
///
/// let key = ratelimit_examples::api_key_or_peer_ip();
/// let with_key = Request::get("/").header("x-api-key", "alice").body(Body::empty())?;
/// let without = Request::get("/").body(Body::empty())?;
/// assert!(key.extract(&with_key).is_some());
/// assert_eq!(key.try_extract(&without).err(), Some(NoKey::NoPeerAddress));
/// # Ok::<(), axum::http::Error>(())
/// ```
pub fn api_key_or_peer_ip() -> Fallback<HeaderKey, PeerIp> {
    HeaderKey::from_static(API_KEY_HEADER).or(PeerIp)
}

/// An `application/problem+json` response (RFC 9457) with `status` and
/// `detail`: an example's own refusals (a missing tenant, an unknown API
/// key), beside the layer's 429s.
pub fn problem(status: http::StatusCode, detail: &str) -> http::Response<axum::body::Bytes> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = http::Response::new(axum::body::Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/problem+json"),
    );
    response
}

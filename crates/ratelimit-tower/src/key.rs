//! Key extractors: which bucket a request draws from.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::{HeaderName, Request};

/// The key a request is limited under: an IP address, an API key, a tenant id.
///
/// Keys are bytes; stores keep short printable keys as they are and hash the
/// rest (see `ratelimit_core::key`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key(Bytes);

impl Key {
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys can be secrets (API keys): show their stored form only.
        let shown = ratelimit_core::key::normalize(&self.0);
        write!(f, "Key({})", String::from_utf8_lossy(&shown))
    }
}

impl From<Bytes> for Key {
    fn from(b: Bytes) -> Self {
        Key(b)
    }
}

impl From<Vec<u8>> for Key {
    fn from(v: Vec<u8>) -> Self {
        Key(Bytes::from(v))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key(Bytes::from(s))
    }
}

impl From<&'static str> for Key {
    fn from(s: &'static str) -> Self {
        Key(Bytes::from_static(s.as_bytes()))
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Key(Bytes::from(ip.to_string()))
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Key(Bytes::from(n.to_string()))
    }
}

/// Picks the key a request is limited under.
///
/// Returning `None` means this rule does not apply to the request (see
/// [`RateLimitLayer::on_missing_key`](crate::RateLimitLayer::on_missing_key)).
///
/// Closures `Fn(&Req) -> Option<K>` where `K: Into<Key>` are key extractors:
///
/// ```
/// use ratelimit_tower::KeyExtractor;
/// use http::Request;
///
/// let by_tenant = |req: &Request<()>| {
///     req.headers()
///         .get("x-tenant")
///         .map(|v| v.as_bytes().to_vec())
/// };
/// let req = Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert!(by_tenant.extract(&req).is_some());
/// ```
pub trait KeyExtractor<Req>: Clone + Send + Sync + 'static {
    /// The key for `req`, or `None` when the rule does not apply.
    fn extract(&self, req: &Req) -> Option<Key>;
}

impl<F, Req, K> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<K> + Clone + Send + Sync + 'static,
    K: Into<Key>,
{
    fn extract(&self, req: &Req) -> Option<Key> {
        self(req).map(Into::into)
    }
}

/// One key for every request: a global limit.
#[derive(Debug, Clone)]
pub struct GlobalKey(Key);

impl GlobalKey {
    /// A global key named `name`.
    pub fn new(name: &'static str) -> Self {
        GlobalKey(Key::from(name))
    }
}

impl Default for GlobalKey {
    fn default() -> Self {
        GlobalKey::new("global")
    }
}

impl<Req> KeyExtractor<Req> for GlobalKey {
    fn extract(&self, _: &Req) -> Option<Key> {
        Some(self.0.clone())
    }
}

/// The value of a request header, such as `x-api-key`, hashed (SHA-256) before
/// it reaches a store, so stores, logs and metrics never see the raw secret.
/// Requests without the header, or with an empty one, have no key.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }
}

impl<B> KeyExtractor<Request<B>> for HeaderKey {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let value = req.headers().get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        Some(Key::from(ratelimit_core::key::hashed(value.as_bytes())))
    }
}

/// The TCP peer address of a connection, for servers that do not use axum's
/// `ConnectInfo`: insert it into the request's extensions when accepting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The IP address of the TCP peer, read from the request's extensions:
/// [`PeerAddr`], or axum's `ConnectInfo<SocketAddr>` (feature `axum`).
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) are keyed as the IPv4
/// address. Requests without a known peer have no key.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl PeerIp {
    /// The peer IP of `req`, if known.
    pub fn peer_ip<B>(req: &Request<B>) -> Option<IpAddr> {
        let ext = req.extensions();
        let addr = ext.get::<PeerAddr>().map(|p| p.0);
        #[cfg(feature = "axum")]
        let addr = addr.or_else(|| {
            ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0)
        });
        addr.map(|a| a.ip().to_canonical())
    }
}

impl<B> KeyExtractor<Request<B>> for PeerIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        PeerIp::peer_ip(req).map(Key::from)
    }
}

//! The [`Key`] type, the [`KeyExtractor`] trait and the simple extractors.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use http::{HeaderName, Request};

use super::cidr::CidrError;
use crate::options::MissingKey;

/// The key a request is limited under: an IP address, an API key, a tenant id.
///
/// A key holds what the store is given, in one of two forms, decided by how
/// it is made:
///
/// - **A value** (bytes, text or a number: an API key, a token, a tenant or
///   user id) is hashed: `#` and 32 hex digits of its SHA-256
///   ([`ratelimit_core::key::hashed`]). Every key made from one is: `From`
///   a `Vec<u8>`, `&[u8]`, `&[u8; N]`, `String`, `&str`, [`Bytes`] or `u64`,
///   so a [`Limits::one`](crate::Limits::one) key and a closure's,
///   [`HeaderKey`]'s values, and the values `ratelimit-axum`'s `Limiter`
///   checks.
/// - **An address, a route or a name set in code** is kept as text: `From`
///   an [`IpAddr`] (as [`PeerIp`](struct@PeerIp) and [`ClientIp`](crate::ClientIp)
///   key a client by default: an IPv4 address's text, an IPv6 address's
///   network, `2001:db8::/64`), [`RouteKey`]'s route, [`GlobalKey`]'s name,
///   and [`Composite`]'s join of two keys.
///
/// So one value is one budget whichever way it reaches a store (a header, a
/// rule provider, a handler's `Limiter`), and so is one client's address,
/// no store ever holds a raw secret,
/// and a value never lands on an address's budget: a client sending
/// `x-api-key: 192.0.2.1` spends a budget of its own, not that address's.
/// Stores then bound every key as they bound any (see `ratelimit_core::key`).
/// Keys of up to [`Key::INLINE_LEN`] bytes (any IP address's text, every
/// hashed value) are held inline, so making one allocates nothing.
///
/// ```
/// use ratelimit_tower::{HeaderKey, Key};
/// use std::net::IpAddr;
///
/// // One value, one key, however it is given.
/// assert_eq!(Key::from("acme"), Key::from(b"acme".to_vec()));
/// assert_eq!(Key::from("acme"), HeaderKey::from_static("x-api-key").key_for(b"acme"));
/// assert_eq!(Key::from("acme").as_bytes(), ratelimit_core::key::hashed(b"acme"));
/// // An address is its text, and no value's key.
/// let ip: IpAddr = "192.0.2.1".parse()?;
/// assert_eq!(Key::from(ip).as_bytes(), b"192.0.2.1");
/// assert_ne!(Key::from(ip), Key::from("192.0.2.1"));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline {
        len: u8,
        bytes: [u8; Key::INLINE_LEN],
    },
    Shared(Bytes),
}

impl Key {
    /// The longest key held without a heap allocation, in bytes: the text of
    /// any IP address with a prefix length (`/128`).
    pub const INLINE_LEN: usize = ratelimit_core::key::MAX_IP_TEXT_LEN + 4;

    /// The key of a value: its hash, whatever its length.
    fn value(bytes: &[u8]) -> Self {
        Key::text(&ratelimit_core::key::hashed_parts(&[bytes]))
    }

    /// A key of `text` as it is: an address, a route, a name set in code, a
    /// join of keys. Inline when short, else on the heap.
    pub(crate) fn text(text: &[u8]) -> Self {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= Key::INLINE_LEN => {
                let mut inline = [0; Key::INLINE_LEN];
                inline[..text.len()].copy_from_slice(text);
                Key(Repr::Inline { len, bytes: inline })
            }
            _ => Key(Repr::Shared(Bytes::copy_from_slice(text))),
        }
    }

    /// The key's bytes: what the store is given.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(bytes) => bytes,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As a store would write it: bounded, whatever the key.
        let shown = ratelimit_core::key::normalize(self.as_bytes());
        write!(f, "Key({})", String::from_utf8_lossy(&shown))
    }
}

impl From<&[u8]> for Key {
    /// The key of a value: hashed.
    fn from(value: &[u8]) -> Self {
        Key::value(value)
    }
}

impl From<Bytes> for Key {
    /// The key of a value: hashed.
    fn from(value: Bytes) -> Self {
        Key::value(&value)
    }
}

impl From<Vec<u8>> for Key {
    /// The key of a value: hashed.
    fn from(value: Vec<u8>) -> Self {
        Key::value(&value)
    }
}

impl From<String> for Key {
    /// The key of a value: hashed.
    fn from(value: String) -> Self {
        Key::value(value.as_bytes())
    }
}

impl From<&str> for Key {
    /// The key of a value: hashed.
    fn from(value: &str) -> Self {
        Key::value(value.as_bytes())
    }
}

impl<const N: usize> From<&[u8; N]> for Key {
    /// The key of a value: hashed.
    fn from(value: &[u8; N]) -> Self {
        Key::value(value)
    }
}

impl From<IpAddr> for Key {
    /// The key of a client at `ip`, as [`PeerIp`](struct@PeerIp) keys it by
    /// default, without a heap allocation: an IPv4 address is its text
    /// (`192.0.2.1`), also when written IPv4-mapped (`::ffff:192.0.2.1`, an
    /// IPv4 client on a dual-stack socket); an IPv6 address is its /64
    /// (`2001:db8:1:2::/64`), since one host or subscriber holds a whole /64
    /// and would otherwise take a fresh budget with each of its addresses.
    /// So a rule provider's `Limits::one(policy, ip, 1)` and a handler's
    /// `Limiter` checking `ip` spend the budget `PeerIp` keys.
    ///
    /// ```
    /// use ratelimit_tower::Key;
    /// use std::net::IpAddr;
    ///
    /// let key = |ip: &str| Key::from(ip.parse::<IpAddr>().unwrap());
    /// assert_eq!(key("::ffff:192.0.2.1").as_bytes(), b"192.0.2.1");
    /// assert_eq!(key("2001:db8:1:2::9").as_bytes(), b"2001:db8:1:2::/64");
    /// ```
    fn from(ip: IpAddr) -> Self {
        ip_key(ip.to_canonical(), Some(PeerIp::DEFAULT_IPV6_PREFIX))
    }
}

impl From<u64> for Key {
    /// The key of a value (a user id, say): its decimal digits, hashed.
    fn from(n: u64) -> Self {
        Key::value(itoa::Buffer::new().format(n).as_bytes())
    }
}

/// Why a key extractor found no key for a request
/// ([`KeyExtractor::try_extract`]). Each cause has its own safe default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoKey {
    /// The rule does not apply to this request: a closure returned `None`.
    /// [`on_missing_key`](crate::RateLimitLayer::on_missing_key) decides;
    /// by default ([`MissingKey::Allow`]) the request passes this rule.
    NotApplicable,
    /// The request lacks what its key is made of: [`HeaderKey`] without its
    /// header (or with a gRPC `-bin` value that is not base64). [`on_missing_key`](crate::RateLimitLayer::on_missing_key)
    /// decides; by default ([`MissingKey::Reject`]) the request is refused,
    /// since leaving a header out must not lift a limit.
    Absent,
    /// The server gives the layer no peer address ([`PeerIp`](struct@crate::PeerIp),
    /// [`ClientIp`](crate::ClientIp)): a wiring mistake (axum: serve
    /// `into_make_service_with_connect_info::<SocketAddr>()`). Whatever
    /// `on_missing_key` says, the request is refused with `500`
    /// ([`Rejection::NoPeerAddress`](crate::Rejection::NoPeerAddress)).
    NoPeerAddress,
}

impl NoKey {
    /// What a rule does when none is configured with `on_missing_key`.
    pub(crate) fn default_action(self) -> MissingKey {
        match self {
            NoKey::NotApplicable => MissingKey::Allow,
            NoKey::Absent | NoKey::NoPeerAddress => MissingKey::Reject,
        }
    }
}

/// Picks the key a request is limited under.
///
/// Returning `None` means no key: [`try_extract`](KeyExtractor::try_extract)
/// says why ([`NoKey`]), and the rule acts on it (see
/// [`RateLimitLayer::on_missing_key`](crate::RateLimitLayer::on_missing_key)).
/// For a closure, `None` means the rule does not apply to the request
/// ([`NoKey::NotApplicable`]): the request passes this rule by default.
///
/// A closure cannot tell the layer *why* it found no key, so it must not
/// return `None` for a key it failed to find. In particular, a closure that
/// falls back to the client's address by calling `PeerIp.extract(req)` lets
/// every request through when the server gives no peer address (a wiring
/// mistake [`PeerIp`](struct@crate::PeerIp) answers with `500`). Let the
/// closure find only its own key, and fall back with
/// [`Fallback::new(closure, PeerIp)`](Fallback::new): the missing peer
/// address is then refused, as by `PeerIp` alone.
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
    /// The key for `req`, or `None` when there is none.
    fn extract(&self, req: &Req) -> Option<Key>;

    /// The key for `req`, or why there is none. The default says
    /// [`NoKey::NotApplicable`] for `None`; extractors whose missing key
    /// means something else say so here.
    fn try_extract(&self, req: &Req) -> Result<Key, NoKey> {
        self.extract(req).ok_or(NoKey::NotApplicable)
    }
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
    /// A global key named `name`, kept as text (a name set in code).
    pub fn new(name: &'static str) -> Self {
        GlobalKey(Key(Repr::Shared(Bytes::from_static(name.as_bytes()))))
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

/// The value of a request header, such as `x-api-key`, as a key: hashed
/// (SHA-256) like every value (see [`Key`]) before it reaches a store, so
/// stores, logs and metrics never see the raw secret. The key is the value's
/// alone, so one value is one budget however it reaches the layer: through
/// this extractor, a [`Limits::one`](crate::Limits::one) of the same value,
/// a closure, or a handler's `Limiter` (`ratelimit-axum`); credentials are
/// first written one way ([Credentials](#credentials)), and
/// [`key_for`](HeaderKey::key_for) gives their key.
/// [`key_for`](HeaderKey::key_for) gives the key of a value, for an
/// operator's tools.
///
/// Hence two headers under one policy share budgets by value: keyed by
/// `x-tenant` on one route and `x-api-key` on another, a client could send a
/// tenant's (not secret) id as its API key and spend that tenant's budget.
/// Give each header its own policy (the `config` module refuses a file that
/// does not).
///
/// # A key the client chooses
///
/// The value is whatever the client sends. Unless the service checks it
/// (looks the API key up, verifies a token) before or in the rule, a client
/// that sends a new value with every request gets a new budget with every
/// request: the limit never applies to it, and each value takes room in the
/// store. Keying by a header limits a client only when
///
/// - the service knows the value: unknown values are refused before they are
///   counted (a [`RuleProvider`](crate::RuleProvider) that looks the key up
///   and answers [`Limits::reject`](crate::Limits::reject) for an unknown
///   one, then `401`), or
/// - a limit the client cannot choose applies beside it: a rule on the client
///   IP, all or nothing with the header's ([`Rule::and`](crate::Rule::and)):
///
/// ```
/// use ratelimit_tower::{HeaderKey, MemoryStore, PeerIp, Policy, RateLimitLayer, Rule};
/// use std::time::Duration;
///
/// let per_ip = Policy::fixed_window(100, Duration::from_secs(60))?.with_name("per-ip")?;
/// let per_key = Policy::fixed_window(100, Duration::from_secs(60))?.with_name("per-key")?;
/// // Every request counts against its client IP, whatever key it sends, and
/// // against its API key (its IP without one).
/// let layer = RateLimitLayer::new(MemoryStore::new(), per_ip, PeerIp)
///     .and(Rule::new(per_key, HeaderKey::from_static("x-api-key").or(PeerIp)));
/// # let _ = layer;
/// # Ok::<(), ratelimit_tower::PolicyError>(())
/// ```
///
/// # Without the header
///
/// Requests without the header, or with an empty one, have no key
/// ([`NoKey::Absent`]): by default they are refused (`429`, or what
/// [`on_rejection`](crate::RateLimitLayer::on_rejection) makes of
/// [`Rejection::MissingKey`](crate::Rejection::MissingKey)), so leaving the
/// header out does not lift the limit. `on_missing_key(MissingKey::Allow)`
/// lets them through this rule instead (give them another rule, such as
/// [`PeerIp`](struct@crate::PeerIp), with [`Rule::and`](crate::Rule::and)); either way each one is
/// counted ([`Stats`](crate::Stats), metrics) and logged.
///
/// # Credentials
///
/// In `Authorization` and `Proxy-Authorization` the scheme is
/// case-insensitive and may be followed by several spaces (RFC 9110): a
/// service takes `Bearer tok`, `bearer tok` and `BEARER  tok` for one
/// token. They are one key, that of the value with its scheme in lowercase
/// and one space before the credentials, which are kept as they are. A
/// value of one word (a bare key, no scheme) is kept whole as it is.
///
/// ```
/// use ratelimit_tower::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::from_static("authorization");
/// let with = |value: &str| {
///     let req = http::Request::get("/").header("authorization", value).body(()).unwrap();
///     key.extract(&req)
/// };
/// assert_eq!(with("Bearer tok"), with("bEARER   tok"));
/// assert_eq!(with("Bearer tok"), Some(key.key_for(b"bearer tok")));
/// assert_ne!(with("Bearer tok"), with("Bearer TOK"));
/// assert_ne!(with("Key-AbC"), with("Key-aBc"));
/// ```
///
/// # gRPC binary metadata
///
/// A header whose name ends in `-bin` is gRPC binary metadata: its value is
/// base64, padded or not (gRPC clients send either, and both mean the same
/// bytes). The key is that of the decoded bytes, so one value is one budget
/// however it is written. A value that does not decode is no key, as an
/// absent header ([`NoKey::Absent`]): refused by default.
///
/// ```
/// use ratelimit_tower::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::from_static("x-api-key-bin");
/// let with = |value: &str| {
///     let req = http::Request::get("/").header("x-api-key-bin", value).body(()).unwrap();
///     key.extract(&req)
/// };
/// // "secret!" padded and unpadded: one key, the key of the bytes.
/// assert_eq!(with("c2VjcmV0IQ=="), Some(key.key_for(b"secret!")));
/// assert_eq!(with("c2VjcmV0IQ"), Some(key.key_for(b"secret!")));
/// assert_eq!(with("not base64!"), None);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }

    /// Keys requests by the header `name`, a constant:
    /// `HeaderKey::from_static("x-api-key")`.
    ///
    /// # Panics
    ///
    /// As [`HeaderName::from_static`]: when `name` is not a valid header name
    /// in lowercase. A constant, so this shows at the first run.
    pub fn from_static(name: &'static str) -> Self {
        HeaderKey::new(HeaderName::from_static(name))
    }

    /// The key of requests whose header holds `value`: the key of the
    /// value, `Key::from(value)` (hashed, see [`Key`]). For a `-bin` header,
    /// `value` is the decoded bytes, not their base64; for `Authorization`
    /// and `Proxy-Authorization`, the key of the value with its scheme in
    /// lowercase and one space after it (see [Credentials](#credentials)).
    ///
    /// ```
    /// use ratelimit_tower::{HeaderKey, Key, KeyExtractor};
    ///
    /// let api_key = HeaderKey::from_static("x-api-key");
    /// let req = http::Request::get("/").header("x-api-key", "acme").body(()).unwrap();
    /// assert_eq!(api_key.extract(&req), Some(api_key.key_for(b"acme")));
    /// assert_eq!(api_key.key_for(b"acme"), Key::from("acme"));
    /// ```
    pub fn key_for(&self, value: &[u8]) -> Key {
        if self.is_credentials() {
            return Key::from(credentials(value).as_slice());
        }
        Key::from(value)
    }
}

impl HeaderKey {
    /// Whether the header is gRPC binary metadata, whose values are base64.
    fn is_binary(&self) -> bool {
        self.name.as_str().ends_with("-bin")
    }

    /// Whether the header carries credentials (`<scheme> <credentials>`).
    fn is_credentials(&self) -> bool {
        self.name == http::header::AUTHORIZATION || self.name == http::header::PROXY_AUTHORIZATION
    }
}

/// A credentials value with its scheme, which RFC 9110 makes
/// case-insensitive, in lowercase, and one space between it and the
/// credentials (the grammar allows several); spaces and tabs around the
/// value dropped. The credentials are kept as they are, and so is a value
/// of one word: a token's case matters.
fn credentials(value: &[u8]) -> Vec<u8> {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !blank(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |i| i + 1);
    let value = &value[start..end];
    let scheme_end = value.iter().position(blank).unwrap_or(value.len());
    let (scheme, rest) = value.split_at(scheme_end);
    let rest = &rest[rest.iter().position(|b| !blank(b)).unwrap_or(rest.len())..];
    // One word is a bare key, not a scheme: its case matters.
    if rest.is_empty() {
        return value.to_vec();
    }
    let mut out = scheme.to_ascii_lowercase();
    out.push(b' ');
    out.extend_from_slice(rest);
    out
}

/// The bytes of a gRPC binary metadata value: standard base64, padded or
/// not, as the gRPC spec requires a server to accept. Bits left over after
/// the last byte must be zero, so each byte string has one encoding (and its
/// padded twin): a client cannot write one value many ways.
fn decode_binary(value: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const BINARY_METADATA: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    BINARY_METADATA.decode(value).ok()
}

impl<B> KeyExtractor<Request<B>> for HeaderKey {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let value = req.headers().get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        if self.is_binary() {
            let bytes = decode_binary(value.as_bytes())?;
            return Some(self.key_for(&bytes));
        }
        if self.is_credentials() {
            let value = credentials(value.as_bytes());
            // Blanks alone: no credentials, as an empty header.
            return (!value.is_empty()).then(|| Key::from(value.as_slice()));
        }
        Some(self.key_for(value.as_bytes()))
    }

    fn try_extract(&self, req: &Request<B>) -> Result<Key, NoKey> {
        self.extract(req).ok_or(NoKey::Absent)
    }
}

/// The TCP peer address of a connection, for servers that do not use axum's
/// `ConnectInfo`: insert it into the request's extensions when accepting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The IP address of the TCP peer, read from the request's extensions:
/// [`PeerAddr`], axum's `ConnectInfo<SocketAddr>` (feature `axum`), or
/// tonic's `TcpConnectInfo` (feature `tonic`).
///
/// # Keys
///
/// An IPv4 peer is keyed by its address (`192.0.2.1`). An IPv6 peer is keyed
/// by its network, the first 64 bits by default (`2001:db8:1:2::/64`): a
/// subscriber, a host or a cloud instance is routinely given a whole /64
/// (or /56, /48), and could otherwise take a fresh address, and a fresh
/// budget, for every request. [`ipv6_prefix`](PeerIp::ipv6_prefix) sets
/// another length (`128` keys each address alone, as `2001:db8::1/128`).
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) are keyed as the IPv4
/// address.
///
/// `PeerIp` is also a constant of its default, so `PeerIp` alone is the
/// extractor with the /64 default (`PeerIp == PeerIp::new()`).
///
/// A request without a known peer is a wiring mistake, never a pass: the
/// layer answers `500` ([`Rejection::NoPeerAddress`](crate::Rejection::NoPeerAddress),
/// [`NoKey::NoPeerAddress`]), logs it once at `error` and counts each one
/// ([`Stats::no_peer_address`](crate::Stats::no_peer_address)). With axum,
/// serve `app.into_make_service_with_connect_info::<SocketAddr>()`.
///
/// ```
/// use ratelimit_tower::{KeyExtractor, PeerAddr, PeerIp};
///
/// let from = |addr: &str| {
///     let mut req = http::Request::new(());
///     req.extensions_mut().insert(PeerAddr(addr.parse().unwrap()));
///     req
/// };
/// let key = |extractor: &PeerIp, addr| extractor.extract(&from(addr)).unwrap();
///
/// assert_eq!(key(&PeerIp, "192.0.2.1:4000").as_bytes(), b"192.0.2.1");
/// // Two addresses of one /64 share a key.
/// assert_eq!(key(&PeerIp, "[2001:db8:1:2::1]:4000").as_bytes(), b"2001:db8:1:2::/64");
/// assert_eq!(key(&PeerIp, "[2001:db8:1:2:ffff::9]:4000").as_bytes(), b"2001:db8:1:2::/64");
///
/// let per_56 = PeerIp::new().ipv6_prefix(56)?;
/// assert_eq!(key(&per_56, "[2001:db8:1:2ff::1]:4000").as_bytes(), b"2001:db8:1:200::/56");
/// assert!(PeerIp::new().ipv6_prefix(129).is_err());
/// # Ok::<(), ratelimit_tower::CidrError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

/// [`PeerIp`](struct@crate::PeerIp) with its defaults ([`PeerIp::new`]): IPv6 peers keyed by their
/// /64, IPv4 peers by their address.
#[allow(non_upper_case_globals)]
pub const PeerIp: PeerIp = PeerIp::new();

impl Default for PeerIp {
    /// [`PeerIp::new`].
    fn default() -> Self {
        PeerIp::new()
    }
}

impl PeerIp {
    /// The default length of the network an IPv6 peer is keyed by: 64 bits.
    pub const DEFAULT_IPV6_PREFIX: u8 = 64;

    /// Keys IPv4 peers by their address and IPv6 peers by their /64.
    pub const fn new() -> Self {
        PeerIp {
            ipv6_prefix: Self::DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys IPv6 peers by their first `len` bits (default 64; commonly 64,
    /// 56 or 48): the key is the network, such as `2001:db8:1:2::/64`, even
    /// for `len` 128 (`2001:db8::1/128`). 0 puts every IPv6 peer under one
    /// key. IPv4 peers are not masked.
    ///
    /// # Errors
    ///
    /// [`CidrError::PrefixLenTooLong`] when `len` exceeds 128.
    pub fn ipv6_prefix(mut self, len: u8) -> Result<Self, CidrError> {
        self.ipv6_prefix = checked_ipv6_prefix(len)?;
        Ok(self)
    }

    /// The length of the network an IPv6 peer is keyed by.
    pub fn ipv6_prefix_len(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The peer IP of `req`, if known (unmasked).
    pub fn peer_ip<B>(req: &Request<B>) -> Option<IpAddr> {
        let ext = req.extensions();
        let addr = ext.get::<PeerAddr>().map(|p| p.0);
        #[cfg(feature = "axum")]
        let addr = addr.or_else(|| {
            ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0)
        });
        #[cfg(feature = "tonic")]
        let addr = addr.or_else(|| {
            ext.get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|c| c.remote_addr())
        });
        addr.map(|a| a.ip().to_canonical())
    }
}

/// `len` as an IPv6 prefix length, or the error for one over 128.
pub(super) fn checked_ipv6_prefix(len: u8) -> Result<u8, CidrError> {
    if len > 128 {
        return Err(CidrError::PrefixLenTooLong {
            len: u32::from(len),
            max: 128,
        });
    }
    Ok(len)
}

/// The key of `ip`: an IPv4 address as its text; an IPv6 address, when
/// `ipv6_prefix` is given, as the network of its first `len` bits
/// (`2001:db8:1:2::/64`), otherwise as its text.
pub(super) fn ip_key(ip: IpAddr, ipv6_prefix: Option<u8>) -> Key {
    let (IpAddr::V6(v6), Some(len)) = (ip, ipv6_prefix) else {
        return Key::text(ratelimit_core::key::IpText::new(ip).as_bytes());
    };
    let len = len.min(128);
    let mask = u128::MAX.checked_shl(u32::from(128 - len)).unwrap_or(0);
    let network = IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask));
    let text = ratelimit_core::key::IpText::new(network);
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(len).as_bytes();
    // At most 39 bytes of address, '/' and 3 digits.
    let mut buf = [0u8; 64];
    let mut at = 0;
    for part in [text.as_bytes(), b"/", digits] {
        let end = at + part.len();
        if let Some(slot) = buf.get_mut(at..end) {
            slot.copy_from_slice(part);
        }
        at = end;
    }
    Key::text(buf.get(..at).unwrap_or_default())
}

impl<B> KeyExtractor<Request<B>> for PeerIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        PeerIp::peer_ip(req).map(|ip| ip_key(ip, Some(self.ipv6_prefix)))
    }

    fn try_extract(&self, req: &Request<B>) -> Result<Key, NoKey> {
        self.extract(req).ok_or(NoKey::NoPeerAddress)
    }
}

/// Two keys in one: route and user, tenant and user. A request has a key only
/// when both parts do; otherwise the first part without one says why
/// ([`NoKey`]). The parts are joined unambiguously (the first is
/// length-prefixed), so `("ab", "c")` and `("a", "bc")` differ.
///
/// ```
/// use ratelimit_tower::{Composite, KeyExtractor};
/// use http::Request;
///
/// let tenant = |req: &Request<()>| req.headers().get("x-tenant").map(|v| v.as_bytes().to_vec());
/// let user = |req: &Request<()>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec());
/// let key = Composite::new(tenant, user);
/// let req = Request::builder().header("x-tenant", "acme").header("x-user", "bob").body(()).unwrap();
/// // Each part as a key (the values hashed), joined.
/// let parts = [ratelimit_core::key::hashed(b"acme"), ratelimit_core::key::hashed(b"bob")];
/// assert_eq!(key.extract(&req).unwrap().as_bytes(), [&b"33:"[..], &parts[0], &parts[1]].concat());
/// ```
#[derive(Debug, Clone)]
pub struct Composite<A, B> {
    first: A,
    second: B,
}

impl<A, B> Composite<A, B> {
    /// The key made of `first`'s and `second`'s.
    pub fn new(first: A, second: B) -> Self {
        Composite { first, second }
    }
}

impl<A, B, Req> KeyExtractor<Req> for Composite<A, B>
where
    A: KeyExtractor<Req>,
    B: KeyExtractor<Req>,
{
    fn extract(&self, req: &Req) -> Option<Key> {
        self.try_extract(req).ok()
    }

    fn try_extract(&self, req: &Req) -> Result<Key, NoKey> {
        let first = self.first.try_extract(req)?;
        let second = self.second.try_extract(req)?;
        Ok(join(&first, &second))
    }
}

/// `first` and `second` as one key, `first` length-prefixed so that
/// `("ab", "c")` and `("a", "bc")` differ: `2:abc`, `1:abc`.
pub(crate) fn join(first: &Key, second: &Key) -> Key {
    let (a, b) = (first.as_bytes(), second.as_bytes());
    let mut joined = Vec::with_capacity(a.len() + b.len() + 8);
    joined.extend_from_slice(a.len().to_string().as_bytes());
    joined.push(b':');
    joined.extend_from_slice(a);
    joined.extend_from_slice(b);
    Key::text(&joined)
}

/// A key, or another when the first finds none: built by [`Fallback::new`]
/// or by the `or` method of this crate's extractors
/// (`HeaderKey::from_static("x-api-key").or(PeerIp)`).
///
/// The second is asked only when the first has no key, whatever the reason;
/// when neither has one, the second's reason ([`NoKey`]) decides, so
/// `HeaderKey::from_static("x-api-key").or(PeerIp)` answers `500` for a
/// request with neither a header nor a peer address, as [`PeerIp`](struct@crate::PeerIp) does.
/// The two keys share one key space: with a [`HeaderKey`] first (its keys are
/// SHA-256 hashes) and an IP second, no header value can take an IP's
/// budget.
///
/// With a key the client chooses first (a header), a client that sends a
/// new value with every request is never limited by this rule: pair it with
/// a rule on the client IP ([`HeaderKey`](HeaderKey#a-key-the-client-chooses)
/// shows how).
///
/// A closure first that finds no key (returns `None`) is followed by the
/// second, so `Fallback::new(closure, PeerIp)` refuses a request without a
/// peer address with `500`, as [`PeerIp`](struct@crate::PeerIp) does; a
/// closure that calls `PeerIp.extract` itself cannot say why it found
/// nothing, and its `None` lets the request pass (see [`KeyExtractor`]).
#[derive(Debug, Clone)]
pub struct Fallback<A, B> {
    first: A,
    then: B,
}

impl<A, B> Fallback<A, B> {
    /// `first`'s key, or `then`'s when `first` finds none.
    ///
    /// ```
    /// use ratelimit_tower::{Fallback, Key, KeyExtractor, PeerIp};
    /// use http::Request;
    ///
    /// let tenant = |req: &Request<()>| req.headers().get("x-tenant").map(|v| v.as_bytes().to_vec());
    /// let key = Fallback::new(tenant, PeerIp);
    /// let req = Request::builder().header("x-tenant", "acme").body(()).unwrap();
    /// assert_eq!(key.extract(&req), Some(Key::from("acme")));
    /// ```
    pub fn new(first: A, then: B) -> Self {
        Fallback { first, then }
    }
}

impl<A, B, Req> KeyExtractor<Req> for Fallback<A, B>
where
    A: KeyExtractor<Req>,
    B: KeyExtractor<Req>,
{
    fn extract(&self, req: &Req) -> Option<Key> {
        self.try_extract(req).ok()
    }

    fn try_extract(&self, req: &Req) -> Result<Key, NoKey> {
        self.first
            .try_extract(req)
            .or_else(|_| self.then.try_extract(req))
    }
}

/// The route of a request: axum's matched route pattern (`/users/{id}`,
/// feature `axum`), else the path, with every percent-encoded byte decoded
/// but `/` and `%` (whose escapes are kept, in capitals), then repeated
/// slashes merged and dot segments resolved (`/api//x`, `/api/./x` and
/// `/%61pi/x` are `/api/x`; `/a:b`, `/a%3Ab` and `/a%3ab` are one key; case
/// and `%2F` are kept). Bytes that do not decode to UTF-8 are replaced, so
/// two such paths may share a budget, which only ever limits more. Combine
/// it with a user key in a [`Composite`] for per-route, per-user limits.
///
/// The method is not part of the key: an `any` route runs one handler for
/// every method, and a client can invent methods without end (`PURGE`,
/// `get`), so a key per method would be a budget per method. Limit methods
/// apart with rules of their own (a config rule's `methods`).
///
/// Only axum's matched route names the handler that runs: put the layer on
/// the `Router` (`Router::layer` or `route_layer`), where `MatchedPath` is
/// known. Elsewhere (around the router, under `nest_service`, in a
/// fallback) the key is the path, so every path is a key of its own
/// (`/users/1` and `/users/2`), kept as text like every route: a path that
/// carries a secret (a capability URL, such as a webhook's `/hooks/<secret>`)
/// reaches the store as it is there.
///
/// ```
/// use ratelimit_tower::{KeyExtractor, RouteKey};
///
/// let key = |method: &str, path: &str| {
///     let req = http::Request::builder().method(method).uri(path).body(()).unwrap();
///     RouteKey.extract(&req).unwrap()
/// };
/// assert_eq!(key("GET", "/api//%65xport/").as_bytes(), b"/api/export/");
/// assert_eq!(key("PURGE", "/api/export"), key("GET", "/api/export"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

impl<B> KeyExtractor<Request<B>> for RouteKey {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        #[cfg(feature = "axum")]
        if let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() {
            return Some(Key::text(matched.as_str().as_bytes()));
        }
        let path = crate::path::key_path(req.uri().path());
        Some(Key::text(path.as_bytes()))
    }
}

fallback_or!(GlobalKey, HeaderKey, PeerIp, RouteKey);
fallback_or!(<A, B> Composite<A, B>);
fallback_or!(<A, B> Fallback<A, B>);

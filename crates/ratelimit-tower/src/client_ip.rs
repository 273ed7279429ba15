//! The client IP behind trusted reverse proxies: [`ClientIp`].
//!
//! Forwarding headers (`Forwarded`, `X-Forwarded-For`) are written by whoever
//! sent the request, so they are only believed as far as a chain of trusted
//! proxies vouches for them. See [`ClientIp`] for the exact algorithm.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;

use http::header::{FORWARDED, HeaderValue, ValueIter};
use http::{HeaderMap, HeaderName, Request};

use crate::key::{Key, KeyExtractor, NoKey, PeerIp};

/// The longest single list entry (one `X-Forwarded-For` address or one
/// `Forwarded` element) that is scanned; longer entries are malformed. This
/// bounds the work per hop regardless of [`ClientIp::max_header_bytes`].
const MAX_ENTRY_BYTES: usize = 1024;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Why a CIDR block (or a prefix length) was rejected.
///
/// Returned by [`Cidr::from_str`], [`Cidr::new`], [`TrustedProxies::parse`]
/// and [`ClientIp::ipv6_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CidrError {
    /// The address part is not an IPv4 or IPv6 address (it is included).
    InvalidAddress(String),
    /// The part after `/` is not a decimal number (it is included).
    InvalidPrefixLen(String),
    /// The prefix length is longer than the address.
    PrefixLenTooLong {
        /// The prefix length given.
        len: u32,
        /// The longest allowed: 32 for IPv4, 128 for IPv6.
        max: u8,
    },
    /// Bits are set after the prefix, as in `10.0.0.1/8`: write the network
    /// address (`10.0.0.0/8`), or the host alone (`10.0.0.1`) for one host.
    HostBitsSet(String),
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CidrError::InvalidAddress(s) => write!(f, "invalid IP address in CIDR block {s:?}"),
            CidrError::InvalidPrefixLen(s) => write!(f, "invalid prefix length {s:?}"),
            CidrError::PrefixLenTooLong { len, max } => {
                write!(f, "prefix length /{len} is longer than /{max}")
            }
            CidrError::HostBitsSet(s) => {
                write!(f, "CIDR block {s:?} has bits set after its prefix")
            }
        }
    }
}

impl Error for CidrError {}

/// An IPv4 or IPv6 network: `10.0.0.0/8`, `2001:db8::/32`.
///
/// Parsed with [`str::parse`]: a bare address is a single host (`/32` or
/// `/128`). Surrounding whitespace is ignored; host bits set after the prefix
/// (`10.0.0.1/8`) are an error rather than silently masked, since a typo in a
/// trust list should fail loudly. IPv4-mapped IPv6 networks
/// (`::ffff:10.0.0.0/104`) are stored as the IPv4 network (`10.0.0.0/8`), and
/// [`contains`](Cidr::contains) matches IPv4 addresses against IPv6 networks
/// through their mapped form, so `::/0` contains every address.
///
/// ```
/// use ratelimit_tower::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse().unwrap();
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert_eq!("2001:db8::1".parse::<Cidr>().unwrap().to_string(), "2001:db8::1/128");
/// assert!("10.0.0.0/33".parse::<Cidr>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: IpAddr,
    len: u8,
}

impl Cidr {
    /// The network `addr/len`.
    ///
    /// # Errors
    ///
    /// [`CidrError::PrefixLenTooLong`] when `len` exceeds 32 (IPv4) or 128
    /// (IPv6), [`CidrError::HostBitsSet`] when `addr` has bits set after the
    /// prefix.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, CidrError> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if len > max {
            return Err(CidrError::PrefixLenTooLong {
                len: u32::from(len),
                max,
            });
        }
        let (net, net_len) = match addr {
            IpAddr::V6(v6) if len >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), len - 96),
                None => (addr, len),
            },
            _ => (addr, len),
        };
        if mask(net, net_len) != net {
            return Err(CidrError::HostBitsSet(format!("{addr}/{len}")));
        }
        Ok(Cidr { net, len: net_len })
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.net
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether `ip` is in this network (IPv4-mapped addresses are normalised).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(_), ip @ IpAddr::V4(_)) | (IpAddr::V6(_), ip @ IpAddr::V6(_)) => {
                mask(ip, self.len) == self.net
            }
            (IpAddr::V6(_), IpAddr::V4(v4)) => {
                mask(IpAddr::V6(v4.to_ipv6_mapped()), self.len) == self.net
            }
            (IpAddr::V4(_), IpAddr::V6(_)) => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::InvalidAddress(s.to_owned()))?;
        let len = match len {
            None => match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
            Some(len) => {
                if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(CidrError::InvalidPrefixLen(len.to_owned()));
                }
                let len: u32 = len
                    .parse()
                    .map_err(|_| CidrError::InvalidPrefixLen(len.to_owned()))?;
                let max = match addr {
                    IpAddr::V4(_) => 32,
                    IpAddr::V6(_) => 128,
                };
                u8::try_from(len)
                    .ok()
                    .filter(|l| *l <= max)
                    .ok_or(CidrError::PrefixLenTooLong { len, max })?
            }
        };
        Cidr::new(addr, len).map_err(|e| match e {
            CidrError::HostBitsSet(_) => CidrError::HostBitsSet(s.to_owned()),
            e => e,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

impl From<IpAddr> for Cidr {
    /// The single host `ip` (`/32` or `/128`).
    fn from(ip: IpAddr) -> Self {
        let ip = ip.to_canonical();
        let len = match ip {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        Cidr { net: ip, len }
    }
}

/// `ip` with every bit after the first `len` cleared (`len` within range).
fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & m))
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & m))
        }
    }
}

/// The networks of the reverse proxies whose forwarding headers are believed.
///
/// Cheap to clone (shared). Membership is a linear scan, meant for the handful
/// of networks a deployment's proxies live in.
///
/// ```
/// use ratelimit_tower::TrustedProxies;
///
/// let proxies = TrustedProxies::parse(["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"]).unwrap();
/// assert!(proxies.contains("10.9.8.7".parse().unwrap()));
/// assert!(proxies.contains("192.0.2.7".parse().unwrap()));
/// assert!(!proxies.contains("192.0.2.8".parse().unwrap()));
///
/// // Or from one comma- or space-separated string, such as an environment variable.
/// let same: TrustedProxies = "10.0.0.0/8, 2001:db8::/32 192.0.2.7".parse().unwrap();
/// assert_eq!(same, proxies);
/// assert!(TrustedProxies::parse(["10.0.0.0/8", "10.0.0/8"]).is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    cidrs: Arc<[Cidr]>,
}

impl TrustedProxies {
    /// No trusted proxy: forwarding headers are never read.
    pub fn none() -> Self {
        TrustedProxies::default()
    }

    /// Parses each of `cidrs` as a [`Cidr`].
    ///
    /// # Errors
    ///
    /// The first [`CidrError`].
    pub fn parse<I>(cidrs: I) -> Result<Self, CidrError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        cidrs
            .into_iter()
            .map(|s| s.as_ref().parse::<Cidr>())
            .collect()
    }

    /// Whether `ip` is in one of the networks (IPv4-mapped addresses are
    /// normalised).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.cidrs.iter().any(|c| c.contains(ip))
    }

    /// The networks.
    pub fn cidrs(&self) -> &[Cidr] {
        &self.cidrs
    }

    /// Whether no network is trusted.
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty()
    }
}

impl FromIterator<Cidr> for TrustedProxies {
    fn from_iter<I: IntoIterator<Item = Cidr>>(iter: I) -> Self {
        TrustedProxies {
            cidrs: iter.into_iter().collect(),
        }
    }
}

impl From<Vec<Cidr>> for TrustedProxies {
    fn from(cidrs: Vec<Cidr>) -> Self {
        TrustedProxies {
            cidrs: cidrs.into(),
        }
    }
}

impl FromStr for TrustedProxies {
    type Err = CidrError;

    /// Networks separated by commas and/or whitespace; empty items are
    /// skipped, so `""` trusts nobody.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TrustedProxies::parse(
            s.split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty()),
        )
    }
}

/// Which forwarding header [`ClientIp`] reads from a trusted peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardingHeader {
    /// `Forwarded` if the request has at least one `Forwarded` line (even a
    /// malformed or empty one), otherwise `X-Forwarded-For`. The two are never
    /// mixed, and a malformed `Forwarded` does not fall through to
    /// `X-Forwarded-For`.
    ///
    /// Only safe when every trusted proxy appends to (or strips) whichever
    /// header is present. If your proxies only maintain `X-Forwarded-For`, a
    /// client can send its own `Forwarded`, which would then be read: choose
    /// [`XForwardedFor`](ForwardingHeader::XForwardedFor).
    #[default]
    Auto,
    /// Only `Forwarded` (RFC 7239).
    Forwarded,
    /// Only `X-Forwarded-For`.
    XForwardedFor,
}

/// The client IP behind trusted reverse proxies, as a [`KeyExtractor`].
///
/// Use [`ClientIp::peer`] when clients connect directly (nobody is trusted and
/// the key is the TCP peer, like [`PeerIp`]), and [`ClientIp::trusting`] behind
/// load balancers or reverse proxies.
///
/// # Algorithm
///
/// 1. Start from the TCP peer IP ([`PeerIp::peer_ip`]). No known peer: no key
///    ([`NoKey::NoPeerAddress`]: the layer answers `500`, a wiring mistake).
/// 2. If the peer is not a trusted proxy, it is the client; headers are not
///    read at all.
/// 3. Otherwise read one forwarding header, chosen by
///    [`header`](ClientIp::header): by default `Forwarded` (RFC 7239, its
///    `for=` parameters) if present, else `X-Forwarded-For`. Several lines of
///    the header form one list, in order.
/// 4. Walk the list right to left (the rightmost entry was added by the proxy
///    closest to us). A trusted entry is a proxy hop and is skipped; the first
///    untrusted entry is the client.
/// 5. The leftmost entry is never a proxy hop: if every entry is trusted, the
///    leftmost one is the client (a client inside a trusted network).
///
/// The walk stops at the first malformed entry, and the result is then the
/// **last trusted address**: the peer if the malformed entry is the rightmost
/// one, otherwise the trusted hop just right of it, which is the proxy that
/// handed us that entry. A value written by an untrusted party is never
/// returned in its place. The same address is returned when
/// [`max_hops`](ClientIp::max_hops) entries were all trusted proxies and more
/// remain. Malformed are:
///
/// - an empty entry (`a,,b`, an empty header line), or one that is not an IP
///   address, possibly with a port: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
///   `[2001:db8::1]`, `[2001:db8::1]:80`;
/// - non-UTF-8 bytes in the entry (other entries of the same line are still
///   read, right to left, until this one is met);
/// - obfuscated or unknown `Forwarded` nodes (`for=_hidden`, `for=unknown`),
///   `Forwarded` elements without or with several `for=`, or with bad syntax
///   (such as an unterminated quoted string);
/// - an entry over 1 KiB.
///
/// The walk also stops, at the last trusted address read, after
/// [`max_hops`](ClientIp::max_hops) entries (64 by default) or
/// [`max_header_bytes`](ClientIp::max_header_bytes) bytes (8 KiB by default,
/// read from the right). A header longer than that is read like any other: a
/// client cannot make itself keyed as its proxy by sending a long one.
///
/// `Forwarded` values should be quoted when they contain `:` or `[`
/// (`for="[2001:db8::1]:4711"`, `for="192.0.2.60:8080"`); unquoted ones are
/// accepted too, as some proxies send them. Ports are ignored. Commas inside
/// quoted strings are not supported (the element is malformed); proxies do not
/// write them in the parameters that matter here.
///
/// The work is bounded: entries are parsed lazily from the right, at most
/// [`max_hops`](ClientIp::max_hops) of them (64 by default), each at most
/// 1 KiB, so a 10,000-entry header costs no more than a 64-entry one.
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) are treated as IPv4
/// everywhere: peer, entries and trusted networks.
///
/// # Keys
///
/// The key is the client IP as text (`192.0.2.1`, `2001:db8::1`). With
/// [`ipv6_prefix`](ClientIp::ipv6_prefix), IPv6 clients are keyed by their
/// network instead (`2001:db8:1:2::/64`), since one subscriber typically holds
/// a whole /64 or /56; IPv4 clients are not masked.
///
/// # Example
///
/// ```
/// use ratelimit_tower::{ClientIp, KeyExtractor, PeerAddr, TrustedProxies};
/// use std::net::{IpAddr, SocketAddr};
///
/// # fn main() -> Result<(), ratelimit_tower::CidrError> {
/// let client_ip = ClientIp::trusting(TrustedProxies::parse(["10.0.0.0/8"])?).ipv6_prefix(64)?;
///
/// // A request that went client -> 10.0.0.2 -> 10.0.0.1 -> us, where the
/// // client made up the first entry.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert(PeerAddr(SocketAddr::from(([10, 0, 0, 1], 5000))));
/// assert_eq!(client_ip.client_ip(&req), Some(IpAddr::from([203, 0, 113, 9])));
///
/// // The same header from an untrusted peer is ignored.
/// req.extensions_mut().insert(PeerAddr(SocketAddr::from(([198, 51, 100, 1], 5000))));
/// assert_eq!(client_ip.client_ip(&req), Some(IpAddr::from([198, 51, 100, 1])));
///
/// // IPv6 clients are keyed by their /64.
/// req.extensions_mut().insert(PeerAddr("[2001:db8:1:2::99]:5000".parse().unwrap()));
/// let key = client_ip.extract(&req).unwrap();
/// assert_eq!(key.as_bytes(), b"2001:db8:1:2::/64");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: TrustedProxies,
    header: ForwardingHeader,
    max_hops: usize,
    max_header_bytes: usize,
    ipv6_prefix: Option<u8>,
}

impl Default for ClientIp {
    /// [`ClientIp::peer`].
    fn default() -> Self {
        ClientIp::peer()
    }
}

impl ClientIp {
    /// The default of [`max_hops`](ClientIp::max_hops).
    pub const DEFAULT_MAX_HOPS: usize = 64;

    /// The default of [`max_header_bytes`](ClientIp::max_header_bytes): 8 KiB.
    pub const DEFAULT_MAX_HEADER_BYTES: usize = 8 * 1024;

    /// Trusts nobody: the client is always the TCP peer.
    pub fn peer() -> Self {
        ClientIp::trusting(TrustedProxies::none())
    }

    /// Believes forwarding headers from peers (and hops) in `proxies`.
    pub fn trusting(proxies: TrustedProxies) -> Self {
        ClientIp {
            trusted: proxies,
            header: ForwardingHeader::Auto,
            max_hops: Self::DEFAULT_MAX_HOPS,
            max_header_bytes: Self::DEFAULT_MAX_HEADER_BYTES,
            ipv6_prefix: None,
        }
    }

    /// Keys IPv6 clients by their first `len` bits (commonly 64 or 56): the
    /// key is then the network, such as `2001:db8:1:2::/64`, including for
    /// `len` 128 (`2001:db8::1/128`). 0 puts every IPv6 client under one key.
    /// IPv4 clients are not masked. [`client_ip`](ClientIp::client_ip) still
    /// returns the unmasked address.
    ///
    /// # Errors
    ///
    /// [`CidrError::PrefixLenTooLong`] when `len` exceeds 128.
    pub fn ipv6_prefix(mut self, len: u8) -> Result<Self, CidrError> {
        if len > 128 {
            return Err(CidrError::PrefixLenTooLong {
                len: u32::from(len),
                max: 128,
            });
        }
        self.ipv6_prefix = Some(len);
        Ok(self)
    }

    /// Which forwarding header to read (default [`ForwardingHeader::Auto`]).
    pub fn header(mut self, header: ForwardingHeader) -> Self {
        self.header = header;
        self
    }

    /// Examines at most `n` header entries (default 64). When `n` entries were
    /// all trusted proxies and more remain, the last of them is the result.
    /// 0 never reads headers.
    pub fn max_hops(mut self, n: usize) -> Self {
        self.max_hops = n;
        self
    }

    /// Reads at most `n` bytes of the forwarding header, from the right (the
    /// entries read, with one separator each; default 8 KiB). Like
    /// [`max_hops`](ClientIp::max_hops), when the next entry would go past
    /// it, the last trusted address read is the result. A longer header is
    /// not an error: the client's address, which the nearest trusted proxy
    /// appended, is at its right end.
    pub fn max_header_bytes(mut self, n: usize) -> Self {
        self.max_header_bytes = n;
        self
    }

    /// The trusted proxies.
    pub fn trusted_proxies(&self) -> &TrustedProxies {
        &self.trusted
    }

    /// The client IP of `req` (unmasked; see the [algorithm](ClientIp#algorithm)),
    /// or `None` when the TCP peer is unknown.
    pub fn client_ip<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        let peer = PeerIp::peer_ip(req)?.to_canonical();
        if !self.trusted.contains(peer) {
            return Some(peer);
        }
        Some(self.resolve(req.headers(), peer))
    }

    /// The walk from a trusted `peer`.
    fn resolve(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        let name = match self.header {
            ForwardingHeader::Forwarded => FORWARDED,
            ForwardingHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardingHeader::Auto if headers.contains_key(FORWARDED) => FORWARDED,
            ForwardingHeader::Auto => X_FORWARDED_FOR,
        };
        // No early exit for a long header: the walk reads from the right and
        // is bounded (`max_hops`, `max_header_bytes`, an entry's 1 KiB), and
        // the entries a trusted proxy appended are the last ones. Falling
        // back to the peer would key every client behind that proxy as one.
        let forwarded = name == FORWARDED;
        // Bytes read so far, each entry with its separator.
        let mut read = 0usize;
        let mut entries = Entries {
            lines: headers.get_all(&name).iter().rev(),
            line: None,
            done: false,
        };
        let mut last_trusted = peer;
        for _ in 0..self.max_hops {
            // At the end of the list, every entry was trusted: `last_trusted`
            // is the leftmost one, the client.
            let Some(entry) = entries.next() else {
                break;
            };
            read = read.saturating_add(match entry {
                Entry::Text(text) => text.len().saturating_add(1),
                Entry::TooLong => MAX_ENTRY_BYTES,
            });
            if read > self.max_header_bytes.saturating_add(1) {
                // Past the budget, as past `max_hops`: the last trusted hop.
                return last_trusted;
            }
            let ip = match entry {
                Entry::Text(text) if forwarded => parse_forwarded_element(text),
                Entry::Text(text) => parse_node(text.trim_ascii()),
                Entry::TooLong => None,
            };
            let Some(ip) = ip else {
                return last_trusted;
            };
            if !self.trusted.contains(ip) {
                return ip;
            }
            last_trusted = ip;
        }
        last_trusted
    }

    fn key(&self, ip: IpAddr) -> Key {
        match (ip, self.ipv6_prefix) {
            (IpAddr::V6(_), Some(len)) => Key::from(format!("{}/{len}", mask(ip, len))),
            _ => Key::from(ip),
        }
    }
}

impl<B> KeyExtractor<Request<B>> for ClientIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        self.client_ip(req).map(|ip| self.key(ip))
    }

    /// No TCP peer is a wiring mistake, as for [`PeerIp`]: `500`.
    fn try_extract(&self, req: &Request<B>) -> Result<Key, NoKey> {
        self.extract(req).ok_or(NoKey::NoPeerAddress)
    }
}

/// One list entry, right to left.
enum Entry<'a> {
    Text(&'a [u8]),
    /// No separator within [`MAX_ENTRY_BYTES`]: malformed.
    TooLong,
}

/// The comma-separated entries of header lines, last line first, each line
/// split from the right; scans at most [`MAX_ENTRY_BYTES`] per entry.
struct Entries<'a> {
    lines: std::iter::Rev<ValueIter<'a, HeaderValue>>,
    /// What is left of the current line, `None` once it is consumed.
    line: Option<&'a [u8]>,
    /// Set after [`Entry::TooLong`]: nothing left of it is read.
    done: bool,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.done {
            return None;
        }
        let rest = match self.line.take() {
            Some(rest) => rest,
            None => self.lines.next()?.as_bytes(),
        };
        let start = rest.len().saturating_sub(MAX_ENTRY_BYTES + 1);
        match rest[start..].iter().rposition(|&b| b == b',') {
            Some(i) => {
                let comma = start + i;
                self.line = Some(&rest[..comma]);
                Some(Entry::Text(&rest[comma + 1..]))
            }
            None if start == 0 => Some(Entry::Text(rest)),
            None => {
                self.done = true;
                Some(Entry::TooLong)
            }
        }
    }
}

/// An `X-Forwarded-For` entry or a `Forwarded` node: an IP address, an IPv4
/// address with a port, or a bracketed IPv6 address with an optional port.
/// Unbracketed IPv6 is accepted when it parses whole. `unknown` and
/// obfuscated identifiers (`_hidden`) are not addresses.
fn parse_node(s: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(s).ok()?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        (IpAddr::V6(host.parse::<Ipv6Addr>().ok()?), port)
    } else {
        let (host, port) = s.split_once(':')?;
        (IpAddr::V4(host.parse::<Ipv4Addr>().ok()?), Some(port))
    };
    if let Some(port) = port {
        valid_port(port).then_some(())?;
    }
    Some(host.to_canonical())
}

/// A decimal port, or an RFC 7239 obfuscated one (`_abc`); ports are ignored.
fn valid_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obf) => {
            !obf.is_empty()
                && obf
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok()
        }
    }
}

/// RFC 7230 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The `for=` address of one `Forwarded` element (`for=a;proto=https;by=b`).
///
/// Pairs are `token=token` or `token="quoted string"`, separated by `;` with
/// optional whitespace. Unquoted values may also hold `:`, `[` and `]` (for
/// unquoted ports and IPv6, which RFC 7239 forbids but some proxies send).
/// Exactly one `for` parameter (case-insensitive); its quoted value may not
/// use backslash escapes.
fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
    let b = element;
    let mut i = 0;
    let mut found: Option<&[u8]> = None;
    let skip_ows = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t') {
            *i += 1;
        }
    };
    loop {
        skip_ows(&mut i);
        if i == b.len() {
            break;
        }
        if b[i] == b';' {
            i += 1;
            continue;
        }
        let name_start = i;
        while i < b.len() && is_tchar(b[i]) {
            i += 1;
        }
        let name = &b[name_start..i];
        if name.is_empty() || b.get(i) != Some(&b'=') {
            return None;
        }
        i += 1;
        let value = if b.get(i) == Some(&b'"') {
            i += 1;
            let value_start = i;
            let mut escaped = false;
            loop {
                match *b.get(i)? {
                    b'"' => break,
                    b'\\' => {
                        escaped = true;
                        i += 1;
                        // quoted-pair: HTAB, SP, VCHAR or obs-text
                        match *b.get(i)? {
                            b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                            _ => return None,
                        }
                    }
                    b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => {}
                    _ => return None,
                }
                i += 1;
            }
            let value = &b[value_start..i];
            i += 1; // closing quote
            if escaped && name.eq_ignore_ascii_case(b"for") {
                return None;
            }
            value
        } else {
            let value_start = i;
            while i < b.len() && (is_tchar(b[i]) || matches!(b[i], b':' | b'[' | b']')) {
                i += 1;
            }
            if value_start == i {
                return None;
            }
            &b[value_start..i]
        };
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None;
            }
            found = Some(value);
        }
        skip_ows(&mut i);
        if i < b.len() && b[i] != b';' {
            return None;
        }
    }
    parse_node(found?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_elements() {
        let cases: &[(&str, Option<&str>)] = &[
            ("for=192.0.2.60", Some("192.0.2.60")),
            (
                "For=\"[2001:db8:cafe::17]:4711\"",
                Some("2001:db8:cafe::17"),
            ),
            (
                "for=\"192.0.2.60:8080\";proto=http;by=203.0.113.43",
                Some("192.0.2.60"),
            ),
            (" proto=https ; for=192.0.2.60 ", Some("192.0.2.60")),
            ("for=192.0.2.60:8080", Some("192.0.2.60")),
            ("for=[2001:db8::1]", Some("2001:db8::1")),
            ("for=\"::ffff:10.0.0.1\"", Some("10.0.0.1")),
            ("for=\"[2001:db8::1]:_port\"", Some("2001:db8::1")),
            ("for=_hidden", None),
            ("for=unknown", None),
            ("for=\"_gazonk\"", None),
            ("proto=https", None),
            ("", None),
            ("for=1.2.3.4;for=5.6.7.8", None),
            ("for=\"1.2.3.4", None),
            ("for=\"1.2.\\3.4\"", None),
            ("for=1.2.3.4 x", None),
            ("for=", None),
            ("=1.2.3.4", None),
            ("for=1.2.3.4:99999", None),
            ("host=\"a;b\";for=1.2.3.4", Some("1.2.3.4")),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_forwarded_element(input.as_bytes()),
                want.map(ip),
                "{input:?}"
            );
        }
    }

    #[test]
    fn masks() {
        assert_eq!(mask(ip("2001:db8:1:2:3:4:5:6"), 64), ip("2001:db8:1:2::"));
        assert_eq!(mask(ip("2001:db8:1:2ff::"), 56), ip("2001:db8:1:200::"));
        assert_eq!(mask(ip("1.2.3.4"), 0), ip("0.0.0.0"));
        assert_eq!(mask(ip("1.2.3.4"), 32), ip("1.2.3.4"));
        assert_eq!(mask(ip("::1"), 0), ip("::"));
    }
}

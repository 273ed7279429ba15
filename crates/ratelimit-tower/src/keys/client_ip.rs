//! The client IP behind trusted reverse proxies: [`ClientIp`].
//!
//! Forwarding headers (`Forwarded`, `X-Forwarded-For`) are written by whoever
//! sent the request, so they are only believed as far as a chain of trusted
//! proxies vouches for them. See [`ClientIp`] for the exact algorithm.

use std::net::IpAddr;

use http::header::FORWARDED;
use http::{HeaderMap, HeaderName, Request};

use super::cidr::CidrError;
use super::forwarded::{Entries, Entry, MAX_ENTRY_BYTES, parse_forwarded_element, parse_node};
use super::key::{Key, KeyExtractor, NoKey, PeerIp, checked_ipv6_prefix, ip_key};
use super::trusted_proxies::TrustedProxies;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Which forwarding header [`ClientIp`] reads from a trusted peer: the one
/// your trusted proxies write.
///
/// There is no default, and no "whichever is present": a proxy appends to
/// the header it maintains and passes any other through as the client wrote
/// it. Behind nginx's `proxy_add_x_forwarded_for` or an AWS Application Load
/// Balancer, both of which append to `X-Forwarded-For` and leave `Forwarded`
/// alone, a reader that preferred `Forwarded` when present would let every
/// client pick its own key (a fresh budget per request) or spend a victim's.
/// So name the header the proxy nearest to you maintains; the other one is
/// never read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardingHeader {
    /// Only `Forwarded` (RFC 7239), for proxies that append to it (such as
    /// Envoy or HAProxy configured to write it). `X-Forwarded-For` is ignored.
    Forwarded,
    /// Only `X-Forwarded-For`, for proxies that append to it (nginx's
    /// `proxy_add_x_forwarded_for`, AWS ALB, most CDNs and ingress
    /// controllers). `Forwarded` is ignored.
    XForwardedFor,
}

/// The client IP behind trusted reverse proxies, as a [`KeyExtractor`].
///
/// Use [`ClientIp::trusting`] behind load balancers or reverse proxies. When
/// clients connect directly, use [`PeerIp`](struct@crate::PeerIp) (which
/// keys IPv6 peers by their /64), or [`ClientIp::peer`]: nobody is trusted
/// and the key is the TCP peer, an IPv6 one by its /64 too.
///
/// # Algorithm
///
/// 1. Start from the TCP peer IP ([`PeerIp::peer_ip`]). No known peer: no key
///    ([`NoKey::NoPeerAddress`]: the layer answers `500`, a wiring mistake).
/// 2. If the peer is not a trusted proxy, it is the client; headers are not
///    read at all.
/// 3. Otherwise read the one forwarding header named in
///    [`trusting`](ClientIp::trusting) (see [`ForwardingHeader`]):
///    `Forwarded` (RFC 7239, its `for=` parameters) or `X-Forwarded-For`.
///    The other is never read. Several lines of the header form one list, in
///    order.
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
/// The key is the client IP as text (`192.0.2.1`), an IPv6 client's by its
/// network (`2001:db8:1:2::/64`), as [`PeerIp`](struct@crate::PeerIp) keys
/// it: one subscriber typically holds a whole /64 or /56, and would
/// otherwise earn a budget per address. [`ipv6_prefix`](ClientIp::ipv6_prefix)
/// sets another length (128 keys each address); IPv4 clients are not masked.
///
/// # Example
///
/// ```
/// use ratelimit_tower::{ClientIp, ForwardingHeader, KeyExtractor, PeerAddr, TrustedProxies};
/// use std::net::{IpAddr, SocketAddr};
///
/// # fn main() -> Result<(), ratelimit_tower::CidrError> {
/// // Proxies in 10.0.0.0/8 that append to X-Forwarded-For (nginx, AWS ALB).
/// let proxies = TrustedProxies::parse(["10.0.0.0/8"])?;
/// let client_ip = ClientIp::trusting(proxies, ForwardingHeader::XForwardedFor);
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
/// // A `Forwarded` header the proxy passed through untouched is not read.
/// req.headers_mut().insert("forwarded", "for=6.6.6.6".parse().unwrap());
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
    /// The default of [`ipv6_prefix`](ClientIp::ipv6_prefix): an IPv6
    /// client is keyed by its /64.
    pub const DEFAULT_IPV6_PREFIX: u8 = 64;

    /// The default of [`max_hops`](ClientIp::max_hops).
    pub const DEFAULT_MAX_HOPS: usize = 64;

    /// The default of [`max_header_bytes`](ClientIp::max_header_bytes): 8 KiB.
    pub const DEFAULT_MAX_HEADER_BYTES: usize = 8 * 1024;

    /// Trusts nobody: the client is always the TCP peer, and no header is
    /// read.
    pub fn peer() -> Self {
        // The header is never read without trusted proxies.
        ClientIp::trusting(TrustedProxies::none(), ForwardingHeader::XForwardedFor)
    }

    /// Believes `header`, the forwarding header the proxies in `proxies`
    /// write, from peers (and hops) in `proxies`. Name the header your
    /// proxies append to: the other one is never read (see
    /// [`ForwardingHeader`]).
    pub fn trusting(proxies: TrustedProxies, header: ForwardingHeader) -> Self {
        ClientIp {
            trusted: proxies,
            header,
            max_hops: Self::DEFAULT_MAX_HOPS,
            max_header_bytes: Self::DEFAULT_MAX_HEADER_BYTES,
            ipv6_prefix: Some(Self::DEFAULT_IPV6_PREFIX),
        }
    }

    /// Keys IPv6 clients by their first `len` bits (64 by default, commonly
    /// 56 too): the key is the network, such as `2001:db8:1:2::/64`,
    /// including for `len` 128 (`2001:db8::1/128`). 0 puts every IPv6 client under one key.
    /// IPv4 clients are not masked. [`client_ip`](ClientIp::client_ip) still
    /// returns the unmasked address.
    ///
    /// # Errors
    ///
    /// [`CidrError::PrefixLenTooLong`] when `len` exceeds 128.
    pub fn ipv6_prefix(mut self, len: u8) -> Result<Self, CidrError> {
        self.ipv6_prefix = Some(checked_ipv6_prefix(len)?);
        Ok(self)
    }

    /// Reads `header` instead of the one given to
    /// [`trusting`](ClientIp::trusting).
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
        };
        // No early exit for a long header: the walk reads from the right and
        // is bounded (`max_hops`, `max_header_bytes`, an entry's 1 KiB), and
        // the entries a trusted proxy appended are the last ones. Falling
        // back to the peer would key every client behind that proxy as one.
        let forwarded = name == FORWARDED;
        // Bytes read so far, each entry with its separator.
        let mut read = 0usize;
        let mut entries = Entries::new(headers.get_all(&name).iter());
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
        ip_key(ip, self.ipv6_prefix)
    }
}

fallback_or!(ClientIp);

impl<B> KeyExtractor<Request<B>> for ClientIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        self.client_ip(req).map(|ip| self.key(ip))
    }

    /// No TCP peer is a wiring mistake, as for [`PeerIp`](struct@crate::PeerIp): `500`.
    fn try_extract(&self, req: &Request<B>) -> Result<Key, NoKey> {
        self.extract(req).ok_or(NoKey::NoPeerAddress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_keys_are_the_masked_network() {
        let cases: &[(u8, &str, &str)] = &[
            (64, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
            (56, "2001:db8:1:2ff::", "2001:db8:1:200::/56"),
            (128, "2001:db8::1", "2001:db8::1/128"),
            (0, "2001:db8::1", "::/0"),
            (64, "192.0.2.1", "192.0.2.1"),
        ];
        for &(len, ip, want) in cases {
            let client_ip = ClientIp::peer().ipv6_prefix(len).unwrap();
            let key = client_ip.key(ip.parse().unwrap());
            assert_eq!(key.as_bytes(), want.as_bytes(), "{ip}/{len}");
        }
    }
}

//! How many public addresses `[client_ip] trusted_proxies` trust: a client
//! at any of them may write its own address in the forwarding header, a
//! fresh budget per request, so a list that trusts more public addresses
//! than any proxy fleet has is a mistake, and refused.

use ipnet::IpNet;

use super::{ConfigError, ConfigErrorKind};
use crate::keys::Cidr;

/// The most public IPv4 addresses trusted: a `/8`'s worth. A CDN's
/// published ranges hold far fewer; more is a whole cloud, or the internet.
const MOST_PUBLIC_IPV4: u128 = 1 << 24;

/// The most public IPv6 addresses trusted: a `/16`'s worth (providers'
/// blocks are `/29` to `/48`); `2000::/3`, every global address, is more.
const MOST_PUBLIC_IPV6: u128 = 1 << 112;

/// IPv4 networks no client on the internet connects from: "this network",
/// private, shared (carrier-grade NAT), loopback, link-local, multicast
/// and reserved.
const NOT_PUBLIC_IPV4: [([u8; 4], u8); 8] = [
    ([0, 0, 0, 0], 8),
    ([10, 0, 0, 0], 8),
    ([100, 64, 0, 0], 10),
    ([127, 0, 0, 0], 8),
    ([169, 254, 0, 0], 16),
    ([172, 16, 0, 0], 12),
    ([192, 168, 0, 0], 16),
    ([224, 0, 0, 0], 3),
];

/// The same for IPv6: the reserved `::/8` (loopback; the ranges that
/// carry IPv4 addresses are counted as IPv4, see [`CARRY_IPV4`]), unique
/// local, link-local and multicast.
const NOT_PUBLIC_IPV6: [(u128, u8); 4] = [
    (0, 8),
    (0xfc00 << 112, 7),
    (0xfe80 << 112, 10),
    (0xff00 << 112, 8),
];

/// The IPv6 ranges whose peers are IPv4 clients, each with where the
/// client's IPv4 address lies in a peer's address: IPv4-mapped addresses
/// (`::ffff:0:0/96`), NAT64's well-known and local-use prefixes
/// (`64:ff9b::/96`, RFC 6052; any `/96` in `64:ff9b:1::/48`, RFC 8215),
/// behind which every IPv4 client connects from `64:ff9b::a.b.c.d`, in its
/// last 32 bits; 6to4 (`2002::/16`: `2002:a.b.c.d::/48`), after the first
/// 16; Teredo (`2001::/32`), in the last 32, inverted.
const CARRY_IPV4: [Carrier; 5] = [
    Carrier::last_bits(0xffff << 32, 96),
    Carrier::last_bits(0x0064_ff9b << 96, 96),
    Carrier::last_bits(0x0064_ff9b_0001 << 80, 48),
    Carrier {
        first: 0x2002 << 112,
        len: 16,
        shift: 80,
        inverted: false,
    },
    Carrier {
        first: 0x2001 << 112,
        len: 32,
        shift: 0,
        inverted: true,
    },
];

/// An IPv6 range carrying IPv4 clients: the range (`first`, `len`), and
/// the IPv4 address in a peer's, `shift` bits from the end (`inverted`:
/// each bit flipped, as Teredo writes it).
struct Carrier {
    first: u128,
    len: u8,
    shift: u8,
    inverted: bool,
}

impl Carrier {
    const fn last_bits(first: u128, len: u8) -> Carrier {
        Carrier {
            first,
            len,
            shift: 0,
            inverted: false,
        }
    }

    /// The IPv4 addresses the IPv6 addresses `first..=last` carry, as one
    /// range (all of them, where the range spans more than one run of the
    /// IPv4 field).
    fn carried(&self, first: u128, last: u128) -> Option<(u128, u128)> {
        let end = self.first + ((1 << (128 - self.len)) - 1);
        let (from, to) = (first.max(self.first), last.min(end));
        if from > to {
            return None;
        }
        let field = |address: u128| (address >> self.shift) & u128::from(u32::MAX);
        let above = |address: u128| address >> self.shift >> 32;
        if above(from) != above(to) || to - from >= (u128::from(u32::MAX) << self.shift) {
            return Some((0, u128::from(u32::MAX)));
        }
        let (low, high) = (field(from), field(to));
        Some(if self.inverted {
            (u128::from(u32::MAX) - high, u128::from(u32::MAX) - low)
        } else {
            (low, high)
        })
    }
}

/// Refuses `trusted` when one network, or all of them together, trust more
/// public addresses than [`MOST_PUBLIC_IPV4`] or [`MOST_PUBLIC_IPV6`],
/// naming the network, or the list.
pub(super) fn check(trusted: &[Cidr]) -> Result<(), ConfigError> {
    let refuse = |path: String, what: String, family: &str| {
        ConfigError::new(
            ConfigErrorKind::Parse,
            path,
            format!(
                "{what} more public {family} addresses than any proxy fleet has: every client \
                 there would be a trusted proxy and could write its own address in the header, \
                 a fresh budget per request; name your proxies' own networks"
            ),
        )
    };
    for (index, cidr) in trusted.iter().enumerate() {
        if let Some(family) = too_many([*cidr]) {
            let path = format!("client_ip.trusted_proxies[{index}]");
            return Err(refuse(path, format!("{cidr} holds"), family));
        }
    }
    match too_many(trusted.iter().copied()) {
        Some(family) => Err(refuse(
            String::from("client_ip.trusted_proxies"),
            String::from("together, these networks hold"),
            family,
        )),
        None => Ok(()),
    }
}

/// The family of which `nets` together trust too many public addresses,
/// if one (an IPv6 network holding a range of [`CARRY_IPV4`] trusts the
/// IPv4 clients it carries).
fn too_many(nets: impl IntoIterator<Item = Cidr>) -> Option<&'static str> {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for cidr in nets {
        match IpNet::from(cidr) {
            IpNet::V4(net) => v4.push((
                u128::from(u32::from(net.network())),
                u128::from(u32::from(net.broadcast())),
            )),
            IpNet::V6(net) => {
                let (first, last) = (u128::from(net.network()), u128::from(net.broadcast()));
                v4.extend(CARRY_IPV4.iter().filter_map(|c| c.carried(first, last)));
                v6.push((first, last));
            }
        }
    }
    let not_public_v4 = NOT_PUBLIC_IPV4.map(|(octets, len)| {
        let first = u128::from(u32::from_be_bytes(octets));
        (first, first + (1 << (32 - len)) - 1)
    });
    let not_public_v6 =
        NOT_PUBLIC_IPV6.map(|(first, len)| (first, first + ((1 << (128 - len)) - 1)));
    if public(v4, &not_public_v4) > MOST_PUBLIC_IPV4 {
        Some("IPv4")
    } else if public(v6, &not_public_v6) > MOST_PUBLIC_IPV6 {
        Some("IPv6")
    } else {
        None
    }
}

/// How many addresses `ranges` (first and last, inclusive) hold together,
/// leaving out those in `not_public` (disjoint ranges); saturating.
fn public(mut ranges: Vec<(u128, u128)>, not_public: &[(u128, u128)]) -> u128 {
    ranges.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::new();
    for (first, last) in ranges {
        match merged.last_mut() {
            Some((_, end)) if first <= end.saturating_add(1) => *end = (*end).max(last),
            _ => merged.push((first, last)),
        }
    }
    let size = |(first, last): (u128, u128)| (last - first).saturating_add(1);
    merged.iter().fold(0u128, |count, &(first, last)| {
        let inside = not_public.iter().fold(0u128, |inside, &(low, high)| {
            let (from, to) = (first.max(low), last.min(high));
            if from <= to {
                inside.saturating_add(size((from, to)))
            } else {
                inside
            }
        });
        count.saturating_add(size((first, last)) - inside)
    })
}

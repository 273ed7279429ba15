//! One IPv4 or IPv6 network, parsed strictly: [`Cidr`].

use std::error::Error;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net};

/// Why a CIDR block (or a prefix length) was rejected.
///
/// Returned by [`Cidr::from_str`], [`Cidr::new`], [`TrustedProxies::parse`](crate::TrustedProxies::parse)
/// and [`ClientIp::ipv6_prefix`](crate::ClientIp::ipv6_prefix).
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
/// A thin wrapper of [`ipnet::IpNet`] (convert with [`From`] and
/// [`TryFrom`]) that adds what a trust list needs and `IpNet` does not do:
/// a bare address is a single host (`/32` or `/128`); host bits set after the
/// prefix (`10.0.0.1/8`) are an error rather than silently kept, since a typo
/// in a trust list should fail loudly; IPv4-mapped IPv6 networks
/// (`::ffff:10.0.0.0/104`) are stored as the IPv4 network (`10.0.0.0/8`), and
/// [`contains`](Cidr::contains) matches IPv4 addresses against IPv6 networks
/// through their mapped form, so `::/0` contains every address. Parsed with
/// [`str::parse`]; surrounding whitespace is ignored.
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
pub struct Cidr(IpNet);

impl Cidr {
    /// The network `addr/len`.
    ///
    /// # Errors
    ///
    /// [`CidrError::PrefixLenTooLong`] when `len` exceeds 32 (IPv4) or 128
    /// (IPv6), [`CidrError::HostBitsSet`] when `addr` has bits set after the
    /// prefix.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, CidrError> {
        let net = IpNet::new(addr, len).map_err(|_| CidrError::PrefixLenTooLong {
            len: u32::from(len),
            max: max_prefix_len(addr),
        })?;
        if net.trunc() != net {
            return Err(CidrError::HostBitsSet(format!("{addr}/{len}")));
        }
        Ok(Cidr(canonical(net)))
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.0.network()
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether `ip` is in this network (IPv4-mapped addresses are normalised).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.0, ip.to_canonical()) {
            (IpNet::V6(net), IpAddr::V4(v4)) => net.contains(&v4.to_ipv6_mapped()),
            (net, ip) => net.contains(&ip),
        }
    }
}

/// The longest prefix of `addr`'s family: 32 or 128.
fn max_prefix_len(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// An IPv4-mapped IPv6 network as the IPv4 network it maps.
fn canonical(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let Some(v4) = v6.network().to_ipv4_mapped()
        && let Some(len) = v6.prefix_len().checked_sub(96)
        && let Ok(v4) = Ipv4Net::new(v4, len)
    {
        return IpNet::V4(v4);
    }
    net
}

impl FromStr for Cidr {
    type Err = CidrError;

    // `IpNet`'s own parser is not used: it requires a prefix, accepts host
    // bits, and its one error cannot say which part is wrong.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::InvalidAddress(s.to_owned()))?;
        let max = max_prefix_len(addr);
        let len = match len {
            None => max,
            Some(len) => {
                if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(CidrError::InvalidPrefixLen(len.to_owned()));
                }
                let len: u32 = len
                    .parse()
                    .map_err(|_| CidrError::InvalidPrefixLen(len.to_owned()))?;
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
        self.0.fmt(f)
    }
}

impl From<IpAddr> for Cidr {
    /// The single host `ip` (`/32` or `/128`).
    fn from(ip: IpAddr) -> Self {
        Cidr(IpNet::from(ip.to_canonical()))
    }
}

impl From<Cidr> for IpNet {
    fn from(cidr: Cidr) -> Self {
        cidr.0
    }
}

impl TryFrom<IpNet> for Cidr {
    type Error = CidrError;

    /// The same network, refused when host bits are set after its prefix.
    fn try_from(net: IpNet) -> Result<Self, Self::Error> {
        Cidr::new(net.addr(), net.prefix_len())
    }
}

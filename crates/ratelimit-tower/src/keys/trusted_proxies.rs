//! The networks whose forwarding headers are believed: [`TrustedProxies`].

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use super::cidr::{Cidr, CidrError};

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

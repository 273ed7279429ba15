//! Keys: which bucket a request draws from.
//!
//! - `key`: the [`Key`] type, the [`KeyExtractor`] trait and the simple
//!   extractors (peer IP, a header, the route, a global key, two keys in one);
//! - `client_ip`: the client IP behind trusted reverse proxies
//!   ([`ClientIp`]), built from
//! - `cidr`: one network ([`Cidr`], a strict wrapper of [`ipnet::IpNet`]),
//! - `trusted_proxies`: the networks whose forwarding headers are believed
//!   ([`TrustedProxies`]),
//! - `forwarded`: the right-to-left, bounded reader of `Forwarded` and
//!   `X-Forwarded-For`.

mod cidr;
mod client_ip;
mod forwarded;
mod key;
mod trusted_proxies;

pub use cidr::{Cidr, CidrError};
pub use client_ip::{ClientIp, ForwardingHeader};
pub use key::{
    Composite, GlobalKey, HeaderKey, Key, KeyExtractor, NoKey, PeerAddr, PeerIp, RouteKey,
};
pub use trusted_proxies::TrustedProxies;

pub(crate) use key::join as join_keys;

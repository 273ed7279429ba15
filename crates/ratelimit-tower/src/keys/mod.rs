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

/// An inherent `or` (see [`Fallback`]) for each of this crate's extractors.
/// Not a method of [`KeyExtractor`]: that trait is generic over the request
/// type, which the call would then have to name.
macro_rules! fallback_or {
    ($($ty:ident),+) => {
        $(fallback_or!(<> $ty<>);)+
    };
    (<$($param:ident),*> $ty:ident<$($arg:ident),*>) => {
        impl<$($param),*> $ty<$($arg),*> {
            /// This key, or `other`'s for requests this one finds none for
            /// ([`Fallback`](crate::Fallback)).
            ///
            /// A key the client chooses, such as a header's value, does not
            /// limit a client that sends a new one with every request: each
            /// value is a new budget (see [`HeaderKey`](crate::HeaderKey#a-key-the-client-chooses)).
            /// `HeaderKey::from_static("x-api-key").or(PeerIp)` alone limits
            /// only the clients that send no key, or always the same one.
            /// Unless the service checks the key, add a rule on the client IP
            /// beside it, all or nothing:
            ///
            /// ```
            /// use ratelimit_tower::{HeaderKey, MemoryStore, PeerIp, Policy, RateLimitLayer, Rule};
            /// use std::time::Duration;
            ///
            /// let per_ip = Policy::fixed_window(100, Duration::from_secs(60))?.with_name("per-ip")?;
            /// let per_key = Policy::fixed_window(100, Duration::from_secs(60))?.with_name("per-key")?;
            /// // Per API key (requests without one, per client IP), and per
            /// // client IP whatever key a request sends.
            /// let layer = RateLimitLayer::new(MemoryStore::new(), per_ip, PeerIp)
            ///     .and(Rule::new(per_key, HeaderKey::from_static("x-api-key").or(PeerIp)));
            /// # let _ = layer;
            /// # Ok::<(), ratelimit_tower::PolicyError>(())
            /// ```
            pub fn or<Other>(self, other: Other) -> $crate::Fallback<Self, Other> {
                $crate::Fallback::new(self, other)
            }
        }
    };
}

mod cidr;
mod client_ip;
mod forwarded;
mod key;
mod trusted_proxies;

pub use cidr::{Cidr, CidrError};
pub use client_ip::{ClientIp, ForwardingHeader};
pub use key::{
    Composite, Fallback, GlobalKey, HeaderKey, Key, KeyExtractor, NoKey, PeerAddr, PeerIp, RouteKey,
};
pub use trusted_proxies::TrustedProxies;

#[cfg(feature = "config")]
pub(crate) use key::join as join_keys;

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
            /// ```
            /// use ratelimit_tower::{HeaderKey, PeerIp};
            ///
            /// // Per API key; requests without one, per client IP.
            /// let key = HeaderKey::from_static("x-api-key").or(PeerIp);
            /// # let _ = key;
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

//! How user keys become store keys.
//!
//! A user key (an IP address, an API key, a tenant id) is kept as it is when it
//! is short and plainly printable; otherwise it is replaced by a hash, so a
//! stored key is bounded in size and never echoes raw secrets or control bytes.
//! Redis keys take the form `<prefix>:<policy>:{<key>}`: the braces are a Redis
//! Cluster hash tag, so every key a script touches for one user key lives in one
//! slot.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest, Sha256};

/// The longest user key kept verbatim, in bytes.
pub(crate) const MAX_VERBATIM_KEY_LEN: usize = 64;

/// The prefix of a hashed key. Verbatim keys never start with it, so a client
/// cannot forge a key that collides with the hashed form of another.
pub(crate) const HASHED_KEY_MARKER: u8 = b'#';

/// Returns the form of `key` that stores use: `key` itself when it is 1 to
/// 64 bytes of printable ASCII without `{`, `}` and does not start with `#`;
/// otherwise `#` followed by 32 hex digits of its SHA-256 ([`hashed`]). A
/// verbatim key never starts with `#`, so a client cannot forge a key that
/// collides with the hashed form of another.
///
/// ```
/// use ratelimit_core::key::normalize;
///
/// assert_eq!(&*normalize(b"203.0.113.7"), b"203.0.113.7");
/// let long = vec![b'a'; 1 << 20];
/// assert_eq!(normalize(&long).len(), 33);
/// assert_eq!(normalize(b"{tag}")[0], b'#');
/// ```
pub fn normalize(key: &[u8]) -> Cow<'_, [u8]> {
    if is_verbatim(key) {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(hashed(key))
    }
}

/// Whether [`normalize`] keeps `key` as it is.
pub(crate) fn is_verbatim(key: &[u8]) -> bool {
    !key.is_empty()
        && key.len() <= MAX_VERBATIM_KEY_LEN
        && key[0] != HASHED_KEY_MARKER
        && key
            .iter()
            .all(|&b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
}

/// The length of a hashed key ([`hashed`]): `#` and 32 hex digits.
pub(crate) const HASHED_KEY_LEN: usize = 33;

/// `#` and 32 lowercase hex digits: the first 128 bits of the SHA-256 of `key`.
pub fn hashed(key: &[u8]) -> Vec<u8> {
    hashed_array(key).to_vec()
}

/// [`hashed`] without a heap allocation.
pub(crate) fn hashed_array(key: &[u8]) -> [u8; HASHED_KEY_LEN] {
    hashed_parts(&[key])
}

/// [`hashed`] of the parts written one after the other, without joining
/// them first.
// Not API: `ratelimit-tower`'s `Key` hashes every value with it, without a heap allocation.
#[doc(hidden)]
pub fn hashed_parts(parts: &[&[u8]]) -> [u8; HASHED_KEY_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut out = [HASHED_KEY_MARKER; HASHED_KEY_LEN];
    for (pair, byte) in out[1..].chunks_exact_mut(2).zip(&digest[..16]) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
    out
}

/// Each byte value's decimal digits and a dot after them, little-endian in
/// the low 32 bits, and how many bits those take (16, 24 or 32) above.
const OCTET_TEXT: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut n = 0;
    while n < 256 {
        // `n` is below 256.
        #[allow(clippy::cast_possible_truncation)]
        let byte = n as u8;
        let (hundreds, tens, ones) = (byte / 100, byte / 10 % 10, byte % 10);
        let digits: [u8; 4] = if byte >= 100 {
            [b'0' + hundreds, b'0' + tens, b'0' + ones, b'.']
        } else if byte >= 10 {
            [b'0' + tens, b'0' + ones, b'.', 0]
        } else {
            [b'0' + ones, b'.', 0, 0]
        };
        let bits: u64 = if byte >= 100 {
            32
        } else if byte >= 10 {
            24
        } else {
            16
        };
        table[n] = u32::from_le_bytes(digits) as u64 | bits << 32;
        n += 1;
    }
    table
};

/// The longest text of an IP address (`INET6_ADDRSTRLEN` without its NUL):
/// `ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`.
// Not API: `ratelimit-tower`'s `Key` sizes its inline buffer by it.
#[doc(hidden)]
pub const MAX_IP_TEXT_LEN: usize = 45;

/// An IP address written as text, exactly as its `Display` (`to_string`)
/// writes it, held on the stack: the key of a client IP with no heap
/// allocation. IPv4, the common case, is written from a table of each
/// octet's digits (no `fmt` machinery on the hot path); IPv6 through
/// `Display`.
///
/// ```
/// use ratelimit_core::key::IpText;
/// use std::net::IpAddr;
///
/// let ip: IpAddr = "203.0.113.7".parse()?;
/// assert_eq!(IpText::new(ip).as_bytes(), b"203.0.113.7");
/// let ip: IpAddr = "2001:db8::1".parse()?;
/// assert_eq!(IpText::new(ip).as_str(), "2001:db8::1");
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
// The bytes first and 8-aligned: IPv4 text is written by two aligned 8-byte
// stores that the memory store's packing of a short key reads straight back
// with loads inside each half (see `memory::keys::pack_short`).
//
// Not API: `ratelimit-tower`'s IP keys write the address with it.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
#[doc(hidden)]
pub struct IpText {
    bytes: [u8; MAX_IP_TEXT_LEN],
    len: u8,
}

impl IpText {
    /// The text of `ip`.
    #[inline]
    pub fn new(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::v4(v4),
            IpAddr::V6(v6) => Self::v6(v6),
        }
    }

    #[inline]
    fn v4(ip: Ipv4Addr) -> Self {
        // The text is built in two registers and stored once, straight into
        // the value returned: byte-wise stores, or a copy of the value, read
        // back by the wider loads of the key's packing and compare stall
        // store forwarding, which would cost more than the rest. Each octet
        // is its digits and a dot from the table; two octets make at most 8
        // bytes, so the halves are put together with 64-bit shifts only.
        fn text(entry: u64) -> u64 {
            entry & 0xffff_ffff
        }
        fn bits(entry: u64) -> u64 {
            entry >> 32
        }
        let [a, b, c, d] = ip.octets().map(|octet| OCTET_TEXT[usize::from(octet)]);
        // "a.b." (32 to 64 bits) and "c.d" (the last dot cut: at most 56).
        let first = text(a) | text(b) << bits(a);
        let first_bits = bits(a) + bits(b);
        let second_bits = bits(c) + bits(d) - 8;
        let second = (text(c) | text(d) << bits(c)) & ((1 << second_bits) - 1);
        // `first_bits` is 32 to 64, so neither shift reaches 64.
        let low = first | (second << (first_bits - 8)) << 8;
        let high = second >> (64 - first_bits);
        let mut bytes = [0; MAX_IP_TEXT_LEN];
        bytes[..8].copy_from_slice(&low.to_le_bytes());
        bytes[8..16].copy_from_slice(&high.to_le_bytes());
        // At most 15 bytes: 120 bits.
        #[allow(clippy::cast_possible_truncation)]
        let len = ((first_bits + second_bits) / 8) as u8;
        IpText { bytes, len }
    }

    // Out of line: the formatting machinery would swell every inlined caller.
    #[inline(never)]
    fn v6(ip: Ipv6Addr) -> Self {
        let mut text = IpText {
            bytes: [0; MAX_IP_TEXT_LEN],
            len: 0,
        };
        // `Display` for an IPv6 address never writes more than
        // `MAX_IP_TEXT_LEN` bytes, so this cannot fail.
        let _ = fmt::Write::write_fmt(&mut Append(&mut text), format_args!("{ip}"));
        text
    }

    /// The text's bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The text.
    #[inline]
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

/// Appends what `Display` writes to an [`IpText`] (private, so that only an
/// address's own text ever lands there).
struct Append<'a>(&'a mut IpText);

impl fmt::Write for Append<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let text = &mut *self.0;
        let at = usize::from(text.len);
        let end = at + s.len();
        let slot = text.bytes.get_mut(at..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        text.len = u8::try_from(end).map_err(|_| fmt::Error)?;
        Ok(())
    }
}

impl fmt::Debug for IpText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IpText").field(&self.as_str()).finish()
    }
}

impl From<IpAddr> for IpText {
    fn from(ip: IpAddr) -> Self {
        IpText::new(ip)
    }
}

/// The full storage key `<prefix>:<policy>:{<normalized key>}` as used by the
/// Redis store.
#[cfg(feature = "redis")]
pub(crate) fn storage_key(prefix: &str, policy: &str, key: &[u8]) -> String {
    let key = normalize(key);
    let mut out = String::with_capacity(prefix.len() + policy.len() + key.len() + 4);
    out.push_str(prefix);
    out.push(':');
    out.push_str(policy);
    out.push_str(":{");
    // `normalize` only returns printable ASCII.
    match std::str::from_utf8(&key) {
        Ok(text) => out.push_str(text),
        Err(_) => out.extend(key.iter().map(|&b| char::from(b))),
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbatim_and_hashed() {
        assert!(is_verbatim(b"user-1"));
        assert!(!is_verbatim(b""));
        assert!(!is_verbatim(b"with space"));
        assert!(!is_verbatim(b"#abc"));
        assert!(!is_verbatim(b"a{b"));
        assert!(!is_verbatim(&[0xff, 0x00]));
        assert!(!is_verbatim(&[b'a'; 65]));
        assert!(is_verbatim(&[b'a'; 64]));
        assert_ne!(hashed(b"a"), hashed(b"b"));
        assert_eq!(hashed(b"a"), hashed(b"a"));
        assert!(hashed(&[0u8; 3]).iter().all(|b| b.is_ascii_graphic()));
        assert_eq!(
            hashed_array(b"secret").as_slice(),
            hashed(b"secret").as_slice()
        );
        assert_eq!(
            hashed_parts(&[b"x-api-key", b":", b"k1"]),
            hashed_array(b"x-api-key:k1")
        );
    }

    #[test]
    fn ip_text_is_display() {
        let v4 = [
            [0, 0, 0, 0],
            [255, 255, 255, 255],
            [1, 10, 100, 199],
            [9, 99, 200, 250],
            [203, 0, 113, 7],
        ];
        for octets in v4 {
            let ip = IpAddr::from(octets);
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
        // Every octet value in every position, beside octets of each length.
        for n in 0..=255u8 {
            let ip = IpAddr::from([n, n.wrapping_mul(7), 255 - n, n / 3]);
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
            for other in [0, 10, 100] {
                for position in 0..4 {
                    let mut octets = [other; 4];
                    octets[position] = n;
                    let ip = IpAddr::from(octets);
                    assert_eq!(IpText::new(ip).as_str(), ip.to_string());
                }
            }
        }
        for text in [
            "::",
            "::1",
            "2001:db8::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
            "fe80::1:2:3:4",
        ] {
            let ip: IpAddr = text.parse().expect("valid address");
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
    }

    #[cfg(feature = "redis")]
    proptest::proptest! {
        /// The store's key is `<prefix>:<policy>:{<normalized key>}`, and the
        /// hash tag Redis Cluster reads (from the first `{` to the next `}`)
        /// is the whole normalized key, whatever the key holds.
        #[test]
        fn storage_keys_are_tagged_by_the_whole_normalized_key(
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
            prefix in "[A-Za-z0-9._-]{1,64}",
            policy in "[A-Za-z0-9._-]{1,64}",
        ) {
            let normalized = normalize(&key);
            let stored = storage_key(&prefix, &policy, &key);
            let text = std::str::from_utf8(&normalized).expect("printable");
            proptest::prop_assert_eq!(&stored, &format!("{prefix}:{policy}:{{{text}}}"));
            let open = stored.find('{').expect("a tag") + 1;
            let close = open + stored[open..].find('}').expect("a tag's end");
            proptest::prop_assert_eq!(&stored[open..close], text);
        }
    }

    #[cfg(feature = "redis")]
    #[test]
    fn storage_key_bounded() {
        assert_eq!(storage_key("rl", "api", b"alice"), "rl:api:{alice}");
        let huge = vec![0xffu8; 1 << 20];
        let k = storage_key("rl", "p", &huge);
        assert_eq!(k.len(), "rl:p:{}".len() + 33);
        assert!(k.starts_with("rl:p:{#"));
    }
}

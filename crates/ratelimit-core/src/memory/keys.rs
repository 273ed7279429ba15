//! How `MemoryStore` keeps a user key: its own bytes when short, else a
//! hash; short keys packed into a word.

use super::*;

/// A user key as this store keeps it: its own bytes when at most
/// [`MAX_VERBATIM_KEY_LEN`](key::MAX_VERBATIM_KEY_LEN) long, printable or
/// not (nothing in memory echoes a key, and the map hashes it with its own
/// keyed hasher), else its SHA-256 ([`key::hashed`]), so a stored key is
/// bounded. Which of the two it is is kept beside the bytes, so no user key
/// reaches the state of another key's hash. Short keys, the common case,
/// cost no allocation and no SHA-256; Redis keys are made with
/// [`key::normalize`] instead, where size and secrecy matter.
#[derive(PartialEq, Eq)]
pub(super) struct MemoryKey<'a> {
    pub(super) bytes: Cow<'a, [u8]>,
    pub(super) hashed: bool,
    /// The key packed for a [`ShortWordEntry`] when it is at most
    /// [`SHORT_KEY`] bytes (never a hash: hashes are 33 bytes): its length
    /// in the low byte, its bytes above, zeros after. A short key is hashed
    /// from this ([`key_hash`]).
    pub(super) short: Option<u128>,
}

impl<'a> MemoryKey<'a> {
    #[inline]
    pub(super) fn new(key: &'a [u8]) -> Self {
        if key.len() <= key::MAX_VERBATIM_KEY_LEN {
            MemoryKey {
                bytes: Cow::Borrowed(key),
                hashed: false,
                short: pack_short(key),
            }
        } else {
            Self::hashed(key)
        }
    }

    // Out of line: SHA-256 would swell every inlined check.
    #[cold]
    #[inline(never)]
    fn hashed(key: &[u8]) -> Self {
        MemoryKey {
            bytes: Cow::Owned(key::hashed_array(key).to_vec()),
            hashed: true,
            short: None,
        }
    }
}

/// `key` packed as [`MemoryKey::short`] says, when it is short enough.
///
/// Built in registers: a copy into a buffer read back as one `u128` stalls
/// store forwarding, on every check of a short key, and so does a load
/// across the two 8-byte halves an [`IpText`](crate::key::IpText) is
/// written with, so no load here crosses byte 8.
#[inline]
pub(super) fn pack_short(key: &[u8]) -> Option<u128> {
    if key.len() > SHORT_KEY {
        return None;
    }
    let body = match key.split_first_chunk::<8>() {
        Some((low, high)) => {
            u128::from(u64::from_le_bytes(*low)) | u128::from(pack_word(high)) << 64
        }
        None => u128::from(pack_word(key)),
    };
    Some(body << 8 | key.len() as u128)
}

/// Up to 8 bytes as a little-endian `u64` (zeros above), from loads inside
/// `bytes`.
#[inline]
pub(super) fn pack_word(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    if let Ok(all) = <[u8; 8]>::try_from(bytes) {
        u64::from_le_bytes(all)
    } else if let (Some(low), Some(high)) = (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        // `high` holds bytes `len - 4..len`; bytes `4..len` are its top `len - 4`.
        u64::from(u32::from_le_bytes(*low))
            | (u64::from(u32::from_le_bytes(*high)) >> (8 * (8 - len))) << 32
    } else if let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) {
        // 1 to 3 bytes: the first, the middle and the last (some of them the
        // same byte when fewer), cut to `len` bytes; no loop on the length.
        let middle = bytes[len / 2]; // `len / 2 < len`
        (u64::from(first) | u64::from(middle) << 8 | u64::from(last) << 16) & ((1 << (8 * len)) - 1)
    } else {
        0
    }
}

/// Keys up to this long are stored in the entry itself: one cache miss less
/// per decision than a separately allocated key (IP addresses, most API keys
/// and tenant ids fit; hashed keys are 33 bytes).
pub(super) const INLINE_KEY: usize = 38;

/// The bit of an inline key's length that says it is a hash.
pub(super) const HASHED_BIT: u8 = 0x80;

pub(super) enum StoredKey {
    /// `len` with [`HASHED_BIT`] set for a hashed key.
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    /// Never a hash (hashes fit inline).
    Heap(Box<[u8]>),
}

impl StoredKey {
    pub(super) fn new(key: &MemoryKey<'_>) -> Self {
        let bytes = &*key.bytes;
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= INLINE_KEY => {
                let mut inline = [0; INLINE_KEY];
                inline[..bytes.len()].copy_from_slice(bytes);
                let flag = if key.hashed { HASHED_BIT } else { 0 };
                StoredKey::Inline {
                    len: len | flag,
                    bytes: inline,
                }
            }
            _ => StoredKey::Heap(bytes.into()),
        }
    }

    #[inline]
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len & !HASHED_BIT)],
            StoredKey::Heap(key) => key,
        }
    }

    #[inline]
    pub(super) fn hashed(&self) -> bool {
        matches!(self, StoredKey::Inline { len, .. } if len & HASHED_BIT != 0)
    }
}

//! The reader of `Forwarded` (RFC 7239) and `X-Forwarded-For`: entries split
//! from the right, lazily, each parsed to an address or found malformed.
//!
//! Hand-written on purpose. The maintained parsers (`forwarded-header-value`
//! is the one on crates.io for Rust) read a whole header left to right into a
//! list, so a 10,000-entry header costs 10,000 entries of work where this walk
//! stops after `max_hops`; and they fail or skip differently from what
//! [`ClientIp`](crate::ClientIp) promises: it splits pairs on every `;`, even
//! inside quoted strings (`host="a;b"`), drops empty entries instead of
//! stopping there, and takes the last of several `for=` where this refuses
//! the element. The walk's result on such input decides whose key a request
//! uses, so it is kept here, with its cases tested below.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{HeaderValue, ValueIter};

/// The longest single list entry (one `X-Forwarded-For` address or one
/// `Forwarded` element) that is scanned; longer entries are malformed. This
/// bounds the work per hop regardless of
/// [`ClientIp::max_header_bytes`](crate::ClientIp::max_header_bytes).
pub(super) const MAX_ENTRY_BYTES: usize = 1024;

/// One list entry, right to left.
pub(super) enum Entry<'a> {
    /// The entry's bytes, separators excluded.
    Text(&'a [u8]),
    /// No separator within [`MAX_ENTRY_BYTES`]: malformed.
    TooLong,
}

/// The comma-separated entries of header lines, last line first, each line
/// split from the right; scans at most [`MAX_ENTRY_BYTES`] per entry.
pub(super) struct Entries<'a> {
    lines: std::iter::Rev<ValueIter<'a, HeaderValue>>,
    /// What is left of the current line, `None` once it is consumed.
    line: Option<&'a [u8]>,
    /// Set after [`Entry::TooLong`]: nothing left of it is read.
    done: bool,
}

impl<'a> Entries<'a> {
    /// The entries of `lines`, the lines of one header in order.
    pub(super) fn new(lines: ValueIter<'a, HeaderValue>) -> Self {
        Entries {
            lines: lines.rev(),
            line: None,
            done: false,
        }
    }
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
pub(super) fn parse_node(s: &[u8]) -> Option<IpAddr> {
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
pub(super) fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
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
}

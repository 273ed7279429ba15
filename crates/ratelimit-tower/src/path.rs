//! The path as rules and route keys see it: dot segments resolved,
//! escapes decoded (the route rules' readings of a path build on these, in
//! `config::routes`).

use std::borrow::Cow;

#[cfg(feature = "config")]
use http::Method;

/// The most segments a route prefix may have (the configuration refuses
/// more).
#[cfg(feature = "config")]
pub(crate) const MAX_ROUTE_DEPTH: usize = 32;

/// `path` with its first `root` segments kept as they are and the rest
/// normalised as [`normalize`] does, `..` climbing no higher than them.
fn resolve_below(path: &str, root: usize) -> String {
    resolve(path, root, dots)
}

/// `path` with repeated slashes merged and `.`/`..` segments resolved as
/// written only: `%2e` is no dot to a hop that leaves escapes alone.
#[cfg(feature = "config")]
pub(crate) fn normalize_literal_dots(path: &str) -> String {
    resolve(path, 0, |segment| match segment {
        "" => Some(0),
        "." => Some(1),
        ".." => Some(2),
        _ => None,
    })
}

/// `path` with dot segments (`%2e` a dot) removed as RFC 3986 removes
/// them, empty segments kept (a `..` removes the one before it), as a hop
/// that resolves dot segments without merging slashes forwards it (Envoy's
/// `normalize_path`, Istio's default).
#[cfg(feature = "config")]
pub(crate) fn dots_resolved_keeping_empty_segments(path: &str) -> String {
    resolve(path, 0, |segment| {
        dots(segment).filter(|_| !segment.is_empty())
    })
}

/// [`resolve_below`], with `dots` telling the dot segments (and how many
/// dots each is; none, for an empty segment dropped).
fn resolve(path: &str, root: usize, dots: impl Fn(&str) -> Option<usize>) -> String {
    let mut segments: Vec<&str> = Vec::new();
    // Whether the result ends with a slash: the path does, or its last
    // segment is a dot segment (`/a/b/..` is `/a/`).
    let mut trailing = false;
    for (i, segment) in path.split('/').skip(1).enumerate() {
        if i < root {
            segments.push(segment);
            continue;
        }
        trailing = true;
        match dots(segment) {
            Some(0 | 1) => {}
            Some(2) => {
                if segments.len() > root {
                    segments.pop();
                }
            }
            _ => {
                segments.push(segment);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if trailing || out.is_empty() {
        out.push('/');
    }
    out
}

/// The path a route key uses where the router's route is not known: every
/// percent-encoded byte decoded but `/` and `%` (which would make another
/// path, or another escape), whose escapes are written in capitals, then
/// slashes merged and dot segments resolved, so the spellings of one path
/// share one key (`/a:b`, `/a%3Ab` and `/a%3ab` are one, as for axum's
/// `Path`). Bytes that do not decode to UTF-8 are replaced, which only ever
/// joins keys.
pub(crate) fn key_path(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return normalize(path);
    }
    let decoded = decode_escapes(path, |byte| byte == b'/' || byte == b'%');
    Cow::Owned(normalize(&decoded).into_owned())
}

/// `path` with its percent-encoded bytes decoded but those `kept` holds
/// for, whose escapes are written in capitals; bytes that are not UTF-8
/// replaced.
pub(crate) fn decode_escapes(path: &str, kept: impl Fn(u8) -> bool) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], escaped(bytes, i)) {
            (b'%', Some(byte)) => {
                if kept(byte) {
                    out.extend_from_slice(&[
                        b'%',
                        HEX[usize::from(byte >> 4)],
                        HEX[usize::from(byte & 15)],
                    ]);
                } else {
                    out.push(byte);
                }
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether RFC 3986 calls `byte` unreserved (letters, digits, `-._~`):
/// the same written as itself or escaped.
#[cfg(feature = "config")]
pub(crate) fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The byte the escape `%XX` at `at` in `bytes` encodes, if it is one.
pub(crate) fn escaped(bytes: &[u8], at: usize) -> Option<u8> {
    let hex = bytes.get(at + 1..at + 3)?;
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// The method a route rule sees: `HEAD` is `GET`, since routers (axum among
/// them) answer `HEAD` with the `GET` handler.
#[cfg(feature = "config")]
pub(crate) fn route_method(method: &Method) -> &Method {
    if method == Method::HEAD {
        &Method::GET
    } else {
        method
    }
}

/// `path` with repeated slashes merged and `.`/`..` segments (also spelled
/// `%2e`) resolved; `..` never climbs above the root. Borrowed, without
/// allocating, when there is nothing to change.
pub(crate) fn normalize(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || !needs_normalizing(path) {
        return Cow::Borrowed(path);
    }
    Cow::Owned(resolve_below(path, 0))
}

/// Whether [`normalize`] (or any way of resolving dot segments or merging
/// slashes) can change `path`.
pub(crate) fn needs_normalizing(path: &str) -> bool {
    path.contains("//") || path.contains("/.") || contains_ignoring_case(path, "%2e")
}

/// Whether `haystack` holds `needle`, ASCII case ignored (an escape's hex
/// digits may be in either case).
pub(crate) fn contains_ignoring_case(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// How many dots a segment is made of (`.` or `%2e` each), if only dots.
pub(crate) fn dots(segment: &str) -> Option<usize> {
    let mut rest = segment.as_bytes();
    let mut count = 0;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix(b".") {
            rest = after;
        } else if rest.len() >= 3 && rest[..3].eq_ignore_ascii_case(b"%2e") {
            rest = &rest[3..];
        } else {
            return None;
        }
        count += 1;
        if count > 2 {
            return None;
        }
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn route_key_paths_decode_all_but_slash_and_percent() {
        use super::key_path;
        for (path, want) in [
            ("/a:b", "/a:b"),
            ("/a%3Ab", "/a:b"),
            ("/a%3ab/%2e%2E/c", "/c"),
            ("/a%2fb%2F", "/a%2Fb%2F"),
            ("/a%252e%252e", "/a%252e%252e"),
            ("/%ff%FF", "/\u{fffd}\u{fffd}"),
            ("/a%+6%z", "/a%+6%z"),
        ] {
            assert_eq!(key_path(path), want, "{path}");
        }
    }

    #[test]
    fn merges_slashes_and_resolves_dot_segments() {
        for (path, want) in [
            ("/", "/"),
            ("/api/x", "/api/x"),
            ("/api//x", "/api/x"),
            ("//api/x", "/api/x"),
            ("/api/./x", "/api/x"),
            ("/api/y/../x", "/api/x"),
            ("/../../x", "/x"),
            ("/api/%2E/x", "/api/x"),
            ("/api/y/.%2e/x", "/api/x"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("/a//", "/a/"),
            ("/..", "/"),
            ("/...", "/..."),
            ("/a/.b/..c", "/a/.b/..c"),
            ("/API/x", "/API/x"),
            ("/api%2Fx", "/api%2Fx"),
            ("*", "*"),
        ] {
            assert_eq!(normalize(path), want, "{path}");
        }
    }

    #[test]
    fn dot_dot_climbs_no_higher_than_the_root() {
        use super::resolve_below;
        assert_eq!(resolve_below("/files/../private/r", 1), "/files/private/r");
        assert_eq!(resolve_below("/files/x/../../private", 1), "/files/private");
        assert_eq!(
            resolve_below("/files/x/../../private", 2),
            "/files/x/private"
        );
        assert_eq!(resolve_below("/a/b/..", 1), "/a/");
    }

    #[cfg(feature = "config")]
    #[test]
    fn dot_segments_may_be_resolved_keeping_empty_ones() {
        assert_eq!(
            super::dots_resolved_keeping_empty_segments("/api//../x/./y/"),
            "/api/x/y/"
        );
    }
}

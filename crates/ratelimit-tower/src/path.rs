//! The path as rules see it.
//!
//! A route rule must cover every request the router runs under that route,
//! whatever the client's spelling. The router (axum routes on the raw path)
//! and the servers or proxies in front of it may each read a path another
//! way, so a rule is matched against every spelling any of them may route
//! on, and applies when one matches ([`any_spelling`]): the raw path; the
//! path with repeated slashes merged and dot segments (also spelled `%2e`)
//! resolved; the same after decoding percent-encoded unreserved bytes
//! (`%61` is `a`); the same after decoding every percent-encoded byte
//! (`%2F` is `/`), as axum's `Path` hands a wildcard's tail to its handler
//! (`/files/{*path}` serves `private/a` for `/files/private%2Fa`); each
//! of those with `..` resolved below a root a wildcard may have
//! (`/files/../private` is `private` to a handler of `/files/{*path}` that
//! cleans its tail from its own root, `/download-../private` to one of
//! `/download-{*path}`); and, with axum, the route the router chose
//! (`MatchedPath`), the path below that route's own wildcard, and the path
//! before any nesting (`OriginalUri`). Each spelling only adds matches,
//! never removes one. Case is kept: axum routes on it as it is (see
//! SECURITY.md).

use std::borrow::Cow;

#[cfg(feature = "config")]
use http::{Method, Request};

/// Whether `matches` holds for any spelling of `req`'s path a router or a
/// proxy in front of it may route on (see the module docs); `matches` looks
/// for the route prefixes `prefixes`, of at most `depth` segments.
#[cfg(feature = "config")]
pub(crate) fn any_spelling<B>(
    req: &Request<B>,
    prefixes: &[String],
    depth: usize,
    mut matches: impl FnMut(&str) -> bool,
) -> bool {
    #[cfg(feature = "axum")]
    {
        let extensions = req.extensions();
        let original = extensions.get::<axum::extract::OriginalUri>();
        if let Some(matched) = extensions.get::<axum::extract::MatchedPath>() {
            // The router's route, and the path below its wildcard's root
            // (the route as registered, so the path before any nesting).
            let full = original.map_or(req.uri().path(), |uri| uri.path());
            if matches(matched.as_str()) || below_the_wildcard(full, matched.as_str(), &mut matches)
            {
                return true;
            }
        }
        // The original path, where nesting has changed it.
        if let Some(original) = original
            && original.path() != req.uri().path()
            && spellings_match(original.path(), prefixes, depth, &mut matches)
        {
            return true;
        }
    }
    spellings_match(req.uri().path(), prefixes, depth, &mut matches)
}

#[cfg(feature = "config")]
fn spellings_match(
    path: &str,
    prefixes: &[String],
    depth: usize,
    matches: &mut impl FnMut(&str) -> bool,
) -> bool {
    if matches(path) {
        return true;
    }
    let normal = normalize(path);
    if matches!(&normal, Cow::Owned(normal) if matches(normal)) {
        return true;
    }
    let base = decode_unreserved(path);
    let base_normal = normalize(&base);
    if matches!(&base, Cow::Owned(base) if matches(base) || matches(&base_normal)) {
        return true;
    }
    let decoded = decode_all(path);
    let decoded_normal = normalize(&decoded);
    if matches!(&decoded, Cow::Owned(decoded) if matches(decoded) || matches(&decoded_normal)) {
        return true;
    }
    // A wildcard may start inside a segment (`/download-{*path}`); a hop
    // in front of the router may have resolved dot segments first, and
    // `Path` decodes the tail (each spelling once: a decoded one is not
    // decoded again).
    let mut inside: Vec<(&str, bool)> = vec![(&base, false), (&base_normal, false)];
    if let Cow::Owned(decoded) = &decoded {
        inside.extend([(decoded.as_str(), true), (&decoded_normal, true)]);
    }
    for (i, &(spelling, decoded)) in inside.iter().enumerate() {
        let repeated = inside[..i].iter().any(|&(seen, _)| seen == spelling);
        if !repeated && cut_inside_a_segment(spelling, decoded, prefixes, depth, matches) {
            return true;
        }
    }
    // A handler may resolve `..` in a wildcard's tail from the wildcard's
    // root, not from `/` (Go's `http.Dir` does): `/files/../private` is
    // then `private` under `/files/`; and `Path` decodes an encoded slash
    // in the tail (`/{tenant}/files/private%2Fr` is tenant's `private/r`).
    // The root is unknown, so each is tried: the first `root` segments as
    // the router splits them (a parameter there may hold `..` or an
    // encoded `/`), then the tail as `Path` hands it over, every escape
    // decoded, with `..` climbing no higher. Only roots shallower than a
    // prefix can change whether it matches (deeper, the path keeps the
    // prefix's segments as written): at most `depth - 1`, each a pass over
    // the path, and none without a `..` or an encoded slash.
    let roots = depth.saturating_sub(1).min(MAX_ROUTE_DEPTH);
    if roots == 0 || !(base.contains("..") || decoded.contains("..") || has_encoded_slash(&base)) {
        return false;
    }
    // Each root is one or two passes over the path: past this length, such
    // a path (no client sends one) is taken to be under every prefix.
    if path.len() > MAX_RESOLVED_PATH {
        return true;
    }
    let mut cuts = base.match_indices('/').map(|(at, _)| at).skip(1);
    for root in 1..=roots {
        let Some(cut) = cuts.next() else {
            break;
        };
        let (head, tail) = base.split_at(cut);
        let tail = decode_all(tail);
        if matches(&resolve_below(&format!("{head}{tail}"), root)) {
            return true;
        }
        // The root's parameters as `Path` decodes them, as a prefix may
        // name them (`/caf%C3%A9/...` is also `/café/...`).
        if let Cow::Owned(head) = decode_all(head)
            && matches(&resolve_below(
                &format!("{head}{tail}"),
                head.matches('/').count(),
            ))
        {
            return true;
        }
    }
    false
}

/// Whether `matches` holds for `path` (a spelling of a request's path:
/// with unreserved escapes decoded, or, `decoded`, with every escape
/// decoded, which is not decoded again) resolved below a root inside one
/// of its first `depth` segments, where a wildcard that starts inside a
/// segment has its root: the handler of axum's `/download-{*path}` is
/// given `../private/r` for `/download-../private/r`, or `/private/r` for
/// `/download-/private/r`, and, cleaning it from its own root, serves
/// `private/r`, as for `/download-private/r`.
///
/// Such a root matters only where the segment's part after it is dropped
/// (empty, a dot segment, or undone by a later `..`; kept, it leaves the
/// segment whole). The tail then resolves the same wherever the root is in
/// the segment, so each literal segment of a prefix can match at one root
/// only: where the segment's start and the tail's first segment spell it.
/// A parameter matches any segment: there the root is taken where it
/// joins the segment to the tail's first, but only where a dot segment or
/// a `..` is dropped (an empty part would join every pair of segments, and
/// a prefix `/{dir}/private` would cover `/a/b/private`; the router's own
/// route covers those, see [`below_the_wildcard`]).
///
/// One pass over the path from its end, then a few bytes per prefix
/// segment, and a path rebuilt for each root found (past
/// [`MAX_RESOLVED_PATH`], the path is taken to be under the prefix
/// instead). Within a segment, a root is looked for before its first
/// encoded slash: a route's literal text does not hold one.
#[cfg(feature = "config")]
fn cut_inside_a_segment(
    path: &str,
    decoded: bool,
    prefixes: &[String],
    depth: usize,
    matches: &mut impl FnMut(&str) -> bool,
) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let dot_dot = path.contains("..");
    if !prefixes
        .iter()
        .any(|prefix| may_have_a_root_inside(prefix, &segments, dot_dot))
    {
        return false;
    }
    // From the path's end back: the segments kept so far (the last first)
    // and the `..` not yet matched; and, at each of the first `depth`
    // segments, its first part (before an encoded slash) and both as they
    // stand past it.
    let mut kept: Vec<Cow<'_, str>> = Vec::new();
    let mut pending = 0;
    let mut past_first = vec![("", 0, 0); depth.min(segments.len())];
    for (i, segment) in segments.iter().enumerate().rev() {
        let parts = parts_of(segment, decoded);
        for part in parts[1..].iter().rev() {
            resolve_back(part, !decoded, &mut kept, &mut pending);
        }
        if let Some(state) = past_first.get_mut(i) {
            *state = (parts[0], kept.len(), pending);
        }
        resolve_back(parts[0], !decoded, &mut kept, &mut pending);
    }
    // A resolved tail ends with a slash where the path ends with an empty
    // or dot segment (`/download-../private/` is `private/`).
    let trailing = segments
        .last()
        .and_then(|last| parts_of(last, decoded).pop())
        .is_some_and(|last| dots(last).is_some());
    let mut start = 1;
    let starts: Vec<usize> = segments
        .iter()
        .map(|segment| {
            let at = start;
            start += segment.len() + 1;
            at
        })
        .collect();
    for prefix in prefixes {
        let Some(wanted) = prefix.strip_prefix('/') else {
            continue;
        };
        let wanted: Vec<&str> = wanted.split('/').collect();
        for (s, &literal) in wanted.iter().enumerate() {
            let Some(&(first, kept_len, pending)) = past_first.get(s) else {
                break;
            };
            if literal.is_empty() || literal.starts_with("{*") {
                continue;
            }
            let next = kept_len.checked_sub(1).map_or("", |last| &kept[last]);
            let head = if literal.starts_with('{') {
                // Any root works for a parameter: the first part, without
                // the dots that are dropped.
                if kept_len == 0 || !(pending > 0 || ends_with_a_dot_segment(first)) {
                    continue;
                }
                first.trim_end_matches('.')
            } else {
                // The one root where the segment's start and the tail's
                // first segment spell `literal`; the part after it must be
                // dropped.
                let Some(cut) = literal.len().checked_sub(next.len()) else {
                    continue;
                };
                let (Some(head), Some(dropped)) = (first.get(..cut), first.get(cut..)) else {
                    continue;
                };
                if cut == 0
                    || !literal.ends_with(next)
                    || head != &literal[..cut]
                    || (dots(dropped).is_none() && pending == 0)
                {
                    continue;
                }
                head
            };
            // Each root found is a path rebuilt: past this length, such a
            // path (no client sends one) is taken to be under the prefix.
            if path.len() > MAX_RESOLVED_PATH {
                return true;
            }
            let mut tail = String::from(head);
            // Enough segments for the prefix to tell.
            let shown = wanted.len() - s + 1;
            for (n, part) in kept[..kept_len].iter().rev().take(shown).enumerate() {
                if n > 0 {
                    tail.push('/');
                }
                tail.push_str(part);
            }
            if trailing && kept_len > 0 && kept_len <= shown {
                tail.push('/');
            }
            // The segments above the root as written, and as `Path` decodes
            // them, as a prefix may name them (`/a%3Ab/...` is `/a:b/...`).
            let above = &path[..starts[s]];
            if matches(&format!("{above}{tail}"))
                || matches!(decode_all(above), Cow::Owned(above) if matches(&format!("{above}{tail}")))
            {
                return true;
            }
        }
    }
    false
}

/// Whether `segment` ends with a dot segment after something else
/// (`download-..`, `a.`): a root before the dots drops them.
#[cfg(feature = "config")]
fn ends_with_a_dot_segment(segment: &str) -> bool {
    let name = segment.trim_end_matches('.');
    !name.is_empty() && name.len() < segment.len() && segment.len() - name.len() <= 2
}

/// Whether `prefix` may cover `segments` (a path's; `dot_dot`: the path
/// has a `..`) below a root inside one of them: the segments above that
/// one are the prefix's (or its parameters'), and it starts as the
/// prefix's segment does, or a parameter matches it and it ends with a dot
/// segment. Without a `..` to undo part of a segment, the first segment
/// that is not the prefix's is the only literal one where a root can change
/// anything. A few bytes per prefix segment: a path that starts as no
/// prefix does costs no pass.
#[cfg(feature = "config")]
fn may_have_a_root_inside(prefix: &str, segments: &[&str], dot_dot: bool) -> bool {
    let Some(wanted) = prefix.strip_prefix('/') else {
        return false;
    };
    for (literal, segment) in wanted.split('/').zip(segments) {
        if literal.starts_with("{*") {
            return false;
        }
        if literal.starts_with('{') {
            if dot_dot || ends_with_a_dot_segment(segment) {
                return true;
            }
            continue;
        }
        if literal != *segment {
            return !literal.is_empty() && literal.as_bytes().first() == segment.as_bytes().first();
        }
        if dot_dot {
            return true;
        }
    }
    false
}

/// Whether `matches` holds for `path` resolved below the root of the
/// wildcard of `route`, the route axum's router chose for it (its
/// `MatchedPath`, as registered, and `path` before any nesting): the path
/// the route's handler serves when it cleans its tail from its own root,
/// wherever the wildcard starts (`/download-/private/r` is
/// `/download-private/r` to `/download-{*path}`, `/files/../private` is
/// `/files/private` to `/files/{*path}`). A route without a wildcard, or
/// that `path` does not follow segment by segment, adds nothing.
#[cfg(all(feature = "config", feature = "axum"))]
fn below_the_wildcard(path: &str, route: &str, matches: &mut impl FnMut(&str) -> bool) -> bool {
    let (Some(route), Some(rest)) = (route.strip_prefix('/'), path.strip_prefix('/')) else {
        return false;
    };
    let Some(star) = route.find("{*") else {
        return false;
    };
    let above = &route[..star];
    // The wildcard's segment: its literal start, and the segments above it.
    let (whole, start) = match above.rfind('/') {
        Some(at) => (&above[..at], &above[at + 1..]),
        None => ("", above),
    };
    if start.contains('{') {
        return false;
    }
    let mut root = 1;
    let mut segments = rest.split('/');
    for template in whole.split('/').filter(|_| !whole.is_empty()) {
        let Some(segment) = segments.next() else {
            return false;
        };
        if !template.starts_with('{') && template != segment {
            return false;
        }
        root += segment.len() + 1;
    }
    if !path.get(root..).is_some_and(|tail| tail.starts_with(start)) {
        return false;
    }
    root += start.len();
    // A path too long to resolve, which no client sends, is under it.
    if path.len() > MAX_RESOLVED_PATH {
        return true;
    }
    let resolved = resolve_below(&format!("/{}", decode_all(&path[root..])), 0);
    let tail = &resolved[1..];
    let head = &path[..root];
    matches(&format!("{head}{tail}"))
        || matches!(decode_all(head), Cow::Owned(head) if matches(&format!("{head}{tail}")))
}

/// `segment` split at its encoded slashes (`%2F`), which axum's `Path`
/// decodes into a wildcard's tail.
#[cfg(feature = "config")]
fn encoded_slash_parts(segment: &str) -> Vec<&str> {
    let bytes = segment.as_bytes();
    let mut parts = Vec::new();
    let mut from = 0;
    let mut i = 0;
    while i + 3 <= bytes.len() {
        if bytes[i..i + 3].eq_ignore_ascii_case(b"%2f") {
            parts.push(&segment[from..i]);
            i += 3;
            from = i;
        } else {
            i += 1;
        }
    }
    parts.push(&segment[from..]);
    parts
}

/// The parts of `segment` a wildcard's tail decodes it into: split at its
/// encoded slashes, unless `decoded` already.
#[cfg(feature = "config")]
fn parts_of(segment: &str, decoded: bool) -> Vec<&str> {
    if decoded {
        vec![segment]
    } else {
        encoded_slash_parts(segment)
    }
}

/// Whether `path` has an encoded slash (`%2F`), which `Path` decodes.
#[cfg(feature = "config")]
fn has_encoded_slash(path: &str) -> bool {
    path.as_bytes()
        .windows(3)
        .any(|w| w.eq_ignore_ascii_case(b"%2f"))
}

/// One step of resolving dot segments from a path's end back: `part`, the
/// segment before those seen, is dropped (empty or `.`), a `..` to match,
/// undone by one, or kept, decoded as axum's `Path` decodes it (`decode`)
/// or as it is.
#[cfg(feature = "config")]
fn resolve_back<'a>(
    part: &'a str,
    decode: bool,
    kept: &mut Vec<Cow<'a, str>>,
    pending: &mut usize,
) {
    match dots(part) {
        Some(2) => *pending += 1,
        Some(_) => {}
        None if *pending > 0 => *pending -= 1,
        None if decode => kept.push(decode_all(part)),
        None => kept.push(Cow::Borrowed(part)),
    }
}

/// The longest path [`spellings_match`] resolves below each root.
#[cfg(feature = "config")]
const MAX_RESOLVED_PATH: usize = 2 * 1024;

/// The most segments a route prefix may have (the configuration refuses
/// more): how deep [`spellings_match`] looks for a wildcard's root.
#[cfg(feature = "config")]
pub(crate) const MAX_ROUTE_DEPTH: usize = 32;

/// `path` with its first `root` segments kept as they are and the rest
/// normalised as [`normalize`] does, `..` climbing no higher than them.
fn resolve_below(path: &str, root: usize) -> String {
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
            _ if segment.is_empty() => {}
            Some(1) => {}
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

/// `path` with every percent-encoded byte decoded, `/` and `%` included, as
/// axum's `Path` decodes a wildcard's tail; bytes that are not UTF-8
/// replaced (which only joins spellings). Borrowed when it has no escape
/// other than those [`decode_unreserved`] decodes.
#[cfg(feature = "config")]
pub(crate) fn decode_all(path: &str) -> Cow<'_, str> {
    let bytes = path.as_bytes();
    let reserved = |i: usize| escaped(bytes, i).is_some_and(|byte| !unreserved(byte));
    if !(0..bytes.len()).any(|i| bytes[i] == b'%' && reserved(i)) {
        return Cow::Borrowed(path);
    }
    Cow::Owned(decode_escapes(path, |_| false))
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
fn decode_escapes(path: &str, kept: impl Fn(u8) -> bool) -> String {
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
fn escaped(bytes: &[u8], at: usize) -> Option<u8> {
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

/// `path` with percent-encoded unreserved bytes (`ALPHA / DIGIT / - . _ ~`,
/// which RFC 3986 says are the same written either way) decoded; borrowed
/// when there are none.
#[cfg(feature = "config")]
fn decode_unreserved(path: &str) -> Cow<'_, str> {
    let bytes = path.as_bytes();
    let decoded_at = |i: usize| -> Option<u8> {
        let byte = escaped(bytes, i)?;
        unreserved(byte).then_some(byte)
    };
    let Some(first) = (0..bytes.len()).find(|&i| bytes[i] == b'%' && decoded_at(i).is_some())
    else {
        return Cow::Borrowed(path);
    };
    let mut out = String::with_capacity(path.len());
    out.push_str(&path[..first]);
    let mut i = first;
    while i < bytes.len() {
        match (bytes[i], decoded_at(i)) {
            (b'%', Some(byte)) => {
                out.push(char::from(byte));
                i += 3;
            }
            _ => {
                let next = (i + 1..bytes.len())
                    .find(|&j| bytes[j] == b'%')
                    .unwrap_or(bytes.len());
                out.push_str(&path[i..next]);
                i = next;
            }
        }
    }
    Cow::Owned(out)
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

fn needs_normalizing(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.windows(2).any(|w| w == b"//" || w == b"/.")
        || bytes.windows(3).any(|w| w.eq_ignore_ascii_case(b"%2e"))
}

/// How many dots a segment is made of (`.` or `%2e` each), if only dots.
fn dots(segment: &str) -> Option<usize> {
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

    /// Every spelling tried for `path`, for prefixes of `depth` segments.
    #[cfg(feature = "config")]
    fn spellings_at(path: &str, depth: usize) -> Vec<String> {
        let req = http::Request::get(path).body(()).unwrap();
        let mut seen = Vec::new();
        super::any_spelling(&req, &[], depth, |p| {
            seen.push(p.to_owned());
            false
        });
        seen
    }

    #[cfg(feature = "config")]
    use super::MAX_ROUTE_DEPTH;

    #[cfg(feature = "config")]
    fn spellings(path: &str) -> Vec<String> {
        spellings_at(path, 1)
    }

    #[cfg(feature = "config")]
    #[test]
    fn the_raw_path_is_always_a_spelling() {
        // Resolving `..` alone would put this request under `/api/`, while
        // a router runs `/api/export/{*rest}` for it.
        assert_eq!(
            spellings("/api/export/x/../.."),
            ["/api/export/x/../..", "/api/"]
        );
        assert_eq!(spellings("/api/export/%2e%2e")[0], "/api/export/%2e%2e");
        assert_eq!(spellings("/api/x"), ["/api/x"]);
    }

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

    #[cfg(feature = "config")]
    #[test]
    fn every_spelling_is_tried() {
        assert_eq!(
            spellings("/%61pi/x/%2e%2e/y"),
            ["/%61pi/x/%2e%2e/y", "/%61pi/y", "/api/x/../y", "/api/y"]
        );
        // A wildcard's tail as axum's `Path` decodes it, resolved or not.
        assert_eq!(
            spellings("/files/a%2F..%2Fb"),
            ["/files/a%2F..%2Fb", "/files/a/../b", "/files/b"]
        );
    }

    #[cfg(feature = "config")]
    #[test]
    fn dot_dot_is_also_resolved_below_each_root_a_prefix_may_have() {
        use super::resolve_below;
        assert_eq!(resolve_below("/files/../private/r", 1), "/files/private/r");
        assert_eq!(resolve_below("/files/x/../../private", 1), "/files/private");
        assert_eq!(
            resolve_below("/files/x/../../private", 2),
            "/files/x/private"
        );
        assert_eq!(resolve_below("/a/b/..", 1), "/a/");
        // A prefix of two segments: the one root above them is tried.
        assert!(spellings_at("/files/../private/r", 2).contains(&"/files/private/r".to_owned()));
        assert!(
            spellings_at("/files/x/..%2F..%2Fprivate", 2).contains(&"/files/private".to_owned())
        );
        // A prefix of one segment: no root can change whether it matches.
        assert!(!spellings_at("/files/../private/r", 1).contains(&"/files/private/r".to_owned()));
        // A path too long to resolve below each root is under every prefix.
        let long = format!("/a/..{}", "/b".repeat(5000));
        assert!(super::any_spelling(
            &http::Request::get(long.as_str()).body(()).unwrap(),
            &[],
            2,
            |_| false
        ));
        // `..` spelled `%2e%2e` only.
        assert!(
            spellings_at("/files/%2e%2e/private/r", 2).contains(&"/files/private/r".to_owned())
        );
    }

    #[cfg(feature = "config")]
    #[test]
    fn dot_dot_is_also_resolved_below_a_root_inside_a_segment() {
        // What is tried for `path` under `prefix` (a wildcard's root inside
        // one of the prefix's segments, as in `/download-{*path}`).
        let tried_in = |path: &str, decoded: bool, prefix: &str| {
            let mut seen = Vec::new();
            let depth = prefix.split('/').filter(|s| !s.is_empty()).count();
            super::cut_inside_a_segment(path, decoded, &[prefix.to_owned()], depth, &mut |p| {
                seen.push(p.to_owned());
                false
            });
            seen
        };
        let tried = |path: &str, prefix: &str| tried_in(path, false, prefix);
        for path in [
            "/download-../private/r",
            "/download-x/../../private/r",
            "/download-x/../private/r",
            "/download-..%2Fprivate%2Fr",
            "/download-.%2F..%2Fprivate/r",
            "/download-x%2F..%2F..%2Fprivate/r",
            "/download-%2e%2e/private/r",
        ] {
            assert_eq!(
                tried(path, "/download-private"),
                ["/download-private/r"],
                "{path}"
            );
        }
        assert_eq!(
            tried("/api/v1-../admin/users/../x", "/api/v1-admin/x"),
            ["/api/v1-admin/x"]
        );
        // No `..`: the part after the root is empty or a dot.
        for path in [
            "/download-/private/r",
            "/download-./private/r",
            "/download-%2Fprivate%2Fr",
        ] {
            assert_eq!(
                tried(path, "/download-private"),
                ["/download-private/r"],
                "{path}"
            );
        }
        // A trailing slash stays.
        assert_eq!(
            tried("/download-../private/", "/download-private/"),
            ["/download-private/"]
        );
        assert_eq!(
            tried("/download-../private", "/download-private/"),
            ["/download-private"]
        );
        // The segments above the root as written, then decoded.
        assert_eq!(
            tried("/a%3Ab/download-../private/r", "/a:b/download-private"),
            ["/a%3Ab/download-private/r", "/a:b/download-private/r"]
        );
        // Escaped above the root, a prefix's segment is met in the decoded
        // spelling, which is not decoded again (`%252F` is one name).
        assert!(tried("/%3Ax/download-../private/r", "/:x/download-private").is_empty());
        assert_eq!(
            tried_in(
                "/:x/download-../x%2Fy/../private/r",
                true,
                "/:x/download-private"
            ),
            ["/:x/download-private/r"]
        );
        // A path under none of the prefix's segments, or that leaves them as
        // they are, costs no pass.
        assert!(tried("/api/users/x", "/api/admin").is_empty());
        // The segment's part after the root is kept: the segment stays whole.
        assert!(tried("/download-x/private/r", "/download-private").is_empty());
        // Another start, or another tail, than the prefix's.
        assert!(tried("/upload-../private/r", "/download-private").is_empty());
        assert!(tried("/download-../public/r", "/download-private").is_empty());
        // A parameter matches any segment, joined to the tail's first where
        // a dot segment or a `..` is dropped, not an empty part.
        assert_eq!(
            tried("/download-../x/private/r", "/{dir}/private"),
            ["/download-x/private/r"]
        );
        assert_eq!(
            tried("/download-y/../x/private/r", "/{dir}/private"),
            ["/download-yx/private/r"]
        );
        assert!(tried("/download-/x/private/r", "/{dir}/private").is_empty());
    }

    #[cfg(all(feature = "config", feature = "axum"))]
    #[test]
    fn the_matched_routes_wildcard_is_resolved_from_its_own_root() {
        let seen = |path: &str, route: &str| {
            let mut seen = Vec::new();
            super::below_the_wildcard(path, route, &mut |p| {
                seen.push(p.to_owned());
                false
            });
            seen
        };
        assert_eq!(
            seen("/download-/private/r", "/download-{*path}"),
            ["/download-private/r"]
        );
        assert_eq!(
            seen("/download-/x/private/r", "/download-{*path}"),
            ["/download-x/private/r"]
        );
        assert_eq!(
            seen("/t/download-../x/r", "/{tenant}/download-{*path}"),
            ["/t/download-x/r"]
        );
        assert_eq!(
            seen("/files/a%2F..%2F..%2Fprivate/", "/files/{*path}"),
            ["/files/private/"]
        );
        assert_eq!(
            seen("/caf%C3%A9-../p", "/caf%C3%A9-{*path}"),
            ["/caf%C3%A9-p", "/café-p"]
        );
        // A path that does not follow the route, or a route without a
        // wildcard, adds nothing.
        assert!(seen("/other/x", "/files/{*path}").is_empty());
        assert!(seen("/t", "/{tenant}/files/{*path}").is_empty());
        assert!(seen("/users/7", "/users/{id}").is_empty());
    }

    /// The work a hostile path forces per rule: a path with a `..` deep
    /// down is resolved below each root, one pass over the whole path each;
    /// the forms tried (raw, unreserved decoded, all decoded) are one string
    /// when the path has no escape, so each of those passes is made three
    /// times over (93 passes instead of 31 for a prefix of 32 segments).
    #[cfg(feature = "config")]
    #[test]
    fn a_path_without_escapes_is_resolved_below_each_root_once() {
        // Every root keeps a different part: 31 distinct resolutions.
        let names: String = (0..40).map(|i| format!("/s{i}")).collect();
        let deep = format!("{names}{}/x", "/..".repeat(40));
        let seen = spellings_at(&deep, MAX_ROUTE_DEPTH);
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            seen.len(),
            unique.len(),
            "{} spellings tried for {} distinct ones, each a pass over the path",
            seen.len(),
            unique.len()
        );
    }

    #[cfg(feature = "config")]
    #[test]
    fn escapes_are_decoded_as_each_spelling_reads_them() {
        use super::{decode_all, decode_unreserved};
        // The path, with unreserved bytes decoded, with every byte decoded
        // (the path itself when it has only unreserved escapes: that
        // spelling is tried already).
        for (path, unreserved, all) in [
            ("/%61pi/%7E%2D%5f", "/api/~-_", "/%61pi/%7E%2D%5f"),
            ("/api%2Fx%20%", "/api%2Fx%20%", "/api/x %"),
            ("/%6", "/%6", "/%6"),
            ("/é%61", "/éa", "/é%61"),
            (
                "/files/private%2Freport",
                "/files/private%2Freport",
                "/files/private/report",
            ),
            ("/a%2fb%25%41", "/a%2fb%25A", "/a/b%A"),
            ("/%ff", "/%ff", "/\u{fffd}"),
        ] {
            assert_eq!(decode_unreserved(path), unreserved, "{path}");
            assert_eq!(decode_all(path), all, "{path}");
        }
        // Nothing but unreserved escapes: that spelling is tried already.
        assert!(matches!(
            decode_all("/%61pi"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(matches!(decode_all("/api"), std::borrow::Cow::Borrowed(_)));
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
}

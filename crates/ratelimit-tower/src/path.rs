//! The path as rules see it: repeated slashes merged and dot segments
//! resolved, so `/api//x`, `/api/./x` and `/api/y/../x` are all `/api/x`.
//!
//! Servers and proxies behind the layer may normalise a path this way before
//! routing; matching the raw path would let such spellings skip a route's
//! limit. Merging only ever makes more spellings match a rule, never fewer.
//! Case and percent-encoded bytes other than dots (`%2F`) are left as they
//! are: axum routes on them as they are (see SECURITY.md).

use std::borrow::Cow;

/// `path` with repeated slashes merged and `.`/`..` segments (also spelled
/// `%2e`) resolved; `..` never climbs above the root. Borrowed, without
/// allocating, when there is nothing to change.
pub(crate) fn normalize(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || !needs_normalizing(path) {
        return Cow::Borrowed(path);
    }
    let mut segments: Vec<&str> = Vec::new();
    // Whether the result ends with a slash: the path does, or its last
    // segment is a dot segment (`/a/b/..` is `/a/`).
    let mut trailing = false;
    for segment in path.split('/').skip(1) {
        trailing = true;
        match dots(segment) {
            _ if segment.is_empty() => {}
            Some(1) => {}
            Some(2) => {
                segments.pop();
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
    Cow::Owned(out)
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

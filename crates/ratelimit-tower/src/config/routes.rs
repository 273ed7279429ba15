//! Which requests a rule's route prefixes cover.
//!
//! A route rule must cover every request the router runs under its route,
//! whatever the client's spelling, and whatever reads the path on the way.
//! A rule applies when one of its prefixes covers one reading of the path
//! (each only adds matches). A reading is a list of segments; a path ending
//! with a slash reads with a last, empty one. Case is kept: axum routes on
//! it as it is (SECURITY.md).
//!
//! With the layer on axum's router, the route is known (`MatchedPath`) and
//! no hop sits between, so the readings follow it: the route, the path as
//! routed, below the route's wildcard, and as a service given the path may
//! resolve it ([`Routes::covers_as_routed`]); and, where a parameter holds
//! an encoded slash or what a hop reads otherwise, every way, since a
//! handler or service may hand it on as a path.
//! Elsewhere the layer does not know the route, so it reads the path every
//! way it may be read:
//!
//! - what reaches the router: the path as sent, or as one or two hops in
//!   front of it may forward it: backslashes as slashes, path parameters
//!   (`;...`) dropped, slashes merged and
//!   dot segments resolved (`%2e` a dot or not, empty segments kept or
//!   not), escapes decoded before or after ([`Routes::covers_path`]);
//! - what the router routes on: the path's segments, each as axum's `Path`
//!   decodes a parameter (`a%3Ab` is `a:b`, `a%2Fb` the one segment `a/b`;
//!   a prefix's segments are read the same way, so escapes match however
//!   they are written);
//! - what a handler serves under a wildcard, if it cleans its tail from its
//!   own root (`..` never above it, as Go's `http.Dir` does): the segments
//!   above the root, then the tail decoded and cleaned. The root is
//!   unknown, so each is tried: between the first segments a prefix has,
//!   and inside a segment (axum's `/download-{*path}`) where a prefix's
//!   segment can be spelled ([`Routes::covers_routed`]).
//!
//! One pass over the path per way a hop may forward it, and a few segments
//! compared per root. A path longer than [`LONGEST_PATH_READ`] that a hop
//! would read otherwise, or one whose readings would take more than
//! [`READING_BUDGET`] bytes, is counted instead, under every rule not yet
//! covered: no request costs more than some 16 KiB of readings, whatever
//! it holds, however many rules there are. A configuration's rules read a
//! path once for all of them ([`Budget`] says which rules are asked and
//! covered), so the readings do not multiply with the rules; each is
//! compared with the prefixes of the rules not yet covered.

use std::borrow::Cow;
use std::cell::Cell;

use http::Request;

use crate::path::{
    contains_ignoring_case, decode_escapes, dots, dots_resolved_keeping_empty_segments, escaped,
    needs_normalizing, normalize, normalize_literal_dots,
};

/// One segment of a route prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    /// A segment as `Path` decodes one.
    Literal(String),
    /// `{name}`: any one segment, an empty one included (axum runs
    /// `/users/{id}/posts` for `/users//posts`).
    Param,
    /// A last `{*name}` (`wildcard`), or the empty segment after a last
    /// slash (`/api/`): at least one segment more. On the router a
    /// wildcard's is never a route's trailing slash: axum runs no
    /// `/files/{*path}` for `/files/`.
    Below { wildcard: bool },
}

/// One route prefix, its segments read as a path's are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Prefix(Box<[Wanted]>);

impl Prefix {
    /// `written` (validated by the schema: starts with `/`, parameters whole
    /// segments), and, when it writes an encoded slash, the same with it
    /// decoded into a segment boundary (`/files/private%2Fr` is also
    /// `/files/private/r`, as a wildcard's tail decodes it).
    fn compile(written: &str) -> Vec<Prefix> {
        let read = |prefix: &str, decode: bool| {
            let segments = prefix.strip_prefix('/').unwrap_or(prefix).split('/');
            Prefix(
                segments
                    .map(|segment| match segment {
                        "" => Wanted::Below { wildcard: false },
                        _ if segment.starts_with("{*") => Wanted::Below { wildcard: true },
                        _ if segment.starts_with('{') => Wanted::Param,
                        _ if decode => Wanted::Literal(decode_segment(segment).into_owned()),
                        _ => Wanted::Literal(segment.to_owned()),
                    })
                    .collect(),
            )
        };
        let mut prefixes = vec![read(written, true)];
        if has_encoded_slash(written) {
            let decoded = decode_escapes(written, |_| false);
            prefixes.push(read(&decoded, false));
        }
        prefixes
    }

    /// Whether this prefix covers the `segments` of a route template as
    /// axum registers it (`MatchedPath`): a literal segment of the prefix
    /// matches the route's literal segment, never a parameter's braces.
    /// The route's trailing slash (an empty last segment) is no parameter's
    /// value: `/users/` is not under `/users/{id}`.
    #[cfg(feature = "axum")]
    fn covers_route(&self, segments: &[&str]) -> bool {
        self.covers_with(
            segments.len(),
            |i, literal| {
                let segment = segments[i];
                !has_a_parameter(segment) && decode_segment(&unescape_braces(segment)) == literal
            },
            |i| !segments[i].is_empty(),
        )
    }

    /// Whether this prefix covers `reading`, segment by segment.
    fn covers(&self, reading: &[&str]) -> bool {
        self.covers_with(reading.len(), |i, literal| reading[i] == literal, |_| true)
    }

    /// [`Prefix::covers`] of the `reading` of a path routed on a route of
    /// as many segments, `route`: where the route has an empty segment (a
    /// trailing slash), the path's is no parameter's value.
    #[cfg(feature = "axum")]
    fn covers_as_routed(&self, reading: &[&str], route: &[&str]) -> bool {
        self.covers_with(
            reading.len(),
            |i, literal| reading[i] == literal,
            |i| !(reading[i].is_empty() && route.get(i).is_some_and(|s| s.is_empty())),
        )
    }

    /// Whether this prefix covers `len` segments, the `i`th of which its
    /// literal segment matches when `literal_at(i, literal)` says so, and a
    /// parameter (or a wildcard, its first segment) when `param_at(i)` does.
    fn covers_with(
        &self,
        len: usize,
        literal_at: impl Fn(usize, &str) -> bool,
        param_at: impl Fn(usize) -> bool,
    ) -> bool {
        for (i, wanted) in self.0.iter().enumerate() {
            match wanted {
                Wanted::Below { wildcard } => return len > i && (!wildcard || param_at(i)),
                Wanted::Param if len <= i || !param_at(i) => return false,
                Wanted::Param => {}
                Wanted::Literal(literal) => {
                    if i >= len || !literal_at(i, literal) {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// The route prefixes of one rule, or of every rule of a configuration,
/// each prefix with its rule's index: a request's path is read once for
/// all of them, each reading matched against the prefixes of the rules
/// not yet covered, until every rule asked is covered or the readings end
/// (a rule's prefixes beside another's change nothing of what covers it).
#[derive(Debug, Clone, Default)]
pub(super) struct Routes {
    prefixes: Box<[(Prefix, usize)]>,
    /// The most segments a prefix has: the roots worth trying are above it
    /// (more roots than a rule's own prefixes have read the same for it).
    depth: usize,
}

impl Routes {
    /// The prefixes `written`, as a rule's `routes` give them: rule 0.
    #[cfg(test)]
    pub(super) fn new<'a>(written: impl IntoIterator<Item = &'a str>) -> Routes {
        Routes::join([Routes::of(written)])
    }

    /// The prefixes of one rule, not yet numbered.
    pub(super) fn of<'a>(written: impl IntoIterator<Item = &'a str>) -> Vec<Prefix> {
        written.into_iter().flat_map(Prefix::compile).collect()
    }

    /// The prefixes of each rule of `rules`, the rules numbered in order.
    pub(super) fn join(rules: impl IntoIterator<Item = Vec<Prefix>>) -> Routes {
        let prefixes: Box<[(Prefix, usize)]> = rules
            .into_iter()
            .enumerate()
            .flat_map(|(rule, prefixes)| prefixes.into_iter().map(move |p| (p, rule)))
            .collect();
        let depth = prefixes.iter().map(|(p, _)| p.0.len()).max().unwrap_or(0);
        Routes { prefixes, depth }
    }

    /// Reads `req`'s path every way it may be read (see the module docs),
    /// marking in `budget` each rule it asks for whose prefixes cover it;
    /// true once every one is covered.
    pub(super) fn read<B>(&self, req: &Request<B>, budget: &Budget) -> bool {
        // A target that is no path (`CONNECT host:443`, `OPTIONS *`) is
        // read as the root, which a rule on `/` covers.
        if !req.uri().path().starts_with('/') {
            return self.covers_path("/", budget);
        }
        #[cfg(feature = "axum")]
        {
            let extensions = req.extensions();
            let original = extensions.get::<axum::extract::OriginalUri>();
            if let Some(matched) = extensions.get::<axum::extract::MatchedPath>() {
                // On the router, the route is known and no hop sits between.
                let routed = Routed {
                    path: original.map_or(req.uri().path(), |uri| uri.path()),
                    nested: extensions
                        .get::<axum::extract::NestedPath>()
                        .map(|nested| nested.as_str()),
                };
                return self.covers_as_routed(&routed, matched.as_str(), budget);
            }
            // The original path, where nesting has changed it.
            if let Some(original) = original
                && original.path() != req.uri().path()
                && self.covers_path(original.path(), budget)
            {
                return true;
            }
        }
        self.covers_path(req.uri().path(), budget)
    }

    /// Marks the rules asked for whose prefixes cover `reading`; true once
    /// every one is covered.
    fn covers(&self, reading: &[&str], budget: &Budget) -> bool {
        self.hit(budget, |prefix| prefix.covers(reading))
    }

    /// Marks the rules asked for, not yet covered, with a prefix for which
    /// `covers` says so; true once every one is covered.
    fn hit(&self, budget: &Budget, covers: impl Fn(&Prefix) -> bool) -> bool {
        for (prefix, rule) in &*self.prefixes {
            if budget.open(*rule) && covers(prefix) && budget.cover(*rule) {
                return true;
            }
        }
        false
    }

    /// Whether a prefix covers `path` as the router reads it, or as a hop
    /// (or two) in front of it may forward it: a backslash taken for a
    /// slash (Istio, Cloudflare); path parameters dropped (`;...` in a
    /// segment, as Tomcat, Jetty and Spring read a path); read as a URL
    /// parser reads it; slashes merged and dot segments resolved, `%2e` as
    /// a dot (RFC 3986) or not (a hop that leaves escapes alone); escapes
    /// decoded, before resolving or after: every one (an encoded slash then
    /// a separator, a `?` or `#` the end of the path), by one hop or two,
    /// or all but `%`, `?` and `#` (as nginx forwards a path, and as a hop
    /// that decodes only `%2F` reads for the router, which decodes the
    /// rest).
    fn covers_path(&self, path: &str, budget: &Budget) -> bool {
        if self.covers_routed(path, budget) {
            return true;
        }
        let backslash = path.contains('\\') || contains_ignoring_case(path, "%5c");
        let url_read = as_a_url_parser_reads(path);
        if !(path.contains("//")
            || path.contains("/.")
            || path.contains('%')
            || path.contains(';')
            || backslash
            || url_read.is_some())
        {
            return false;
        }
        if path.len() > LONGEST_PATH_READ {
            return budget.cover_every_rule();
        }
        let mut sent = vec![path.to_owned()];
        if backslash {
            sent.push(
                path.replace('\\', "/")
                    .replace("%5C", "/")
                    .replace("%5c", "/"),
            );
        }
        if path.contains(';') {
            sent.push(without_path_parameters(path));
        }
        sent.extend(url_read);
        // Each reading is read as it is made, so a path stops at the first
        // that a prefix covers; what a decoding hop uncovered in it (`%3B`,
        // `%09`, `%3F`) is read again: path parameters dropped, and as a URL
        // parser reads a path.
        let mut seen = std::collections::HashSet::from([path.to_owned()]);
        let mut reads = |reading: String| {
            // Out of budget: counted (see `READING_BUDGET`).
            if !budget.spend(reading.len()) {
                return budget.cover_every_rule();
            }
            let uncovered = [
                reading
                    .contains(';')
                    .then(|| without_path_parameters(&reading)),
                as_a_url_parser_reads(&reading),
            ];
            std::iter::once(reading)
                .chain(uncovered.into_iter().flatten())
                .any(|reading| {
                    if seen.contains(&reading) {
                        return false;
                    }
                    if !budget.spend(reading.len()) {
                        return budget.cover_every_rule();
                    }
                    let covered = self.covers_routed(&reading, budget);
                    seen.insert(reading);
                    covered
                })
        };
        let decoders: [fn(&str) -> String; 2] = [decoded_by_a_hop, decoded_but_query_marks];
        for sent in sent {
            let resolved = resolved_every_way(&sent);
            if resolved.iter().cloned().any(&mut reads) {
                return true;
            }
            if sent.contains('%') {
                for decode in decoders {
                    let decoded = decode(&sent);
                    if resolved_every_way(&decoded).into_iter().any(&mut reads)
                        || resolved.iter().map(|path| decode(path)).any(&mut reads)
                        || reads(decoded)
                    {
                        return true;
                    }
                }
            }
            if reads(sent) {
                return true;
            }
        }
        // Two hops that each decode every escape (`%25` hides a second
        // one), the last perhaps taking a backslash for a slash.
        if contains_ignoring_case(path, "%25") {
            let twice = decoded_by_a_hop(&decoded_by_a_hop(path));
            let slashed = twice.replace('\\', "/");
            return [twice, slashed]
                .into_iter()
                .any(|twice| reads(normalize(&twice).into_owned()) || reads(twice));
        }
        false
    }

    /// Whether a prefix covers `path` as the router reads it (its segments,
    /// each decoded as `Path` decodes them), or as a handler below a
    /// wildcard's root reads it. One pass over the path from its end finds,
    /// at each root between the first segments, what the tail cleans to
    /// (the segments kept, the last first, and the `..` left over); and at
    /// each segment's first part (before an encoded slash, which `Path`
    /// decodes into the tail), the same past it, for a root inside it.
    fn covers_routed(&self, path: &str, budget: &Budget) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let raw: Vec<&str> = rest.split('/').collect();
        // Enough segments for any prefix to tell, each decoded.
        let segments: Vec<Cow<'_, str>> = raw
            .iter()
            .take(self.depth + 1)
            .map(|segment| decode_segment(segment))
            .collect();
        let plain: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
        if self.covers(&plain, budget) {
            return true;
        }
        let cleaning = needs_cleaning(path);
        let dot_dot = path.contains("..") || contains_ignoring_case(path, "%2e");
        // The rules (asked, not yet covered) with a prefix that may have a
        // root inside a segment: each of their prefixes is tried there.
        // Made only when one has (most paths have none).
        let mut inside: Vec<bool> = Vec::new();
        for (prefix, rule) in &*self.prefixes {
            if budget.open(*rule) && may_have_a_root_inside(prefix, &plain, dot_dot) {
                if inside.is_empty() {
                    inside = vec![false; budget.rules()];
                }
                inside[*rule] = true;
            }
        }
        let any_inside = !inside.is_empty();
        if !cleaning && !any_inside {
            return false;
        }
        let depth = self.depth.min(raw.len());
        let mut kept: Vec<Cow<'_, str>> = Vec::new();
        let mut pending = 0;
        let mut between = vec![0; depth];
        let mut within = vec![("", 0, 0); depth];
        for (i, segment) in raw.iter().enumerate().rev() {
            let mut first = *segment;
            if has_encoded_slash(segment) {
                let parts = parts_of(segment);
                for part in parts[1..].iter().rev() {
                    clean_back(part, &mut kept, &mut pending);
                }
                first = parts[0];
            }
            if let Some(state) = within.get_mut(i) {
                *state = (first, kept.len(), pending);
            }
            clean_back(first, &mut kept, &mut pending);
            if let Some(state) = between.get_mut(i) {
                *state = kept.len();
            }
        }
        // A cleaned tail ends with a slash where the path ends with an empty
        // or dot segment (`/files/../private/` is `private/`).
        let trailing = raw
            .last()
            .and_then(|last| parts_of(last).pop())
            .is_some_and(|last| dots(last).is_some());
        // Enough segments for any prefix to tell.
        let shown = |above: usize| (self.depth + 1).saturating_sub(above);
        if cleaning {
            // A tail whose segments are all dropped ends with a slash: its
            // last one is empty or dots.
            if self.covers_below_a_root(&plain, &kept, &between, trailing, budget) {
                return true;
            }
        }
        if !any_inside {
            return false;
        }
        for (prefix, rule) in &*self.prefixes {
            let rule = *rule;
            if !inside[rule] {
                continue;
            }
            for (s, wanted) in prefix.0.iter().enumerate() {
                // Covered by another reading or prefix meanwhile.
                if !budget.open(rule) {
                    break;
                }
                let Some(&(first, kept_len, pending)) = within.get(s) else {
                    break;
                };
                let next = kept_len
                    .checked_sub(1)
                    .map_or("", |last| kept[last].as_ref());
                let rest = &kept[..kept_len.saturating_sub(1)];
                let slash = trailing && kept_len > 0;
                match wanted {
                    Wanted::Below { .. } => break,
                    // Any root works for a parameter, joined to the tail's
                    // first segment: the first part, without the dots
                    // dropped. An empty part dropped, or the part kept as a
                    // segment of its own, would join or split any segments
                    // (`/a/b/private` under `/{dir}/private`): only the
                    // router's route tells (`covers_as_routed`).
                    Wanted::Param => {
                        let first = decode_segment(first);
                        if kept_len == 0 || !(pending > 0 || ends_with_a_dot_segment(&first)) {
                            continue;
                        }
                        let joined = format!("{}{next}", first.trim_end_matches('.'));
                        if prefix.covers(&reading_with(&plain[..s], &joined, rest, shown(s), slash))
                            && budget.cover(rule)
                        {
                            return true;
                        }
                    }
                    Wanted::Literal(literal) => {
                        // The root where the segment's start is the literal,
                        // the tail after it, where the part after the root
                        // is dropped (`/static{*path}` serves
                        // `/static../private/r` as `/static/private/r`).
                        // Kept, it would split any segment (`/apiary` under
                        // `/api`): only the router's route tells.
                        let separated = raw_cut(first, literal).filter(|&cut| {
                            pending > 0 || first.get(cut..).and_then(dots).is_some()
                        });
                        if separated.is_some()
                            && prefix.covers(&reading_with(
                                &plain[..s],
                                literal,
                                &kept[..kept_len],
                                shown(s),
                                trailing,
                            ))
                            && budget.cover(rule)
                        {
                            return true;
                        }
                        // The one root where the segment's start and the
                        // tail's first segment spell the literal; the part
                        // after the root must be dropped (empty, dots, or
                        // undone by `..`).
                        let Some(start) = literal.strip_suffix(next) else {
                            continue;
                        };
                        let Some(cut) = raw_cut(first, start) else {
                            continue;
                        };
                        let dropped = first.get(cut..).and_then(dots);
                        if start.is_empty() || (dropped.is_none() && pending == 0) {
                            continue;
                        }
                        let joined = format!("{start}{next}");
                        if prefix.covers(&reading_with(&plain[..s], &joined, rest, shown(s), slash))
                            && budget.cover(rule)
                        {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Whether a prefix covers a path below one of its roots: the segments
    /// `above` it (as many as the root's index), then what the rest cleans
    /// to from there (`kept`, the last first, the first `between[root]` of
    /// them), and the empty segment of a trailing slash (`slash`).
    fn covers_below_a_root(
        &self,
        above: &[&str],
        kept: &[Cow<'_, str>],
        between: &[usize],
        slash: bool,
        budget: &Budget,
    ) -> bool {
        between.iter().enumerate().any(|(root, &kept_len)| {
            let shown = (self.depth + 1).saturating_sub(root);
            self.covers(
                &reading(&above[..root], &kept[..kept_len], shown, slash),
                budget,
            )
        })
    }

    /// Whether a prefix covers `path` as axum's router routed it on `route`
    /// (its `MatchedPath`, as registered; `path` before any nesting), where
    /// no hop sits between:
    ///
    /// - without a wildcard, the path's segments, each decoded as `Path`
    ///   decodes a parameter (an encoded slash is no separator);
    /// - with one, the segments above the wildcard, then its tail decoded
    ///   (an encoded slash a separator, as `Path` hands it over), as it is
    ///   and cleaned from the wildcard's root as a handler cleans it (`%2e`
    ///   in the decoded tail a name: `Path` decodes once), the wildcard's
    ///   start joined to the tail's first segment or a segment of its own
    ///   (`/download-/private/r` is `download-private/r` to
    ///   `/download-{*path}`, `/staticprivate/r` is `static/private/r` to
    ///   `/static{*path}`);
    /// - either way, a path with dot segments cleaned as a service given it
    ///   cleans it (`route_service`): whole, or below a nest's prefix
    ///   ([`Routes::covers_cleaned_whole`]);
    /// - a router mounted whole with `route_service` below a wildcard
    ///   registers its own route after that wildcard's segment
    ///   ([`mounted_route`]), matched on the path it was given: `path`
    ///   without the prefixes of the nests around the outer router. That
    ///   route is read after them ([`inner_routes`]), never the joined one.
    ///
    /// A path that does not follow the route segment by segment, or a route
    /// this does not read (a parameter inside the wildcard's segment), is
    /// read every way instead ([`Routes::covers_path`]).
    #[cfg(feature = "axum")]
    fn covers_as_routed(&self, routed: &Routed<'_>, route: &str, budget: &Budget) -> bool {
        let path = routed.path;
        // A route the path does not follow segment by segment (axum joins a
        // router mounted with `route_service` on a route without a wildcard
        // to that route) says nothing of it: read it every way.
        if !follows(path, route) {
            return self.covers_path(path, budget);
        }
        if let Some((above, inner)) = mounted_route(route) {
            // Not the joined route itself: the outer wildcard's braces are
            // no segment of the path.
            let mut followed = false;
            for route in inner_routes(above, inner, routed.nested) {
                if follows(path, &route) {
                    followed = true;
                    if self.covers_as_routed(routed, &route, budget) {
                        return true;
                    }
                }
            }
            return !followed && self.covers_path(path, budget);
        }
        let route_segments: Vec<&str> = route
            .strip_prefix('/')
            .unwrap_or(route)
            .split('/')
            .collect();
        if self.hit(budget, |prefix| prefix.covers_route(&route_segments)) {
            return true;
        }
        let (Some(template), Some(rest)) = (route.strip_prefix('/'), path.strip_prefix('/')) else {
            return self.covers_path(path, budget);
        };
        // A parameter's value may be handed on as a path, by a handler or
        // by a service mounted on the route (`/admin%2Fkeys` on
        // `/{service}` is `/admin/keys` to a backend that decodes the
        // path, as Go's `http.FileServer` does): where a segment above the
        // wildcard decodes to what a hop reads otherwise, the path is read
        // every way too.
        let above_wildcard =
            wildcard_at(template).map_or(usize::MAX, |star| template[..star].matches('/').count());
        if rest
            .split('/')
            .take(above_wildcard)
            .map(decode_segment)
            .any(|segment| segment.contains('/') || a_hop_reads_otherwise(&segment))
            && self.covers_path(path, budget)
        {
            return true;
        }
        let Some(star) = wildcard_at(template) else {
            let segments: Vec<Cow<'_, str>> = rest.split('/').map(decode_segment).collect();
            let segments: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
            let templates: Vec<&str> = template.split('/').collect();
            return self.hit(budget, |prefix| {
                prefix.covers_as_routed(&segments, &templates)
            }) || self.covers_as_served(path, route, budget);
        };
        // The wildcard's segment: its literal start, and the segments above.
        let (whole, start) = match template[..star].rfind('/') {
            Some(at) => (&template[..at], &template[at + 1..star]),
            None => ("", &template[..star]),
        };
        if has_a_parameter(start) {
            return self.covers_path(path, budget);
        }
        let start = unescape_braces(start);
        let mut segments = rest.split('/');
        let mut above: Vec<Cow<'_, str>> = Vec::new();
        let mut root = 1;
        // The path follows the route: a segment for each above.
        for segment in segments
            .by_ref()
            .take(whole.split('/').filter(|_| !whole.is_empty()).count())
        {
            above.push(decode_segment(segment));
            root += segment.len() + 1;
        }
        let Some(tail) = path
            .get(root..)
            .and_then(|tail| tail.strip_prefix(start.as_ref()))
        else {
            return self.covers_path(path, budget);
        };
        let above: Vec<&str> = above.iter().map(|s| s.as_ref()).collect();
        let start = decode_segment(&start);
        let decoded = decode_escapes(tail, |_| false);
        // A handler may hand its tail to another server (a proxy, a URL
        // parser), which reads it again: where what `Path` gave holds an
        // escape, a backslash, a path parameter, a query mark, a space or
        // a control character, the path with that tail is read every way
        // a hop's may be.
        if a_hop_reads_otherwise(&decoded) {
            let handed = format!("{}{decoded}", &path[..path.len() - tail.len()]);
            if self.covers_path(&handed, budget) {
                return true;
            }
        }
        let cleaned = normalize_literal_dots(&format!("/{decoded}"));
        for tail in [decoded.as_str(), &cleaned[1..]] {
            let tail: Vec<&str> = tail.split('/').take(self.depth + 1).collect();
            let joined = format!("{start}{}", tail[0]);
            let mut read = above.clone();
            read.push(&joined);
            read.extend(&tail[1..]);
            if self.covers(&read, budget) {
                return true;
            }
            let mut read = above.clone();
            read.push(&start);
            read.extend(&tail);
            if !start.is_empty() && self.covers(&read, budget) {
                return true;
            }
        }
        self.covers_as_served(path, route, budget)
    }

    /// Whether a prefix covers `path`, routed on `route`, as a service given
    /// it may read it: cleaned ([`Routes::covers_cleaned_whole`]), and,
    /// where it has path parameters (`;` in a segment), without them, as
    /// Tomcat, Jetty and Spring read a path before decoding and cleaning it
    /// (`/api/x/..;/admin` is `/api/admin` to them).
    #[cfg(feature = "axum")]
    fn covers_as_served(&self, path: &str, route: &str, budget: &Budget) -> bool {
        if self.covers_cleaned_whole(path, route, budget) {
            return true;
        }
        if !path.contains(';') {
            return false;
        }
        let path = without_path_parameters(path);
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let segments: Vec<Cow<'_, str>> = rest
            .split('/')
            .take(self.depth + 1)
            .map(decode_segment)
            .collect();
        self.covers(
            &segments.iter().map(|s| s.as_ref()).collect::<Vec<_>>(),
            budget,
        ) || self.covers_cleaned_whole(&path, route, budget)
    }

    /// Whether a prefix covers `path`, routed on `route`, with its dot
    /// segments resolved as a service given it resolves them, before
    /// decoding (an encoded slash in a parameter stays in it), empty
    /// segments dropped (slashes merged) or kept (RFC 3986, Envoy's
    /// `normalize_path`), or after decoding, where an encoded slash hides
    /// a dot segment (Go's `http.FileServer`): the whole path, or the path below a nest's prefix
    /// (which axum strips before the service sees it) under that prefix. A
    /// nest's prefix is whole segments of the route, the first few: each
    /// count of them is tried. False for a path without dot or empty
    /// segments, or dot segments behind an encoded slash. One pass from the
    /// path's end per way of resolving finds what the path below each count
    /// cleans to.
    #[cfg(feature = "axum")]
    fn covers_cleaned_whole(&self, path: &str, route: &str, budget: &Budget) -> bool {
        let (Some(rest), Some(template)) = (path.strip_prefix('/'), route.strip_prefix('/')) else {
            return false;
        };
        let raw: Vec<&str> = rest.split('/').collect();
        let last = raw.len() - 1;
        // Which ways of resolving can change anything: raw dot or empty
        // segments (`%2e` a dot, or only literal dots), or dot segments an
        // encoded slash hides, for a service that decodes the path first
        // (Go's `http.FileServer`).
        let cleans = |dots: DotsOf| {
            raw.iter().enumerate().any(|(i, segment)| {
                matches!(dots(segment), Some(1 | 2)) || (segment.is_empty() && i < last)
            })
        };
        let percent_dots = cleans(dots);
        let written_dots = contains_ignoring_case(path, "%2e") && cleans(literal_dots);
        let hidden_dots = has_encoded_slash(path)
            && raw.iter().any(|segment| {
                parts_of(segment)
                    .iter()
                    .any(|part| matches!(dots(part), Some(1 | 2)))
            });
        if !percent_dots && !written_dots && !hidden_dots {
            return false;
        }
        // The roots a nest's prefix may end at: after whole segments of the
        // route, before its wildcard, that the path follows.
        let roots = template
            .split('/')
            .zip(&raw)
            .take_while(|(wanted, segment)| {
                wildcard_at(wanted).is_none()
                    && (has_a_parameter(wanted) || unescape_braces(wanted) == **segment)
            })
            .count()
            .min(self.depth);
        let above: Vec<Cow<'_, str>> = raw[..roots].iter().map(|s| decode_segment(s)).collect();
        let above: Vec<&str> = above.iter().map(|s| s.as_ref()).collect();
        // Each way: how dots are told, empty segments kept (RFC 3986,
        // Envoy) or dropped (slashes merged), encoded slashes decoded first.
        let ways: [(DotsOf, bool, bool, bool); 6] = [
            (dots, false, false, percent_dots),
            (dots, true, false, percent_dots),
            (literal_dots, false, false, written_dots),
            (literal_dots, true, false, written_dots),
            (dots, false, true, hidden_dots),
            (dots, true, true, hidden_dots),
        ];
        for (dots, keep_empty, decoded, useful) in ways {
            if !useful {
                continue;
            }
            let mut kept: Vec<Cow<'_, str>> = Vec::new();
            let mut pending = 0;
            let mut between = vec![0; roots + 1];
            for (i, segment) in raw.iter().enumerate().rev() {
                let parts = if decoded {
                    parts_of(segment)
                } else {
                    vec![*segment]
                };
                for part in parts.into_iter().rev() {
                    clean_back_with(part, dots, keep_empty, &mut kept, &mut pending);
                }
                if let Some(at) = between.get_mut(i) {
                    *at = kept.len();
                }
            }
            // A path ending with an empty or dot segment cleans to one
            // ending with a slash; kept, a last empty segment is that
            // slash already.
            let end = if decoded {
                parts_of(raw[last]).pop().unwrap_or_default()
            } else {
                raw[last]
            };
            let slash = dots(end).is_some() && !(keep_empty && end.is_empty());
            if self.covers_below_a_root(&above, &kept, &between, slash, budget) {
                return true;
            }
        }
        false
    }
}

/// A request as axum's router routed it.
#[cfg(feature = "axum")]
struct Routed<'a> {
    /// The whole path (`OriginalUri`'s).
    path: &'a str,
    /// The nests' prefixes, as registered (`NestedPath`), if the layer is
    /// nested.
    nested: Option<&'a str>,
}

/// The routes a router mounted below a wildcard (see [`mounted_route`])
/// may have matched: `inner`, its own, after each count of the segments
/// `above` (which of these were nests' prefixes the joined route does not
/// say). With `nested`, the nests' prefixes around it and inside it, only
/// the counts whose route starts with those.
#[cfg(feature = "axum")]
fn inner_routes(above: &str, inner: &str, nested: Option<&str>) -> Vec<String> {
    let above: Vec<&str> = above.split('/').skip(1).collect();
    let routes = (0..=above.len()).map(|nests| {
        above[..nests]
            .iter()
            .flat_map(|segment| ["/", segment])
            .chain([inner])
            .collect::<String>()
    });
    let Some(nested) = nested else {
        // Not nested: no nest's prefix is among them.
        return routes.take(1).collect();
    };
    let nested: Vec<&str> = nested.trim_matches('/').split('/').collect();
    let starts_with_nested = |route: &String| {
        let segments: Vec<&str> = route[1..].split('/').collect();
        segments.len() >= nested.len() && segments[..nested.len()] == nested[..]
    };
    let all: Vec<String> = routes.collect();
    if all.iter().any(starts_with_nested) {
        all.into_iter().filter(starts_with_nested).collect()
    } else {
        all
    }
}

/// A route joined from a router mounted whole with `route_service` below
/// a wildcard and that router's own route (`/api/{*rest}` and
/// `/projects/{id}` make `/api/{*rest}/projects/{id}`): what comes before
/// the first wildcard's segment (`/api`; empty, or starting with `/`), and
/// the inner router's route, which follows that segment. A route of its
/// own never has a wildcard before its last segment.
#[cfg(feature = "axum")]
fn mounted_route(route: &str) -> Option<(&str, &str)> {
    let star = wildcard_at(route)?;
    let slash = star + route[star..].find('/')?;
    let above = route[..star].rfind('/').map_or("", |at| &route[..at]);
    Some((above, &route[slash..]))
}

/// Whether `path` follows `route` (a `MatchedPath`) up to its first
/// wildcard: each literal segment as written, a segment with a parameter
/// any, the wildcard's segment starting with its literal start; without a
/// wildcard, as many segments.
#[cfg(feature = "axum")]
fn follows(path: &str, route: &str) -> bool {
    let (Some(route), Some(path)) = (route.strip_prefix('/'), path.strip_prefix('/')) else {
        return false;
    };
    let mut segments = path.split('/');
    for template in route.split('/') {
        let Some(segment) = segments.next() else {
            return false;
        };
        if let Some(star) = wildcard_at(template) {
            let start = &template[..star];
            return has_a_parameter(start) || segment.starts_with(unescape_braces(start).as_ref());
        }
        if !has_a_parameter(template) && unescape_braces(template) != segment {
            return false;
        }
    }
    segments.next().is_none()
}

/// Whether a hop handed `decoded` as (part of) a path may read it otherwise
/// than the router: it holds an escape, a backslash, a path parameter, a
/// query mark, a space or a control character.
#[cfg(feature = "axum")]
fn a_hop_reads_otherwise(decoded: &str) -> bool {
    decoded
        .contains(|c: char| matches!(c, '%' | '\\' | ';' | '?' | '#' | ' ') || c.is_ascii_control())
}

/// Where the first wildcard of a route template (or of one of its
/// segments) starts: its `{*`, not an escaped `{{`.
#[cfg(feature = "axum")]
fn wildcard_at(template: &str) -> Option<usize> {
    // Same length: the offset found is the template's.
    let unescaped = template.replace("{{", "\0\0");
    unescaped.find("{*")
}

/// Whether a route template's segment holds a parameter, not only braces
/// escaped as `{{` and `}}`.
#[cfg(feature = "axum")]
fn has_a_parameter(segment: &str) -> bool {
    segment
        .replace("{{", "")
        .replace("}}", "")
        .contains(['{', '}'])
}

/// A route template's literal text with its escaped braces as they match.
#[cfg(feature = "axum")]
fn unescape_braces(text: &str) -> Cow<'_, str> {
    if text.contains("{{") || text.contains("}}") {
        Cow::Owned(text.replace("{{", "{").replace("}}", "}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// `path` as a hop that decodes every escape forwards it: a `?` or `#` it
/// decodes ends the path (the rest is a query or a fragment to the router).
fn decoded_by_a_hop(path: &str) -> String {
    let mut decoded = decode_escapes(path, |_| false);
    if let Some(end) = decoded.find(['?', '#']) {
        decoded.truncate(end);
    }
    decoded
}

/// The longest path read every way a hop may read it: a longer one that
/// any hop would read otherwise (an escape, a dot segment, a backslash...)
/// is counted under every rule asked for it and not yet covered instead,
/// limited more, never less, and no client sends such paths.
const LONGEST_PATH_READ: usize = 2048;

/// The most bytes of readings a request's path is read as, for every rule
/// of a configuration at once: a path that would need more (one holding
/// many characters hops read otherwise, each doubling the ways) is counted
/// under every rule asked for it and not yet covered instead, limited
/// more, never less. A path with escapes, dot or empty segments or encoded
/// slashes is read whole up to [`LONGEST_PATH_READ`], one with `;` up to
/// some 1.5 KiB; one holding every kind of character hops read otherwise,
/// up to some 400 bytes.
const READING_BUDGET: usize = 16 * 1024;

/// One request's reading of its path: what is left of [`READING_BUDGET`],
/// and which rules it is asked for and which of them are covered so far.
pub(super) struct Budget {
    left: Cell<usize>,
    /// Per rule: not asked for, open (asked and not yet covered), or
    /// covered.
    rules: Box<[Cell<RuleState>]>,
    /// How many are open.
    opened: Cell<usize>,
}

/// Where a rule stands in one request's [`Budget`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum RuleState {
    NotAsked,
    Open,
    Covered,
}

impl Budget {
    /// A reading for rule 0 alone.
    #[cfg(test)]
    pub(super) fn new() -> Budget {
        Budget::asking([true])
    }

    /// A reading for the rules `asked` says (by index).
    pub(super) fn asking(asked: impl IntoIterator<Item = bool>) -> Budget {
        let rules: Box<[Cell<RuleState>]> = asked
            .into_iter()
            .map(|asked| {
                Cell::new(if asked {
                    RuleState::Open
                } else {
                    RuleState::NotAsked
                })
            })
            .collect();
        let opened = rules
            .iter()
            .filter(|rule| rule.get() == RuleState::Open)
            .count();
        Budget {
            left: Cell::new(READING_BUDGET),
            rules,
            opened: Cell::new(opened),
        }
    }

    /// How many rules the reading has a place for.
    fn rules(&self) -> usize {
        self.rules.len()
    }

    /// Takes `bytes` from what is left: false once it runs out.
    fn spend(&self, bytes: usize) -> bool {
        let left = self.left.get().checked_sub(bytes);
        self.left.set(left.unwrap_or(0));
        left.is_some()
    }

    /// Whether `rule` is asked for and not yet covered.
    fn open(&self, rule: usize) -> bool {
        self.state(rule) == RuleState::Open
    }

    fn state(&self, rule: usize) -> RuleState {
        self.rules.get(rule).map_or(RuleState::NotAsked, Cell::get)
    }

    /// Marks `rule` covered; true once every rule asked is.
    fn cover(&self, rule: usize) -> bool {
        if let Some(state) = self.rules.get(rule)
            && state.get() == RuleState::Open
        {
            state.set(RuleState::Covered);
            self.opened.set(self.opened.get() - 1);
        }
        self.opened.get() == 0
    }

    /// Counts the path under every rule still open (it is too long or too
    /// costly to read every way): true.
    fn cover_every_rule(&self) -> bool {
        for state in &*self.rules {
            if state.get() == RuleState::Open {
                state.set(RuleState::Covered);
            }
        }
        self.opened.set(0);
        true
    }

    /// Whether `rule` was asked for and is covered.
    pub(super) fn covered(&self, rule: usize) -> bool {
        self.state(rule) == RuleState::Covered
    }
}

/// `path` resolved as hops resolve it: slashes merged and dot segments
/// resolved (`%2e` a dot), dots as written only, empty segments kept, or
/// slashes merged alone; none when there is nothing to resolve.
fn resolved_every_way(path: &str) -> Vec<String> {
    if !needs_normalizing(path) {
        return Vec::new();
    }
    vec![
        normalize(path).into_owned(),
        normalize_literal_dots(path),
        dots_resolved_keeping_empty_segments(path),
        slashes_merged(path),
    ]
}

/// `path` as a URL parser reads it (the WHATWG URL standard, reqwest's
/// `Url`): tabs and newlines removed, the path ending at a `?` or `#`,
/// trailing spaces and control characters trimmed; none when that changes
/// nothing.
fn as_a_url_parser_reads(path: &str) -> Option<String> {
    if !path.contains(['\t', '\n', '\r', '?', '#'])
        && !path.ends_with(|c: char| c == ' ' || c.is_ascii_control())
    {
        return None;
    }
    let mut read: String = path
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    if let Some(end) = read.find(['?', '#']) {
        read.truncate(end);
    }
    let kept = read
        .trim_end_matches(|c: char| c == ' ' || c.is_ascii_control())
        .len();
    read.truncate(kept);
    Some(read)
}

/// `path` without its path parameters: each segment cut at its first `;`,
/// as Tomcat, Jetty and Spring read a path (`..;` is then `..`).
fn without_path_parameters(path: &str) -> String {
    let segments: Vec<&str> = path
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or_default())
        .collect();
    segments.join("/")
}

/// `path` with repeated slashes merged and nothing else, as a hop that only
/// merges slashes forwards it.
fn slashes_merged(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// `path` as a hop that decodes every escape but `%`, `?` and `#` forwards
/// it (nginx re-escapes those): the router sees the query marks still in
/// the path, and `Path` decodes them.
fn decoded_but_query_marks(path: &str) -> String {
    decode_escapes(path, |byte| matches!(byte, b'%' | b'?' | b'#'))
}

/// A reading: `above`, then `kept` (the last first), at most `shown` of
/// them, and the empty segment of a trailing slash (`slash`) after them all.
fn reading<'a>(
    above: &[&'a str],
    kept: &'a [Cow<'_, str>],
    shown: usize,
    slash: bool,
) -> Vec<&'a str> {
    let mut reading = above.to_vec();
    reading.extend(kept.iter().rev().take(shown).map(|s| s.as_ref()));
    if slash && kept.len() <= shown {
        reading.push("");
    }
    reading
}

/// [`reading`] with `segment` after `above`.
fn reading_with<'a>(
    above: &[&'a str],
    segment: &'a str,
    kept: &'a [Cow<'_, str>],
    shown: usize,
    slash: bool,
) -> Vec<&'a str> {
    let mut read = reading(above, kept, shown, slash);
    read.insert(above.len(), segment);
    read
}

/// The raw length of `part`'s start that decodes to `start`, if one does.
fn raw_cut(part: &str, start: &str) -> Option<usize> {
    let (bytes, want) = (part.as_bytes(), start.as_bytes());
    let (mut at, mut got) = (0, 0);
    while got < want.len() {
        let (byte, step) = match escaped(bytes, at) {
            Some(byte) if bytes[at] == b'%' => (byte, 3),
            _ => (*bytes.get(at)?, 1),
        };
        if byte != want[got] {
            return None;
        }
        got += 1;
        at += step;
    }
    Some(at)
}

/// `segment` with every escape decoded, as `Path` decodes a parameter;
/// bytes that are not UTF-8 replaced. Borrowed when it has none.
fn decode_segment(segment: &str) -> Cow<'_, str> {
    let bytes = segment.as_bytes();
    if !(0..bytes.len()).any(|at| bytes[at] == b'%' && escaped(bytes, at).is_some()) {
        return Cow::Borrowed(segment);
    }
    Cow::Owned(decode_escapes(segment, |_| false))
}

/// The parts of `segment` a wildcard's tail decodes it into: split at its
/// encoded slashes.
fn parts_of(segment: &str) -> Vec<&str> {
    let bytes = segment.as_bytes();
    let mut parts = Vec::new();
    let (mut from, mut at) = (0, 0);
    while at + 3 <= bytes.len() {
        if bytes[at..at + 3].eq_ignore_ascii_case(b"%2f") {
            parts.push(&segment[from..at]);
            at += 3;
            from = at;
        } else {
            at += 1;
        }
    }
    parts.push(&segment[from..]);
    parts
}

/// One step of cleaning a tail from its end back: `part`, the segment
/// before those seen, is dropped (empty or `.`), a `..` to match, undone by
/// one, or kept, decoded.
fn clean_back<'a>(part: &'a str, kept: &mut Vec<Cow<'a, str>>, pending: &mut usize) {
    clean_back_with(part, dots, false, kept, pending);
}

/// [`clean_back`] with `dots` telling the dot segments, and empty
/// segments kept (`keep_empty`: undone by a `..` like a name) or dropped.
fn clean_back_with<'a>(
    part: &'a str,
    dots: fn(&str) -> Option<usize>,
    keep_empty: bool,
    kept: &mut Vec<Cow<'a, str>>,
    pending: &mut usize,
) {
    match dots(part) {
        Some(0) if keep_empty && *pending > 0 => *pending -= 1,
        Some(0) if keep_empty => kept.push(Cow::Borrowed(part)),
        Some(2) => *pending += 1,
        Some(_) => {}
        None if *pending > 0 => *pending -= 1,
        None => kept.push(decode_segment(part)),
    }
}

/// How a way of cleaning tells a dot segment: how many dots it is made
/// of, if only dots ([`dots`], [`literal_dots`]).
#[cfg(feature = "axum")]
type DotsOf = fn(&str) -> Option<usize>;

/// How many dots `segment` is made of, written as dots (`%2e` a name), if
/// only dots: for a service that leaves escapes alone.
#[cfg(feature = "axum")]
fn literal_dots(segment: &str) -> Option<usize> {
    match segment {
        "" => Some(0),
        "." => Some(1),
        ".." => Some(2),
        _ => None,
    }
}

/// Whether cleaning a tail of `path` may change it: an empty or dot
/// segment, an escaped dot, or an encoded slash.
fn needs_cleaning(path: &str) -> bool {
    path.contains("//")
        || path
            .split('/')
            .skip(1)
            .any(|segment| matches!(dots(segment), Some(1 | 2)))
        || contains_ignoring_case(path, "%2e")
        || has_encoded_slash(path)
}

fn has_encoded_slash(path: &str) -> bool {
    contains_ignoring_case(path, "%2f")
}

/// Whether `segment` ends with a dot segment after something else
/// (`download-..`, `a.`; a root among three dots or more leaves one or two
/// after it): a root before the dots drops them.
fn ends_with_a_dot_segment(segment: &str) -> bool {
    let name = segment.trim_end_matches('.');
    !name.is_empty() && name.len() < segment.len()
}

/// Whether `prefix` may cover `segments` (a path's, decoded; `dot_dot`:
/// the path has a `..`) below a root inside one of them: the segments above
/// that one are the prefix's, and it starts as the prefix's does, or a
/// parameter matches it and it ends with a dot segment. Without a `..` to
/// undo part of a segment, the first that is not the prefix's is the only
/// literal one where a root can change anything. A few bytes per prefix
/// segment: a path that starts as no prefix does costs no pass.
fn may_have_a_root_inside(prefix: &Prefix, segments: &[&str], dot_dot: bool) -> bool {
    for (wanted, segment) in prefix.0.iter().zip(segments) {
        match wanted {
            Wanted::Below { .. } => return false,
            Wanted::Param if dot_dot || ends_with_a_dot_segment(segment) => return true,
            Wanted::Param => {}
            Wanted::Literal(literal) if literal.as_str() != *segment => {
                return literal.as_bytes().first() == segment.as_bytes().first();
            }
            Wanted::Literal(_) if dot_dot => return true,
            Wanted::Literal(_) => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "axum")]
    use super::Routed;
    use super::{Budget, LONGEST_PATH_READ, Prefix, Routes};

    /// Asserts, for each line of `cases` (a prefix, a path, and whether
    /// the prefix covers the path, however it is read: `yes` or `no`;
    /// `#` starts a comment), that it does or does not.
    fn assert_covers(cases: &str) {
        for line in cases
            .lines()
            .map(|line| line.split('#').next().unwrap_or_default())
        {
            let case: Vec<&str> = line.split_whitespace().collect();
            let [prefix, path, want] = case[..] else {
                assert!(case.is_empty(), "{line:?}");
                continue;
            };
            let covered = Routes::new([prefix]).covers_path(path, &Budget::new());
            assert_eq!(covered, want == "yes", "{prefix} on {path}");
        }
    }

    #[test]
    fn a_prefix_covers_whole_segments() {
        assert_covers(
            "
            /api /api yes
            /api /api/users yes
            /api /apiary no
            /api/ /api/users yes
            /api/ /api no
            /api/ /apiary no
            / /anything yes
            / / yes
            /API/x /api/x no
            /users/{id} * no
            ",
        );
    }

    #[test]
    fn a_parameter_matches_any_segment() {
        assert_covers(
            "
            /users/{id} /users/7 yes
            /users/{id} /users/7/posts yes
            /users/{id} /users no
            /users/{id} /users/ yes
            /users/{id}/posts /users//posts yes
            /{tenant}/admin //admin yes
            /users/{id} /usersx/7 no
            /users/{id}/posts /users/7/posts/1 yes
            /users/{id}/posts /users/7/postsx no
            /users/{id}/posts /users/7 no
            /users/{id}/ /users/7/ yes
            /users/{id}/ /users/7 no
            /files/{*path} /files/a/b yes
            /files/{*path} /files no
            /files/{*path} /other/a no
            /{tenant}/admin /acme/admin/x yes
            /{tenant}/admin /acme/public no
            # A parameter is joined to the next segment only where dots
            # are dropped: else every `/a/b/private` would be under it.
            /{dir}/private /a/b/private no
            /{dir}/private /download-../x/private/r yes
            /{dir}/private /download-.../x/private/r yes
            ",
        );
    }

    #[test]
    fn segments_are_read_as_path_decodes_them() {
        assert_covers(
            "
            /api /%61pi/x yes
            /a:b /a%3ab yes
            /a%3Ab /a:b/x yes
            /files/caf%C3%A9 /files/café yes
            /files/café /files/caf%c3%a9/x yes
            # One segment with an encoded slash, and the same decoded into
            # two, as a wildcard's tail decodes it.
            /files/private%2Fr /files/private%2Fr yes
            /files/private%2Fr /files/private/r yes
            /files/private /files/private%2Freport yes
            /api%2Fx /api/x yes
            # Two hops each decoding every escape, then Path.
            /files/private /files/%2570rivate/r yes
            /files/private /files/%252570rivate/r yes
            /files/private /files%255Cprivate/r yes
            /admin/keys /admin%253Bx/keys yes
            # Limited more: a name ending with a dot, joined to the next
            # segment where a root inside it drops the dot (SECURITY.md).
            /{org}/members /acme./teams/members yes
            ",
        );
    }

    #[test]
    fn dot_segments_are_read_as_the_router_and_a_hop_read_them() {
        assert_covers(
            "
            # The router runs `/api/export/{*rest}` for it.
            /api/export /api/export/x/../.. yes
            # A hop resolving dot segments forwards `/api/`.
            /api/ /api/export/x/../.. yes
            /api/x /api//x yes
            /api/x //api/x yes
            /api/x /api/./x yes
            /api/x /api/y/../x yes
            /api/x /api/%2e/x yes
            /api/x /api/y/.%2e/x yes
            /api/y /%61pi/x/%2e%2e/y yes
            /files/b /files/a%2F..%2Fb yes
            # Decoded by a hop, then by `Path` again.
            /files/private /files/%2570rivate/r yes
            /files/private /x/%2e%2e/files/%252e%252e/private/r yes
            /files/private /x/../files/%252e%252e/private/r yes
            /files/private /files/private%3Fx yes
            /files/private /files/privatex%3F no
            /download-private /x%3F/..%2Fdownload-/private/r yes
            # Dot segments resolved with empty segments kept, or slashes
            # merged alone.
            /api/download-private /api//../download-../private/r yes
            /{tenant}/download-private //./download-../private/r yes
            # A backslash taken for a slash.
            /files/private /files\\private/r yes
            /files/private /x\\..\\files/private/r yes
            # A trailing slash wants a segment after it.
            /files/private/ /files/private no
            /api/x /api/y no
            ",
        );
    }

    #[test]
    fn a_tail_is_cleaned_below_each_root_a_wildcard_may_have() {
        assert_covers(
            "
            # Between segments (`/files/{*path}`).
            /files/private /files/../private/r yes
            /files/private /files/x/..%2F..%2Fprivate yes
            /files/private /files/%2e%2e/private/r yes
            /files/private/ /files/../private/ yes
            /{tenant}/files/private /../files/../private/r yes
            /{tenant}/files/private /./files//private/r yes
            /{tenant}/files/private /a%2Fb/files/private%2Fr yes
            # Inside a segment (`/download-{*path}`).
            /download-private /download-../private/r yes
            /download-private /download-x/../../private/r yes
            /download-private /download-..%2Fprivate%2Fr yes
            /download-private /download-/private/r yes
            /download-private /download-./private/r yes
            /download-private /download-%2e%2e/private/r yes
            /download-private/ /download-../private/ yes
            /download-private/ /download-../private no
            /café-private /caf%C3%A9-../private/r yes
            /a:b/download-private /a%3Ab/download-../x%252Fy/../private/r yes
            /api/v1-admin/x /api/v1-../admin/users/../x yes
            # The part after the root kept, or another start or tail.
            /download-private /download-x/private/r no
            /download-private /upload-../private/r no
            /download-private /download-../public/r no
            /download-private /downloads/x no
            # Right after a literal start (`/static{*path}`), where the part
            # after the root is dropped; a part kept splits the segment only
            # on the router.
            /static/private /static../private/r yes
            /static/private /static./private/r yes
            /static/private /staticprivate/r no
            /{tenant}/static/private /a%2Fb/static%2F..%2Fprivate/r yes
            /api/admin /api/users/x no
            ",
        );
    }

    #[test]
    fn prefixes_with_an_encoded_slash_are_also_read_decoded() {
        assert_eq!(Prefix::compile("/files/a%2Fb").len(), 2);
        assert_eq!(Prefix::compile("/files/caf%C3%A9").len(), 1);
        assert_eq!(Routes::new(["/a/b/c", "/x"]).depth, 3);
    }

    #[cfg(feature = "axum")]
    #[test]
    fn on_the_router_the_tail_is_cleaned_below_the_matched_routes_wildcard() {
        // A prefix, a route, a path, and whether the prefix covers the path
        // as the router routed it on the route.
        let cases = "
            /download-private /download-{*path} /download-/private/r yes
            /{dir}/private /download-{*path} /download-/x/private/r yes
            /t/download-x /{tenant}/download-{*path} /t/download-../x/r yes
            /files/private/ /files/{*path} /files/a%2F..%2F..%2Fprivate/ yes
            /café-p /caf%C3%A9-{*path} /caf%C3%A9-../p yes
            /static/private /static{*path} /staticprivate/r yes
            /static/private /static{*path} /static-x/private/r no
            # A path that does not follow its route is read every way; one
            # on a route without a wildcard, its segments each decoded.
            /files/x /files/{*path} /other/x no
            /t/files /{tenant}/files/{*path} /t no
            /users /users/{id} /users/7 yes
            /files/{dir}/x /files/{*path} /files/a%2Fb/x no
            /user_bob/private /user_{name}/{*path} /user_bob/x/../private/r yes
            /v%7B1%7D/private /v{{1}}/{*path} /v{1}/x/../private/r yes
            /api/admin /api/{*rest} /api/../api/admin/r yes
            /users/%7Bid%7D /users/{id} /users/7 no
            # The handler is given %2e%2e, a name, by Path's one decoding.
            /files/private /files/{*path} /files/y/..%2Fprivate/x/%252e%252e/../../r yes
            # Limited more: a handler may hand its tail to a server that
            # decodes it again.
            /files/r /files/{*path} /files/x/%252e%252e/r yes
            /admin /{service}/{id} /../admin yes
            # A router mounted whole below a wildcard: its own route, as it
            # routed the path.
            /api/static/private /api/{*rest}/api/static{*path} /api/staticprivate/r yes
            /api/x/private /api/{*rest}/api/{*more}/x/{*path} /api/x/../x/private/r yes
            # Nests around the outer router (their prefixes before the
            # inner route) or inside the mounted one (in the inner route).
            # The nests' prefixes (NestedPath) follow the answer.
            /app/api/files/private /app/api/{*rest}/api/files/{*path} /app/api/files/private/r yes /app
            /api/files/private /app/api/{*rest}/api/files/{*path} /app/api/files/private/r no /app
            /api/v1/files/private /api/{*rest}/api/v1/files/{*path} /api/v1/files/../private/r yes /api/v1
            /projects/{id} /api/{*rest}/api/v1/projects/{id} /api/v1/projects/acme no /api/v1
            /{t}/{p}/export /{tenant}/{*rest}/{project}/{*file} /a/g/export/r yes /{tenant}
            # The joined route's wildcard is no segment of the path.
            /{tenant}/users /{*rest}/users/{id} /users/7 no
            # A service below a nest's prefix cleans the path it is given.
            /v1/admin /v1/{service}/{id} /v1/../admin yes
            /v1/api/admin /v1/api/{*rest} /v1/api/../../api/admin/r yes
            # Empty segments kept, as RFC 3986 resolves dot segments.
            /api/admin /{*rest} /api//../admin/r yes
            /v1/api/admin /v1/{*rest} /v1/api//../admin/r yes
            # Limited more: an empty parameter merged by a service.
            /users/posts /users/{id}/posts /users//posts yes
            # A service that decodes before cleaning.
            /admin /{service} /..%2Fadmin yes
            /api/admin /api/{*rest} /api/..%2F..%2Fapi/admin/r yes
            # A route's trailing slash is no parameter's value.
            /{tenant} / / no
            /users/{id} /users/ /users/ no
            /users/{id} /users/{id} /users/7 yes
            # A service taking %2e for a name (dots as written).
            /api/admin /{*rest} /api/%2e%2e/../admin yes
            /api/admin /{a}/{b}/{c}/{d} /api/%2e%2e/../admin yes
            /api/admin /{a}/{b}/{c} /api/%2e/../admin yes
            # Decoded, then resolved keeping empty segments.
            /api/admin /{*rest} /api/%2F..%2Fadmin yes
            /api/admin /api/{name} /api/%2F..%2Fadmin yes
            # A router mounted with route_service on a route without a
            # wildcard: axum joins the routes, which the path does not follow.
            /users/{id}/users /users/{id}/users/{id} /users/7 no
            /health/health /health/health /health no
            # Limited more: a parameter's value may be handed on as a path,
            # to a service that decodes it (an encoded slash a separator).
            /users/{id}/export /users/{id} /users/a%2Fexport yes
            /projects/{id}/export /projects/{id}/files/{*path} /projects/a%2Fexport/files/x yes
            /api/projects/{id}/export /api/{*rest}/api/projects/{id} /api/projects/a%2Fexport yes
            /{t}/{p}/export /{tenant}/{*rest}/{project}/{*file} /a/g%2Fexport/r yes /{tenant}
            /v1/admin /v1/{service} /v1/admin%2F.. yes
            /projects/{id}/export /{a}/{b} /projects/acme%2Fexport yes
            /admin/keys /{service} /admin%2Fkeys yes
            /admin/keys /{service}/{*rest} /admin%2Fkeys/x yes
            /admin/keys /{service} /admin%5Ckeys yes
            /admin/keys /{service} /admin%252Fkeys yes
            /admin/keys /{service} /admin%2Fkeysx no
            /admin/keys /files/{*rest} /files/admin%2Fkeys no
            # Rules name this server's paths: a parameter that is not the
            # whole path counts under the path it came in on, decoded.
            /acme/admin/keys /{tenant}/{service} /acme/admin%2Fkeys yes
            /user_admin/keys /user_{name} /user_admin%2Fkeys yes
            /admin/keys /{tenant}/{service} /acme/admin%2Fkeys no
            # Path parameters a Java backend drops (Tomcat, Jetty, Spring).
            /api/admin /api/{*rest} /api/x/..;/admin/r yes
            /api/admin /api/{*rest} /api/admin;x/r yes
            /api/admin /{a}/{b} /api/admin;jsessionid=1 yes
            /api/admin /api/{*rest} /api/administrator;x/r no
        ";
        for line in cases
            .lines()
            .map(|line| line.split('#').next().unwrap_or_default())
        {
            let case: Vec<&str> = line.split_whitespace().collect();
            let (&[prefix, route, path, want], nested) = case.split_at(case.len().min(4)) else {
                assert!(case.is_empty(), "{line:?}");
                continue;
            };
            let routed = Routed {
                path,
                nested: nested.first().copied(),
            };
            let covered = Routes::new([prefix]).covers_as_routed(&routed, route, &Budget::new());
            assert_eq!(covered, want == "yes", "{prefix}: {route} for {path}");
        }
    }

    /// A path longer than [`LONGEST_PATH_READ`] that a hop would read
    /// otherwise is counted rather than read every way (each reading a
    /// pass over it); a long path with nothing to read otherwise, or a
    /// short one, is read as always.
    #[test]
    fn a_path_too_long_to_read_every_way_is_counted() {
        let routes = Routes::new(["/files/private"]);
        let long = format!("/files/{}", "a%2F".repeat(LONGEST_PATH_READ / 4));
        assert!(routes.covers_path(&long, &Budget::new()));
        let plain = format!("/files/{}", "a".repeat(LONGEST_PATH_READ));
        assert!(!routes.covers_path(&plain, &Budget::new()));
        assert!(!routes.covers_path("/files/a%2Fb", &Budget::new()));
    }

    /// A path that would take more than [`READING_BUDGET`](super::READING_BUDGET) to read every
    /// way (one holding many characters hops read otherwise, each adding
    /// ways) is counted under the rule; paths with one or two kinds of them
    /// are read whole up to [`LONGEST_PATH_READ`].
    #[test]
    fn a_path_too_costly_to_read_every_way_is_counted() {
        let routes = Routes::new(["/nothing"]);
        let near_the_longest = |piece: &str| {
            let path = format!(
                "/files/{}",
                piece.repeat((LONGEST_PATH_READ - 8) / piece.len())
            );
            path[..path.rfind('/').unwrap_or(path.len())].to_owned()
        };
        for piece in ["a%20b/", "a/../", "a%20/../", "a%2Fb/", "./a//b/"] {
            let path = near_the_longest(piece);
            assert!(!routes.covers_path(&path, &Budget::new()), "{piece}");
        }
        let every_kind = format!("/files/{}", "a%252F..%5C;x%3B%09/.%2e/".repeat(24));
        assert!(every_kind.len() < LONGEST_PATH_READ / 3);
        assert!(routes.covers_path(&every_kind, &Budget::new()));
        assert!(!routes.covers_path(&every_kind[..60], &Budget::new()));
    }
}

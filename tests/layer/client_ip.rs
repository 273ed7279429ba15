//! `ClientIp`: the client IP behind trusted proxies, from `Forwarded` and
//! `X-Forwarded-For`, without trusting what clients write.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request};
use proptest::prelude::*;
use ratelimit_tower::{
    Cidr, CidrError, ClientIp, ForwardingHeader, KeyExtractor, PeerAddr, PeerIp, TrustedProxies,
};

const XFF: &str = "x-forwarded-for";
const FWD: &str = "forwarded";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A request from the TCP peer `peer` (an IP, port 4000) with header lines.
fn req(peer: &str, headers: &[(&str, &[u8])]) -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(ip(peer), 4000)));
    for (name, value) in headers {
        req.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    req
}

/// Trusts 10.0.0.0/8 and 2001:db8:ffff::/48, which append to X-Forwarded-For.
fn behind_proxies() -> ClientIp {
    ClientIp::trusting(
        TrustedProxies::parse(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap(),
        ForwardingHeader::XForwardedFor,
    )
}

/// The header the proxies of a case write: `Forwarded` when it has such a
/// line, otherwise `X-Forwarded-For`.
fn written_by_proxies(headers: &[(&str, &[u8])]) -> ForwardingHeader {
    if headers.iter().any(|(name, _)| *name == FWD) {
        ForwardingHeader::Forwarded
    } else {
        ForwardingHeader::XForwardedFor
    }
}

fn key_text(extractor: &impl KeyExtractor<Request<()>>, req: &Request<()>) -> String {
    let key = extractor.extract(req).unwrap();
    String::from_utf8(key.as_bytes().to_vec()).unwrap()
}

/// `(peer, header lines, expected client)` under [`behind_proxies`].
type Case = (
    &'static str,
    &'static [(&'static str, &'static [u8])],
    &'static str,
);

/// `(header lines, expected client)` of a request from the proxy `10.0.0.1`.
type ProxyCase = (&'static [(&'static str, &'static [u8])], &'static str);

/// `cases` as [`Case`]s, each from the proxy `10.0.0.1`.
fn from_proxy(cases: &[ProxyCase]) -> Vec<Case> {
    cases
        .iter()
        .map(|&(headers, want)| ("10.0.0.1", headers, want))
        .collect()
}

/// Checks each case with `extractor` reading the header the case's proxies
/// write ([`written_by_proxies`]).
fn check_cases(extractor: &ClientIp, cases: &[Case]) {
    for (peer, headers, want) in cases {
        let extractor = extractor.clone().header(written_by_proxies(headers));
        let got = extractor.client_ip(&req(peer, headers));
        assert_eq!(got, Some(ip(want)), "peer {peer}, headers {headers:?}");
    }
}

/// Checks each case with `extractor` as it is.
fn check_cases_reading(extractor: &ClientIp, cases: &[Case]) {
    for (peer, headers, want) in cases {
        let got = extractor.client_ip(&req(peer, headers));
        assert_eq!(got, Some(ip(want)), "peer {peer}, headers {headers:?}");
    }
}

#[test]
fn spoofed_headers_from_an_untrusted_peer_are_ignored() {
    check_cases(
        &behind_proxies(),
        &[
            ("203.0.113.7", &[(XFF, b"10.0.0.1")], "203.0.113.7"),
            ("203.0.113.7", &[(XFF, b"1.2.3.4, 10.0.0.1")], "203.0.113.7"),
            ("203.0.113.7", &[(FWD, b"for=1.2.3.4")], "203.0.113.7"),
            ("203.0.113.7", &[(XFF, b"garbage")], "203.0.113.7"),
            ("2001:db8::7", &[(XFF, b"2001:db8:ffff::1")], "2001:db8::7"),
        ],
    );
    // Trusting nobody: even loopback peers are the client.
    let peer_only = ClientIp::peer();
    let r = req("127.0.0.1", &[(XFF, b"1.2.3.4"), (FWD, b"for=1.2.3.4")]);
    assert_eq!(peer_only.client_ip(&r), Some(ip("127.0.0.1")));
    assert_eq!(ClientIp::default().client_ip(&r), Some(ip("127.0.0.1")));
}

#[test]
fn chains_through_trusted_proxies_resolve_to_the_client() {
    check_cases(
        &behind_proxies(),
        &[
            // client -> 10.0.0.2 -> 10.0.0.1 -> us; the client spoofed 6.6.6.6.
            (
                "10.0.0.1",
                &[(XFF, b"6.6.6.6, 203.0.113.9, 10.0.0.2")],
                "203.0.113.9",
            ),
            ("10.0.0.1", &[(XFF, b"203.0.113.9,10.0.0.2")], "203.0.113.9"),
            ("10.0.0.1", &[(XFF, b"203.0.113.9")], "203.0.113.9"),
            // A spoofed trusted address left of the client changes nothing.
            (
                "10.0.0.1",
                &[(XFF, b"10.9.9.9, 203.0.113.9, 10.0.0.2")],
                "203.0.113.9",
            ),
            // Whitespace around entries.
            (
                "10.0.0.1",
                &[(XFF, b"  203.0.113.9 ,\t10.0.0.2  ")],
                "203.0.113.9",
            ),
            // IPv6 proxies and client, with brackets and ports.
            (
                "2001:db8:ffff::1",
                &[(XFF, b"2001:db8:1::5, [2001:db8:ffff::2]:443")],
                "2001:db8:1::5",
            ),
            (
                "10.0.0.1",
                &[(XFF, b"203.0.113.9:5555, 10.0.0.2:80")],
                "203.0.113.9",
            ),
            // Nothing forwarded: the proxy itself.
            ("10.0.0.1", &[], "10.0.0.1"),
        ],
    );
}

#[test]
fn the_leftmost_entry_never_counts_as_a_proxy() {
    check_cases(
        &behind_proxies(),
        &from_proxy(&[
            // Every entry is trusted: the client is the leftmost one.
            (&[(XFF, b"10.0.0.9, 10.0.0.3, 10.0.0.2")], "10.0.0.9"),
            (&[(XFF, b"10.0.0.9")], "10.0.0.9"),
            (&[(XFF, b"10.0.0.9"), (XFF, b"10.0.0.2")], "10.0.0.9"),
            (&[(FWD, b"for=10.0.0.9, for=10.0.0.2")], "10.0.0.9"),
        ]),
    );
}

#[test]
fn forwarded_with_quoted_ipv6_and_ports() {
    check_cases(
        &behind_proxies(),
        &from_proxy(&[
            (&[(FWD, b"for=\"[2001:db8:cafe::17]:4711\"")], "2001:db8:cafe::17"),
            (&[(FWD, b"for=\"[2001:db8:cafe::17]\"")], "2001:db8:cafe::17"),
            (&[(FWD, b"for=\"192.0.2.60:8080\"")], "192.0.2.60"),
            (&[(FWD, b"for=192.0.2.60")], "192.0.2.60"),
            // Unquoted values with ':' are invalid RFC 7239 but accepted.
            (&[(FWD, b"for=192.0.2.60:8080")], "192.0.2.60"),
            (&[(FWD, b"For=\"[2001:db8::1]:4711\"")], "2001:db8::1"),
            // Other parameters, in any order; case-insensitive names.
            (
                &[(
                    FWD,
                    b"for=6.6.6.6, proto=https;FOR=\"192.0.2.60:1\";by=\"[2001:db8::1]\";host=\"a;b\", for=\"[2001:db8:ffff::2]:80\";proto=http",
                )],
                "192.0.2.60",
            ),
            // RFC 7239 examples.
            (&[(FWD, b"for=192.0.2.43, for=198.51.100.17")], "198.51.100.17"),
            (
                &[(FWD, b"for=192.0.2.43, for=\"[2001:db8:cafe::17]\", for=10.0.0.5")],
                "2001:db8:cafe::17",
            ),
        ]),
    );
}

#[test]
fn only_the_named_header_is_read_and_headers_are_never_mixed() {
    let both: &[(&str, &[u8])] = &[(XFF, b"198.51.100.1"), (FWD, b"for=192.0.2.1")];
    let bad_forwarded: &[(&str, &[u8])] = &[(XFF, b"198.51.100.1"), (FWD, b"for=_hidden")];
    let empty_forwarded: &[(&str, &[u8])] = &[(XFF, b"198.51.100.1"), (FWD, b"")];
    let xff_only = behind_proxies();
    check_cases_reading(&xff_only, &[("10.0.0.1", both, "198.51.100.1")]);
    check_cases_reading(&xff_only, &[("10.0.0.1", bad_forwarded, "198.51.100.1")]);
    check_cases_reading(&xff_only, &[("10.0.0.1", empty_forwarded, "198.51.100.1")]);
    let fwd_only = behind_proxies().header(ForwardingHeader::Forwarded);
    check_cases_reading(&fwd_only, &[("10.0.0.1", both, "192.0.2.1")]);
    // A malformed or empty Forwarded does not fall through to X-Forwarded-For.
    check_cases_reading(&fwd_only, &[("10.0.0.1", bad_forwarded, "10.0.0.1")]);
    check_cases_reading(&fwd_only, &[("10.0.0.1", empty_forwarded, "10.0.0.1")]);
    check_cases_reading(
        &fwd_only,
        &[("10.0.0.1", &[(XFF, b"198.51.100.1")], "10.0.0.1")],
    );
}

/// Behind proxies that append to X-Forwarded-For and pass `Forwarded`
/// through untouched (nginx's `proxy_add_x_forwarded_for`, AWS ALB), a
/// client's own `Forwarded` neither gives it a fresh key per request nor
/// puts it under a victim's key.
#[test]
fn a_spoofed_forwarded_header_behind_an_x_forwarded_for_proxy_does_not_change_the_key() {
    let extractor = behind_proxies();
    let honest = req("10.0.0.1", &[(XFF, b"203.0.113.9")]);
    let honest_key = key_text(&extractor, &honest);
    assert_eq!(honest_key, "203.0.113.9");
    for spoofed in [
        b"for=198.51.100.1".as_slice(),
        b"for=\"[2001:db8::66]:80\"",
        b"for=192.0.2.200;proto=https, for=10.0.0.2",
        b"for=_hidden",
        b"",
    ] {
        // The client wrote Forwarded (and an X-Forwarded-For entry); the
        // proxy appended the address it saw to X-Forwarded-For.
        let r = req(
            "10.0.0.1",
            &[(FWD, spoofed), (XFF, b"192.0.2.55, 203.0.113.9")],
        );
        assert_eq!(key_text(&extractor, &r), honest_key, "{spoofed:?}");
    }
    // Through the layer: one budget, however many Forwarded values it sends.
    let requests = (0..6u8).map(|i| {
        let forwarded = format!("for=198.51.100.{i}");
        req(
            "10.0.0.1",
            &[(FWD, forwarded.as_bytes()), (XFF, b"203.0.113.9")],
        )
    });
    assert_eq!(
        statuses_limited_to(3, extractor, requests),
        [200, 200, 200, 429, 429, 429]
    );
}

#[test]
fn several_header_lines_form_one_list() {
    check_cases(
        &behind_proxies(),
        &from_proxy(&[
            (
                &[
                    (XFF, b"6.6.6.6, 203.0.113.9"),
                    (XFF, b"10.0.0.3"),
                    (XFF, b"10.0.0.2"),
                ],
                "203.0.113.9",
            ),
            (
                &[(XFF, b"203.0.113.9"), (XFF, b"10.0.0.3, 10.0.0.2")],
                "203.0.113.9",
            ),
            (
                &[(FWD, b"for=192.0.2.1"), (FWD, b"for=10.0.0.3;proto=https")],
                "192.0.2.1",
            ),
            // A quote left open by the client does not swallow later lines.
            (&[(FWD, b"for=\"6.6"), (FWD, b"for=192.0.2.1")], "192.0.2.1"),
            (&[(FWD, b"by=\"x, for=192.0.2.1")], "192.0.2.1"),
        ]),
    );
}

#[test]
fn malformed_entries_stop_the_walk_at_the_last_trusted_address() {
    check_cases(
        &behind_proxies(),
        &from_proxy(&[
            // Rightmost entry malformed: the peer.
            (&[(XFF, b"203.0.113.9, garbage")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, unknown")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, 1.2.3.4.5")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, 1.2.3.4:99999")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, [1.2.3.4]")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, fe80::1%eth0")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, 10.0.0.0/8")], "10.0.0.1"),
            // Further left: the trusted hop that handed us the bad entry.
            (&[(XFF, b"203.0.113.9, garbage, 10.0.0.2")], "10.0.0.2"),
            (
                &[(XFF, b"203.0.113.9, _hidden, 10.0.0.3, 10.0.0.2")],
                "10.0.0.3",
            ),
            // An untrusted entry right of the garbage is the client anyway.
            (&[(XFF, b"garbage, 203.0.113.9, 10.0.0.2")], "203.0.113.9"),
            // Obfuscated and unknown Forwarded nodes, missing or repeated for=.
            (&[(FWD, b"for=192.0.2.1, for=_hidden")], "10.0.0.1"),
            (
                &[(FWD, b"for=192.0.2.1, for=unknown, for=10.0.0.2")],
                "10.0.0.2",
            ),
            (&[(FWD, b"for=192.0.2.1, for=\"_gazonk:80\"")], "10.0.0.1"),
            (&[(FWD, b"for=192.0.2.1, proto=https")], "10.0.0.1"),
            (
                &[(FWD, b"for=192.0.2.1, for=10.0.0.2;for=10.0.0.3")],
                "10.0.0.1",
            ),
            (&[(FWD, b"for=\"192.0.2.1")], "10.0.0.1"),
            (&[(FWD, b"192.0.2.1")], "10.0.0.1"),
            (&[(FWD, b"for=192.0.2.1 junk")], "10.0.0.1"),
            (&[(FWD, b"for=\"192.0.2\\.1\"")], "10.0.0.1"),
        ]),
    );
}

#[test]
fn empty_headers_and_entries_are_malformed() {
    check_cases(
        &behind_proxies(),
        &from_proxy(&[
            (&[(XFF, b"")], "10.0.0.1"),
            (&[(XFF, b"   ")], "10.0.0.1"),
            (&[(XFF, b",")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9,")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9,,10.0.0.2")], "10.0.0.2"),
            (&[(XFF, b"203.0.113.9"), (XFF, b"")], "10.0.0.1"),
            (&[(XFF, b""), (XFF, b"10.0.0.2")], "10.0.0.2"),
            (&[(FWD, b"")], "10.0.0.1"),
            (&[(FWD, b";")], "10.0.0.1"),
        ]),
    );
}

#[test]
fn non_utf8_header_bytes_are_malformed() {
    check_cases(
        &behind_proxies(),
        &from_proxy(&[
            (&[(XFF, b"\xff\xfe")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9\xc3")], "10.0.0.1"),
            (&[(XFF, b"203.0.113.9, \xff, 10.0.0.2")], "10.0.0.2"),
            // Valid UTF-8 but not ASCII.
            (&[(XFF, b"203.0.113.9, \xe2\x91\xa0.2.3.4")], "10.0.0.1"),
            // Only the entries met matter: this one is right of the bad bytes.
            (&[(XFF, b"\xff, 203.0.113.9")], "203.0.113.9"),
            (&[(FWD, b"for=\"\xff\"")], "10.0.0.1"),
            (&[(FWD, b"for=192.0.2.1;host=\"\xff\"")], "192.0.2.1"),
        ]),
    );
}

/// Asserts that `f` takes under 5 ms (in a debug build), best of three runs
/// so that a busy machine does not fail the test spuriously. CPU work on
/// one thread, with no clock to pause and nothing the extractor counts: the
/// bounded walk takes microseconds, so the bound leaves a loaded machine
/// hundreds of times that.
fn assert_fast<T>(mut f: impl FnMut() -> T) -> T {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..3 {
        let start = Instant::now();
        out = Some(f());
        best = best.min(start.elapsed());
    }
    assert!(best < Duration::from_millis(5), "took {best:?}");
    out.unwrap()
}

#[test]
fn a_ten_thousand_entry_header_is_cheap() {
    let mut spoofed = "6.6.6.6, ".repeat(10_000);
    spoofed.push_str("203.0.113.9, 10.0.0.3, 10.0.0.2");
    let r = req("10.0.0.1", &[(XFF, spoofed.as_bytes())]);
    assert!(spoofed.len() > 90_000);

    // Over the default 8 KiB: read from the right like any other, so the
    // client the proxies appended is keyed, never the proxy.
    let extractor = behind_proxies();
    assert_eq!(
        assert_fast(|| extractor.client_ip(&r)),
        Some(ip("203.0.113.9"))
    );

    // Allowed: only the entries from the right up to the client are read.
    let extractor = behind_proxies().max_header_bytes(1 << 20);
    assert_eq!(
        assert_fast(|| extractor.client_ip(&r)),
        Some(ip("203.0.113.9"))
    );

    // 10,000 trusted hops: the walk stops after max_hops, at the last of them.
    let all_trusted: String = (0..10_000)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect::<Vec<_>>()
        .join(", ");
    let r = req("10.0.0.1", &[(XFF, all_trusted.as_bytes())]);
    let hop = |i: usize| ip(&format!("10.0.{}.{}", i / 256, i % 256));
    assert_eq!(
        assert_fast(|| extractor.client_ip(&r)),
        Some(hop(10_000 - 64))
    );
    let few = extractor.clone().max_hops(3);
    assert_eq!(few.client_ip(&r), Some(hop(10_000 - 3)));
    let none = extractor.clone().max_hops(0);
    assert_eq!(none.client_ip(&r), Some(ip("10.0.0.1")));

    // 10,000 lines of one entry each.
    let lines: Vec<(&str, &[u8])> = std::iter::repeat_n((XFF, &b"10.0.0.7"[..]), 10_000).collect();
    let r = req("10.0.0.1", &lines);
    assert_eq!(
        assert_fast(|| extractor.client_ip(&r)),
        Some(ip("10.0.0.7"))
    );
    // The default 8 KiB reads more than max_hops (64) of them.
    assert_eq!(
        assert_fast(|| behind_proxies().client_ip(&r)),
        Some(ip("10.0.0.7"))
    );
}

#[test]
fn a_one_mebibyte_header_is_cheap() {
    let extractor = behind_proxies();
    let big = extractor.clone().max_header_bytes(4 << 20);
    let mib = 1 << 20;

    // One huge entry.
    let digits = "1".repeat(mib);
    let r = req("10.0.0.1", &[(XFF, digits.as_bytes())]);
    assert_eq!(
        assert_fast(|| extractor.client_ip(&r)),
        Some(ip("10.0.0.1"))
    );
    assert_eq!(assert_fast(|| big.client_ip(&r)), Some(ip("10.0.0.1")));

    // A huge entry behind a trusted hop: that hop.
    let behind = format!("{digits}, 10.0.0.2");
    let r = req("10.0.0.1", &[(XFF, behind.as_bytes())]);
    assert_eq!(assert_fast(|| big.client_ip(&r)), Some(ip("10.0.0.2")));

    // Nothing but separators.
    let commas = ",".repeat(mib);
    let r = req("10.0.0.1", &[(XFF, commas.as_bytes())]);
    assert_eq!(assert_fast(|| big.client_ip(&r)), Some(ip("10.0.0.1")));

    // A huge Forwarded element.
    let forwarded = format!("for=192.0.2.1;host=\"{}\"", "a".repeat(mib));
    let r = req("10.0.0.1", &[(FWD, forwarded.as_bytes())]);
    assert_eq!(
        assert_fast(|| extractor.client_ip(&r)),
        Some(ip("10.0.0.1"))
    );
    assert_eq!(assert_fast(|| big.client_ip(&r)), Some(ip("10.0.0.1")));

    // At and just over the limit: lines count with one separator between
    // them; past it, the walk stops at the last trusted hop read.
    let exact = behind_proxies().max_header_bytes(19);
    check_cases(
        &exact,
        &from_proxy(&[
            (&[(XFF, b"192.0.2.1,10.0.0.22")], "192.0.2.1"),
            (&[(XFF, b"192.0.2.1"), (XFF, b"10.0.0.22")], "192.0.2.1"),
            (&[(XFF, b"192.0.2.1, 10.0.0.22")], "10.0.0.22"),
            (&[(XFF, b"192.0.2.1"), (XFF, b"10.0.0.222")], "10.0.0.222"),
        ]),
    );
}

#[test]
fn ipv4_mapped_addresses_are_ipv4() {
    let extractor = behind_proxies();
    // A mapped peer is matched against IPv4 networks and keyed as IPv4.
    let r = req(
        "::ffff:10.0.0.1",
        &[(XFF, b"::ffff:203.0.113.9, ::ffff:10.0.0.2")],
    );
    assert_eq!(extractor.client_ip(&r), Some(ip("203.0.113.9")));
    assert_eq!(key_text(&extractor, &r), "203.0.113.9");
    let r = req("::ffff:203.0.113.9", &[(XFF, b"1.2.3.4")]);
    assert_eq!(extractor.client_ip(&r), Some(ip("203.0.113.9")));
    let r = req("10.0.0.1", &[(FWD, b"for=\"[::ffff:192.0.2.1]:80\"")]);
    let forwarded = extractor.clone().header(ForwardingHeader::Forwarded);
    assert_eq!(forwarded.client_ip(&r), Some(ip("192.0.2.1")));
    // Mapped entries are trusted hops too.
    let r = req("10.0.0.1", &[(XFF, b"192.0.2.1, [::ffff:10.0.0.2]:80")]);
    assert_eq!(extractor.client_ip(&r), Some(ip("192.0.2.1")));

    // Mapped networks are IPv4 networks.
    let mapped = ClientIp::trusting(
        TrustedProxies::parse(["::ffff:10.0.0.0/104"]).unwrap(),
        ForwardingHeader::XForwardedFor,
    );
    assert_eq!(
        mapped.trusted_proxies().cidrs(),
        &["10.0.0.0/8".parse::<Cidr>().unwrap()]
    );
    let r = req("10.0.0.1", &[(XFF, b"192.0.2.1")]);
    assert_eq!(mapped.client_ip(&r), Some(ip("192.0.2.1")));
    // IPv6 networks containing the mapped range contain IPv4 addresses.
    let all = ClientIp::trusting(
        TrustedProxies::parse(["::/0"]).unwrap(),
        ForwardingHeader::XForwardedFor,
    );
    assert_eq!(all.client_ip(&r), Some(ip("192.0.2.1")));
    let v6_only = ClientIp::trusting(
        TrustedProxies::parse(["2001:db8::/32"]).unwrap(),
        ForwardingHeader::XForwardedFor,
    );
    assert_eq!(v6_only.client_ip(&r), Some(ip("10.0.0.1")));
}

#[test]
fn ipv6_clients_are_keyed_by_prefix() {
    let by_64 = ClientIp::peer().ipv6_prefix(64).unwrap();
    let by_56 = ClientIp::peer().ipv6_prefix(56).unwrap();
    let a = req("2001:db8:1:2:aaaa::1", &[]);
    let b = req("2001:db8:1:2:bbbb::2", &[]);
    let c = req("2001:db8:1:3::1", &[]);
    let d = req("2001:db8:1:100::1", &[]);

    assert_eq!(key_text(&by_64, &a), "2001:db8:1:2::/64");
    assert_eq!(key_text(&by_64, &a), key_text(&by_64, &b));
    assert_ne!(key_text(&by_64, &a), key_text(&by_64, &c));
    assert_eq!(by_64.extract(&a), by_64.extract(&b));
    assert_ne!(by_64.extract(&a), by_64.extract(&c));

    assert_eq!(key_text(&by_56, &a), "2001:db8:1::/56");
    assert_eq!(key_text(&by_56, &a), key_text(&by_56, &c));
    assert_ne!(key_text(&by_56, &a), key_text(&by_56, &d));
    assert_eq!(key_text(&by_56, &d), "2001:db8:1:100::/56");

    // client_ip is unmasked; IPv4 is never masked; by default: the /64.
    assert_eq!(by_64.client_ip(&a), Some(ip("2001:db8:1:2:aaaa::1")));
    assert_eq!(key_text(&by_64, &req("192.0.2.1", &[])), "192.0.2.1");
    assert_eq!(key_text(&by_64, &req("::ffff:192.0.2.1", &[])), "192.0.2.1");
    assert_eq!(key_text(&ClientIp::peer(), &a), "2001:db8:1:2::/64");

    // Prefixes apply to forwarded clients too.
    let proxied = behind_proxies()
        .header(ForwardingHeader::Forwarded)
        .ipv6_prefix(64)
        .unwrap();
    let r = req("10.0.0.1", &[(FWD, b"for=\"[2001:db8:9:9:1:2:3:4]:80\"")]);
    assert_eq!(key_text(&proxied, &r), "2001:db8:9:9::/64");

    // Bounds.
    let all = ClientIp::peer().ipv6_prefix(0).unwrap();
    assert_eq!(key_text(&all, &a), "::/0");
    assert_eq!(key_text(&all, &a), key_text(&all, &d));
    let each = ClientIp::peer().ipv6_prefix(128).unwrap();
    assert_eq!(key_text(&each, &a), "2001:db8:1:2:aaaa::1/128");
    assert_eq!(
        ClientIp::peer().ipv6_prefix(129).unwrap_err(),
        CidrError::PrefixLenTooLong { len: 129, max: 128 }
    );
}

/// Sends `requests` in order through a layer keyed by `extractor` with a
/// fixed window of `limit` an hour, and returns the statuses.
fn statuses_limited_to<K>(
    limit: u64,
    extractor: K,
    requests: impl IntoIterator<Item = Request<()>>,
) -> Vec<u16>
where
    K: KeyExtractor<Request<()>> + Clone + Send + Sync + 'static,
{
    let limited = ratelimit_tower::RateLimitLayer::new(
        ratelimit_core::MemoryStore::new(),
        ratelimit_core::Policy::fixed_window(limit, ratelimit_tests::NO_EDGE).unwrap(),
        extractor,
    );
    let service =
        tower::ServiceBuilder::new()
            .layer(limited)
            .service_fn(|_req: Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut statuses = Vec::new();
        for request in requests {
            let response = tower::ServiceExt::oneshot(service.clone(), request)
                .await
                .unwrap();
            statuses.push(response.status().as_u16());
        }
        statuses
    })
}

/// Sends one request from each peer through a layer keyed by `extractor`
/// with a limit of 2, and returns the statuses.
fn statuses_through<K>(extractor: K, peers: &[&str]) -> Vec<u16>
where
    K: KeyExtractor<Request<()>> + Clone + Send + Sync + 'static,
{
    statuses_limited_to(2, extractor, peers.iter().map(|peer| req(peer, &[])))
}

/// A directly connected IPv6 client that rotates addresses within its /64
/// spends one budget under `PeerIp`; another /64 has its own.
#[test]
fn peer_ip_keys_ipv6_peers_by_their_64_by_default() {
    let key = |extractor: &PeerIp, peer: &str| key_text(extractor, &req(peer, &[]));
    assert_eq!(PeerIp, PeerIp::new());
    assert_eq!(PeerIp, PeerIp::default());
    assert_eq!(PeerIp.ipv6_prefix_len(), 64);
    assert_eq!(key(&PeerIp, "2001:db8:1:2::1"), "2001:db8:1:2::/64");
    assert_eq!(
        key(&PeerIp, "2001:db8:1:2:ffff:ffff:ffff:ffff"),
        "2001:db8:1:2::/64"
    );
    assert_eq!(key(&PeerIp, "2001:db8:1:3::1"), "2001:db8:1:3::/64");
    // IPv4 (mapped or not) is keyed by its address.
    assert_eq!(key(&PeerIp, "192.0.2.1"), "192.0.2.1");
    assert_eq!(key(&PeerIp, "::ffff:192.0.2.1"), "192.0.2.1");

    // One /64: one budget of 2, whatever the address.
    let rotating = [
        "2001:db8:1:2::1",
        "2001:db8:1:2::2",
        "2001:db8:1:2:a:b:c:d",
        "2001:db8:1:2:ffff::9",
    ];
    assert_eq!(statuses_through(PeerIp, &rotating), [200, 200, 429, 429]);
    // Different /64s: a budget each.
    let neighbours = [
        "2001:db8:1:2::1",
        "2001:db8:1:3::1",
        "2001:db8:2:2::1",
        "2001:db8:1:2::5",
    ];
    assert_eq!(statuses_through(PeerIp, &neighbours), [200, 200, 200, 200]);

    // A configured prefix is honoured: /48 puts these under one key...
    let per_48 = PeerIp::new().ipv6_prefix(48).unwrap();
    assert_eq!(key(&per_48, "2001:db8:1:2::1"), "2001:db8:1::/48");
    let one_48 = [
        "2001:db8:1:2::1",
        "2001:db8:1:3::1",
        "2001:db8:1:ffff::1",
        "2001:db8:2::1",
    ];
    assert_eq!(statuses_through(per_48, &one_48), [200, 200, 429, 200]);
    // ... and /128 keys each address alone.
    let per_128 = PeerIp::new().ipv6_prefix(128).unwrap();
    assert_eq!(key(&per_128, "2001:db8:1:2::1"), "2001:db8:1:2::1/128");
    assert_eq!(statuses_through(per_128, &rotating), [200, 200, 200, 200]);
    assert_eq!(
        PeerIp::new().ipv6_prefix(129).unwrap_err(),
        CidrError::PrefixLenTooLong { len: 129, max: 128 }
    );
}

#[test]
fn cidr_parsing() {
    let ok: &[(&str, &str)] = &[
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("192.0.2.1", "192.0.2.1/32"),
        ("2001:db8::1", "2001:db8::1/128"),
        (" 10.0.0.0/8 ", "10.0.0.0/8"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("::/0", "::/0"),
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
        ("::ffff:192.0.2.1", "192.0.2.1/32"),
        ("::ffff:0:0/96", "0.0.0.0/0"),
        ("10.0.0.0/08", "10.0.0.0/8"),
    ];
    for (input, shown) in ok {
        let cidr: Cidr = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(cidr.to_string(), *shown);
    }
    let cidr: Cidr = "10.0.0.0/8".parse().unwrap();
    assert_eq!(cidr.network(), ip("10.0.0.0"));
    assert_eq!(cidr.prefix_len(), 8);

    let errors: &[(&str, CidrError)] = &[
        ("", CidrError::InvalidAddress(String::new())),
        ("10.0.0/8", CidrError::InvalidAddress("10.0.0/8".into())),
        ("garbage", CidrError::InvalidAddress("garbage".into())),
        (
            "fe80::1%eth0/64",
            CidrError::InvalidAddress("fe80::1%eth0/64".into()),
        ),
        ("[::1]/128", CidrError::InvalidAddress("[::1]/128".into())),
        ("10.0.0.0/", CidrError::InvalidPrefixLen(String::new())),
        ("10.0.0.0/x", CidrError::InvalidPrefixLen("x".into())),
        ("10.0.0.0/-1", CidrError::InvalidPrefixLen("-1".into())),
        ("10.0.0.0/+8", CidrError::InvalidPrefixLen("+8".into())),
        ("10.0.0.0/8/8", CidrError::InvalidPrefixLen("8/8".into())),
        ("10.0.0.0/ 8", CidrError::InvalidPrefixLen(" 8".into())),
        (
            "10.0.0.0/99999999999999999999",
            CidrError::InvalidPrefixLen("99999999999999999999".into()),
        ),
        (
            "10.0.0.0/33",
            CidrError::PrefixLenTooLong { len: 33, max: 32 },
        ),
        ("::/129", CidrError::PrefixLenTooLong { len: 129, max: 128 }),
        ("::/300", CidrError::PrefixLenTooLong { len: 300, max: 128 }),
        ("10.0.0.1/8", CidrError::HostBitsSet("10.0.0.1/8".into())),
        (
            "2001:db8::1/32",
            CidrError::HostBitsSet("2001:db8::1/32".into()),
        ),
        (
            "::ffff:10.0.0.1/104",
            CidrError::HostBitsSet("::ffff:10.0.0.1/104".into()),
        ),
    ];
    for (input, want) in errors {
        assert_eq!(input.parse::<Cidr>().as_ref(), Err(want), "{input:?}");
        assert!(!want.to_string().is_empty());
    }
    assert_eq!(
        Cidr::new(ip("10.0.0.0"), 33),
        Err(CidrError::PrefixLenTooLong { len: 33, max: 32 })
    );
    assert_eq!(
        Cidr::new(ip("::ffff:10.0.0.1"), 104),
        Err(CidrError::HostBitsSet("::ffff:10.0.0.1/104".into()))
    );
    assert_eq!(Cidr::from(ip("::ffff:1.2.3.4")).to_string(), "1.2.3.4/32");

    // Lists.
    let list = TrustedProxies::parse(["10.0.0.0/8", "2001:db8::/32"]).unwrap();
    assert_eq!(list.cidrs().len(), 2);
    assert_eq!(
        TrustedProxies::parse(["10.0.0.0/8", "nope", "also nope"]),
        Err(CidrError::InvalidAddress("nope".into()))
    );
    let from_str: TrustedProxies = " 10.0.0.0/8,2001:db8::/32\n".parse().unwrap();
    assert_eq!(from_str, list);
    assert!("".parse::<TrustedProxies>().unwrap().is_empty());
    assert!(TrustedProxies::none().is_empty());
    assert!("10.0.0.0/8,x".parse::<TrustedProxies>().is_err());
    let collected: TrustedProxies = ["10.0.0.0/8", "2001:db8::/32"]
        .iter()
        .map(|s| s.parse::<Cidr>().unwrap())
        .collect();
    assert_eq!(collected, list);
}

#[test]
fn unknown_peer_has_no_key() {
    let mut r = Request::new(());
    r.headers_mut()
        .insert(XFF, HeaderValue::from_static("203.0.113.9"));
    r.headers_mut()
        .insert(FWD, HeaderValue::from_static("for=203.0.113.9"));
    for extractor in [
        ClientIp::peer(),
        behind_proxies(),
        ClientIp::trusting(
            "::/0, 0.0.0.0/0".parse().unwrap(),
            ForwardingHeader::XForwardedFor,
        ),
    ] {
        assert_eq!(extractor.client_ip(&r), None);
        assert_eq!(extractor.extract(&r), None);
    }
}

#[test]
fn axum_connect_info_is_the_peer() {
    let mut r = Request::new(());
    r.extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::new(
            ip("10.0.0.1"),
            80,
        )));
    r.headers_mut()
        .insert(XFF, HeaderValue::from_static("203.0.113.9"));
    assert_eq!(behind_proxies().client_ip(&r), Some(ip("203.0.113.9")));
    assert_eq!(ClientIp::peer().client_ip(&r), Some(ip("10.0.0.1")));
}

// ---------------------------------------------------------------------------
// Properties

/// Pieces header values are made of: addresses (trusted or not, in various
/// spellings), separators, Forwarded syntax and junk.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "10.0.0.2", "10.1.2.3", "10.255.255.255", "203.0.113.9", "198.51.100.7",
            "2001:db8:ffff::2", "[2001:db8:ffff::3]:80", "2001:db8::9", "[2001:db8::1]",
            "::ffff:10.0.0.4", "::ffff:192.0.2.4", "192.0.2.5:8080", "0.0.0.0", "::",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        3 => prop::sample::select(vec![
            ",", ", ", " ", "\t", ";", "for=", "For=", "\"", "=", "[", "]", ":", "_hidden",
            "unknown", "proto=https", "by=", "\\", ":80", "/8",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..6),
        1 => any::<[u8; 4]>().prop_map(|o| IpAddr::from(o).to_string().into_bytes()),
    ]
}

/// Header lines: structured pieces or arbitrary bytes, keeping only values
/// `HeaderValue` accepts.
fn lines() -> impl Strategy<Value = Vec<(bool, HeaderValue)>> {
    let value = prop_oneof![
        prop::collection::vec(piece(), 0..12).prop_map(|p| p.concat()),
        prop::collection::vec(any::<u8>(), 0..40),
    ]
    .prop_filter_map("not a header value", |b| HeaderValue::from_bytes(&b).ok());
    prop::collection::vec((any::<bool>(), value), 0..4)
}

fn request(peer: IpAddr, lines: &[(bool, HeaderValue)]) -> Request<()> {
    let mut r = Request::new(());
    r.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(peer, 1)));
    for (forwarded, value) in lines {
        let name = if *forwarded { FWD } else { XFF };
        r.headers_mut().append(name, value.clone());
    }
    r
}

/// Every address spelled somewhere in `bytes`, whatever the surroundings.
fn addresses_in(bytes: &[u8]) -> Vec<IpAddr> {
    let mut found = Vec::new();
    let runs = bytes.split(|b| !(b.is_ascii_hexdigit() || matches!(b, b':' | b'.')));
    for run in runs {
        for start in 0..run.len() {
            for end in start + 1..=run.len() {
                let s = std::str::from_utf8(&run[start..end]).unwrap();
                if let Ok(ip) = s.parse::<IpAddr>() {
                    found.push(ip.to_canonical());
                }
            }
        }
    }
    found
}

/// A plain model of the X-Forwarded-For walk, without laziness or limits.
fn xff_model(extractor: &ClientIp, peer: IpAddr, lines: &[&[u8]]) -> IpAddr {
    let parse = |entry: &[u8]| -> Option<IpAddr> {
        let s = std::str::from_utf8(entry).ok()?.trim_matches([' ', '\t']);
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Some(ip.to_canonical());
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest.split_once(']')?;
            let port = if after.is_empty() {
                None
            } else {
                Some(after.strip_prefix(':')?)
            };
            (IpAddr::V6(host.parse().ok()?), port)
        } else {
            let (host, port) = s.split_once(':')?;
            (IpAddr::V4(host.parse().ok()?), Some(port))
        };
        if let Some(port) = port {
            let obfuscated = port.len() > 1
                && port.starts_with('_')
                && port[1..]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            let decimal = port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok();
            if !(obfuscated || decimal) {
                return None;
            }
        }
        Some(host.to_canonical())
    };
    let trusted = extractor.trusted_proxies();
    if !trusted.contains(peer) {
        return peer;
    }
    let entries: Vec<&[u8]> = lines
        .iter()
        .flat_map(|line| line.split(|&b| b == b','))
        .collect();
    let mut last_trusted = peer;
    for (i, entry) in entries.iter().enumerate().rev() {
        let Some(ip) = parse(entry) else {
            return last_trusted;
        };
        if i == 0 || !trusted.contains(ip) {
            return ip;
        }
        last_trusted = ip;
    }
    last_trusted
}

/// `ip` with the bits after the first `len` cleared, computed independently.
fn network(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = if len == 0 {
                0
            } else {
                bits >> (32 - u32::from(len)) << (32 - u32::from(len))
            };
            IpAddr::V4(Ipv4Addr::from(kept))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = if len == 0 {
                0
            } else {
                bits >> (128 - u32::from(len)) << (128 - u32::from(len))
            };
            IpAddr::V6(Ipv6Addr::from(kept))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_and_never_trusts_what_is_not_vouched_for(
        lines in lines(),
        peer_octets in prop::sample::select(vec![[10, 0, 0, 1], [203, 0, 113, 1]]),
        mapped in any::<bool>(),
        prefix in prop::option::of(0u8..=128),
        max_hops in prop::option::of(0usize..4),
        reads_forwarded in any::<bool>(),
    ) {
        let mut extractor = behind_proxies();
        if reads_forwarded {
            extractor = extractor.header(ForwardingHeader::Forwarded);
        }
        if let Some(len) = prefix {
            extractor = extractor.ipv6_prefix(len).unwrap();
        }
        if let Some(n) = max_hops {
            extractor = extractor.max_hops(n);
        }
        let peer = if mapped {
            IpAddr::V6(Ipv4Addr::from(peer_octets).to_ipv6_mapped())
        } else {
            IpAddr::from(peer_octets)
        };
        let peer_canonical = peer.to_canonical();
        let r = request(peer, &lines);
        let got = extractor.client_ip(&r).unwrap();
        prop_assert!(extractor.extract(&r).is_some());
        prop_assert_eq!(got, got.to_canonical());

        if !extractor.trusted_proxies().contains(peer) {
            prop_assert_eq!(got, peer_canonical);
        } else if got != peer_canonical {
            // Only the named header is read.
            let spelled: Vec<IpAddr> = lines
                .iter()
                .filter(|(forwarded, _)| *forwarded == reads_forwarded)
                .flat_map(|(_, v)| addresses_in(v.as_bytes()))
                .collect();
            prop_assert!(spelled.contains(&got), "{got} not in {lines:?}");
        }
        // Reading X-Forwarded-For, whatever Forwarded says, the lazy bounded
        // walk agrees with the model.
        if max_hops.is_none() && !reads_forwarded {
            let bytes: Vec<&[u8]> = lines
                .iter()
                .filter(|(forwarded, _)| !forwarded)
                .map(|(_, v)| v.as_bytes())
                .collect();
            prop_assert_eq!(got, xff_model(&extractor, peer_canonical, &bytes));
        }
    }

    #[test]
    fn untrusted_peers_are_always_the_client(
        lines in lines(),
        peer in any::<IpAddr>().prop_filter("trusted", |ip| !behind_proxies().trusted_proxies().contains(*ip)),
    ) {
        let r = request(peer, &lines);
        prop_assert_eq!(behind_proxies().client_ip(&r), Some(peer.to_canonical()));
        prop_assert_eq!(ClientIp::peer().client_ip(&r), Some(peer.to_canonical()));
    }

    #[test]
    fn cidr_parsing_never_panics(s in "\\PC{0,40}", bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        let _ = s.parse::<Cidr>();
        let _ = s.parse::<TrustedProxies>();
        let _ = String::from_utf8_lossy(&bytes).parse::<Cidr>();
    }

    #[test]
    fn cidr_membership_matches_masking(addr in any::<IpAddr>(), other in any::<IpAddr>(), len in 0u8..=128) {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len % (max + 1);
        let net = network(addr, len);
        let cidr = Cidr::new(net, len).unwrap();
        prop_assert!(cidr.contains(addr));
        prop_assert_eq!(format!("{net}/{len}").parse::<Cidr>(), Ok(cidr));
        if net != addr {
            prop_assert!(Cidr::new(addr, len).is_err());
        }
        // Same family: membership is prefix equality.
        if addr.is_ipv4() == other.is_ipv4() && other.to_canonical().is_ipv4() == other.is_ipv4() {
            prop_assert_eq!(cidr.contains(other), network(addr, len) == network(other, len));
        }
    }
}

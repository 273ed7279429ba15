//! Bodies that hold concurrency permits, against bodies that say they
//! ended too early, end every way, or are never polled, and on a real
//! server answering `HEAD`, `204` and `304` with endless bodies; route
//! rules read together around missing keys and `HEAD`.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use ratelimit_core::MemoryStore;
use ratelimit_tower::{GlobalKey, RateLimitLayer};
use tower::{Layer, ServiceExt, service_fn};

use super::client_bodies::{Step, one_at_a_time, one_body, refused, still};
use super::headers::serve;

/// A body that says it ended after a frame but goes on streaming keeps
/// its slot: the permit is freed at `None` or at the drop, never on the
/// body's word, so no second body streams beside it under a max of 1.
#[tokio::test(start_paused = true)]
async fn a_body_that_says_it_ended_early_but_streams_on_keeps_its_slot() {
    let (client, mut body, script) = one_body().await;
    script.send(Step::SaysEnded("part 1")).unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part 1");
    assert!(body.is_end_stream(), "it says it has ended");
    // ... and it streams on.
    script.send(Step::Data("part 2")).unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part 2");
    let second = client.clone().oneshot(Request::new(())).await;
    assert!(
        refused(&second),
        "a second download was admitted while the first still streams under a max of 1"
    );
    drop(body);
}

/// A permit is freed once however many ways a body ends: `None` after a
/// frame after which it says it ended, `None` again, and the drop.
/// Then exactly one new body holds the one slot.
#[tokio::test(start_paused = true)]
async fn a_body_ended_every_way_frees_its_slot_once() {
    let store = still();
    let client = RateLimitLayer::new(store, one_at_a_time(), GlobalKey::default())
        .for_http_client()
        .layer(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                Bytes::from_static(b"whole"),
            )))
        }));
    let mut body = client
        .clone()
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .into_body();
    assert!(body.frame().await.unwrap().is_ok());
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    assert!(body.frame().await.is_none());
    drop(body);
    for round in 0..3 {
        let held = client.clone().oneshot(Request::new(())).await.unwrap();
        let other = client.clone().oneshot(Request::new(())).await;
        assert!(refused(&other), "round {round}: two bodies held one slot");
        drop(held);
    }
}

/// An empty body (is_end_stream from the start, never polled) frees its
/// slot when dropped; a body polled to `None` only, with a size hint of 0
/// but not reporting its end, too.
#[tokio::test(start_paused = true)]
async fn empty_bodies_never_polled_free_their_slot_at_drop() {
    let client = RateLimitLayer::new(still(), one_at_a_time(), GlobalKey::default())
        .for_http_client()
        .layer(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        }));
    for _ in 0..3 {
        let response = client.clone().oneshot(Request::new(())).await.unwrap();
        assert!(response.body().is_end_stream());
        let other = client.clone().oneshot(Request::new(())).await;
        assert!(refused(&other), "an unread empty body lost its slot");
        drop(response);
    }
}

/// A body that yields one chunk and then never ends (a live stream).
struct Endless {
    sent: bool,
}

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent {
            Poll::Pending
        } else {
            self.sent = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"live\n")))))
        }
    }
}

/// On a real server (hyper HTTP/1.1 over loopback), a HEAD to an endless
/// stream, a `204` and a `304` whose handlers return endless bodies: hyper
/// sends no body and drops it, so the slot is free for the next request
/// (over a fresh connection and over the same keep-alive one).
#[tokio::test]
async fn head_204_and_304_with_endless_bodies_free_their_slots_on_a_real_server() {
    let endless = || axum::body::Body::new(Endless { sent: false });
    let app = Router::new()
        .route(
            "/live",
            get(move || async move { Response::new(endless()) }),
        )
        .route(
            "/none",
            get(move || async move {
                let mut r = Response::new(endless());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }),
        )
        .route(
            "/same",
            get(move || async move {
                let mut r = Response::new(endless());
                *r.status_mut() = StatusCode::NOT_MODIFIED;
                r
            }),
        )
        .route("/small", get(|| async { "small" }))
        .layer(RateLimitLayer::new(
            MemoryStore::new(),
            one_at_a_time(),
            GlobalKey::default(),
        ));
    let base = serve(app).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let run = async {
        for (method, path) in [
            (reqwest::Method::HEAD, "/live"),
            (reqwest::Method::GET, "/none"),
            (reqwest::Method::GET, "/same"),
            (reqwest::Method::HEAD, "/none"),
        ] {
            let first = http
                .request(method.clone(), format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            assert!(
                first.status() != StatusCode::TOO_MANY_REQUESTS,
                "{method} {path}: {}",
                first.status()
            );
            let _ = first.bytes().await;
            // hyper drops the body after writing the head; allow it a moment.
            let mut admitted = false;
            for _ in 0..250 {
                let next = http.get(format!("{base}/small")).send().await.unwrap();
                if next.status() == StatusCode::OK {
                    admitted = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(admitted, "{method} {path}: its slot was never freed");
        }
    };
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("bounded");
}

/// Route rules read together, around a header key that may be missing
/// (`missing_key = "allow"`: the rule is skipped, later rules still
/// apply), rules without routes in between, `GET` rules asked by `HEAD`,
/// a `POST` rule not asked, and a deep rule raising the configuration's
/// depth: every rule applies together as it does alone, on paths a hop
/// reads otherwise.
#[test]
fn route_rules_together_around_missing_keys_and_head_apply_as_alone() {
    use ratelimit_tower::config::Config;
    let policy = |name: &str| {
        format!(
            "[policies.{name}]\nalgorithm = \"fixed-window\"\nlimit = 100000\nwindow = \"1000d\"\n"
        )
    };
    let rules: [&str; 7] = [
        "key = \"header:x-api-key\"\nmissing_key = \"allow\"\nroutes = [\"/a/b/c/d/e/f\"]\n",
        "key = \"global\"\nroutes = [\"/admin\"]\nmethods = [\"GET\"]\n",
        "key = \"global\"\n",
        "key = \"global\"\nroutes = [\"/api/\", \"/files/{*rest}\"]\nmethods = [\"POST\"]\n",
        "key = \"header:x-api-key\"\nmissing_key = \"allow\"\nroutes = [\"/admin/users\"]\n",
        "key = \"global\"\nroutes = [\"/files/private%2Fr\", \"/x/{id}/y\"]\nmethods = [\"GET\", \"DELETE\"]\n",
        "key = \"global\"\nroutes = [\"/\"]\nmethods = [\"OPTIONS\"]\n",
    ];
    let config_of = |numbers: &[usize]| {
        let mut text = String::new();
        for &n in numbers {
            text.push_str(&policy(&format!("p{n}")));
        }
        for &n in numbers {
            text.push_str(&format!(
                "[[rules]]\npolicy = \"p{n}\"\ncost = {}\n{}",
                n + 1,
                rules[n]
            ));
        }
        Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    };
    let all: Vec<usize> = (0..rules.len()).collect();
    let together = config_of(&all);
    let alone: Vec<Config> = all.iter().map(|&n| config_of(&[n])).collect();
    let paths = [
        "/admin",
        "/ADMIN",
        "/admin/",
        "//admin",
        "/x/../admin",
        "/x/%2e%2e/admin",
        "/admin%2Fusers",
        "/admin/users;x=1",
        "/static/..;/admin/users",
        "/a/b/c/d/e/f/g",
        "/a/b/c/d/e/f/../../../../../../admin/users",
        "/x/1/y/../../../admin",
        "/files/private/r",
        "/files/private%2Fr",
        "/files%2Fprivate%2Fr",
        "/api",
        "/api/",
        "/api/v1",
        "/x/1/y",
        "/x//y",
        "\\admin",
        "/%5cadmin",
        "/admin%00",
        "/admin%3Fx",
        "/x/%2fadmin",
        "/.%2e/admin",
        "/./admin/./users",
    ];
    let methods = ["GET", "HEAD", "POST", "DELETE", "OPTIONS", "PUT"];
    let mut failures = Vec::new();
    let mut cases = 0;
    for path in paths {
        for method in methods {
            for key in [None, Some("k1")] {
                let build = || {
                    let mut b = Request::builder().method(method).uri(path);
                    if let Some(k) = key {
                        b = b.header("x-api-key", k);
                    }
                    b.body(()).ok()
                };
                let Some(req) = build() else {
                    continue;
                };
                cases += 1;
                let got: std::collections::BTreeSet<u64> =
                    together.limits(&req).iter().map(|(_, _, c)| c).collect();
                let want: std::collections::BTreeSet<u64> = alone
                    .iter()
                    .flat_map(|c| c.limits(&req).iter().map(|(_, _, c)| c).collect::<Vec<_>>())
                    .collect();
                let bypassed: Vec<_> = want.difference(&got).map(|c| c - 1).collect();
                if !bypassed.is_empty() {
                    failures.push(format!(
                        "{method} {path} key={key:?}: rules {bypassed:?} bypassed"
                    ));
                }
            }
        }
    }
    // A request with an invalid target never reaches a layer; the rest ran.
    assert!(cases > 100, "{cases}");
    assert!(failures.is_empty(), "{failures:#?}");
}

//! The tonic_grpc example, run as a real process and called by a real tonic
//! client over loopback: 5 health checks per API key pass, the 6th is
//! `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`, other callers
//! (another API key, or no key at all: the peer IP) have their own budgets
//! within their address's, and a caller that sends a new API key with every
//! call gets no more than the limit.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ratelimit_tests::{ChildGuard, assert_refuses_flags, free_port, spawn_example, wait_for_port};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Everything a test does over the network must end within this.
const TEST_LIMIT: Duration = Duration::from_secs(30);

/// One health check of `service`, with `x-api-key: api_key` when given.
async fn check(
    client: &mut HealthClient<Channel>,
    service: &str,
    api_key: Option<&str>,
) -> Result<ServingStatus, Status> {
    let mut request = Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    request.set_timeout(Duration::from_secs(5));
    if let Some(key) = api_key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
    }
    let response = client.check(request).await?;
    Ok(response.into_inner().status())
}

/// Starts the example with `args` on a free loopback port, waits for it,
/// and connects a health client to it.
async fn start(args: &[&str]) -> (ChildGuard, HealthClient<Channel>) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = spawn_example(
        "tonic_grpc",
        &[&["--listen", listen.as_str()][..], args].concat(),
        &[],
    );
    wait_for_port(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(60),
    );
    let channel = Channel::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the example");
    (server, HealthClient::new(channel))
}

#[tokio::test]
async fn five_checks_per_key_then_resource_exhausted_with_pushback() {
    // An address may make 20 calls: room for three callers of 5 each.
    let (_server, mut client) =
        start(&["--limit", "5", "--window", "60s", "--ip-limit", "20"]).await;

    tokio::time::timeout(TEST_LIMIT, async {
        // The whole server (""), then the health service by name: both serving.
        for i in 0..5 {
            let service = if i % 2 == 0 {
                ""
            } else {
                "grpc.health.v1.Health"
            };
            let status = check(&mut client, service, Some("alice"))
                .await
                .unwrap_or_else(|s| panic!("call {} of alice: {s:?}", i + 1));
            assert_eq!(status, ServingStatus::Serving, "call {}", i + 1);
        }

        let refused = check(&mut client, "", Some("alice"))
            .await
            .expect_err("the 6th call of alice within 60 s is refused");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        let pushback: u64 = refused
            .metadata()
            .get("grpc-retry-pushback-ms")
            .expect("grpc-retry-pushback-ms in the metadata")
            .to_str()
            .unwrap()
            .parse()
            .expect("grpc-retry-pushback-ms is a non-negative integer");
        // The first call leaves the 60 s window at most 60 s from now.
        assert!((1..=60_000).contains(&pushback), "pushback {pushback} ms");

        // Another key has its own budget.
        let status = check(&mut client, "", Some("bob"))
            .await
            .expect("bob is still served");
        assert_eq!(status, ServingStatus::Serving);

        // Without a key the caller is keyed by its IP: 5 more, then refused.
        for i in 0..5 {
            check(&mut client, "", None)
                .await
                .unwrap_or_else(|s| panic!("call {} without a key: {s:?}", i + 1));
        }
        let refused = check(&mut client, "", None)
            .await
            .expect_err("the 6th call from this IP is refused");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

        // Alice is still refused: a refusal takes nothing, but frees nothing either.
        let refused = check(&mut client, "", Some("alice")).await.unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    })
    .await
    .expect("the gRPC calls took too long");
}

/// A caller that sends a new `x-api-key` with every call (what a client
/// that wants more than its limit does) meets its address's limit, which is
/// `--limit` unless `--ip-limit` says otherwise.
#[tokio::test]
async fn a_new_api_key_on_every_call_passes_no_more_than_the_limit() {
    for (args, limit) in [
        (&["--limit", "5", "--window", "60s"][..], 5),
        (
            &["--limit", "2", "--window", "60s", "--ip-limit", "7"][..],
            7,
        ),
    ] {
        let (_server, mut client) = start(args).await;
        tokio::time::timeout(TEST_LIMIT, async {
            let mut passed = 0;
            for i in 0..50 {
                match check(&mut client, "", Some(&format!("rotating-{i}"))).await {
                    Ok(status) => {
                        assert_eq!(status, ServingStatus::Serving);
                        passed += 1;
                    }
                    Err(refused) => {
                        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
                    }
                }
            }
            assert_eq!(passed, limit, "{args:?}: 50 calls, each with a new key");
        })
        .await
        .expect("the gRPC calls took too long");
    }
}

#[test]
fn tonic_grpc_rejects_bad_flags() {
    for (args, flag) in [
        (&["--limit", "0"][..], "'--limit <N>'"),
        (&["--window", "10 parsecs"], "'--window <DURATION>'"),
        (&["--window", "0s"], "'--window <DURATION>'"),
        (&["--listen", "nowhere"], "'--listen <ADDR>'"),
        (
            &["--limit", "1", "--limit", "2"],
            "cannot be used multiple times",
        ),
        (&["--frobnicate"], "'--frobnicate'"),
        (&["--ip-limit", "0"], "'--ip-limit <N>'"),
    ] {
        assert_refuses_flags("tonic_grpc", args, flag);
    }
}

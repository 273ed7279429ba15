//! The tonic_grpc example, run as a real process and called by a real tonic
//! client over loopback: 5 health checks per API key pass, the 6th is
//! `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`, and other callers
//! (another API key, or no key at all: the peer IP) have their own budgets.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use ratelimit_tests::{assert_refuses_flags, free_port, spawn_example, wait_for_port};
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

#[tokio::test]
async fn five_checks_per_key_then_resource_exhausted_with_pushback() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _server = spawn_example(
        "tonic_grpc",
        &["--listen", &listen, "--limit", "5", "--window", "60s"],
        &[],
    );
    wait_for_port(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(60),
    );

    tokio::time::timeout(TEST_LIMIT, async {
        let channel = Channel::from_shared(format!("http://{listen}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to the example");
        let mut client = HealthClient::new(channel);

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
    ] {
        assert_refuses_flags("tonic_grpc", args, flag);
    }
}

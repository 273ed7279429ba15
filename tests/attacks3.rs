//! Attacks of the third review, by a reviewer who had not seen the code: each
//! test asserts a promise of SECURITY.md or RELIABILITY.md ("Every limit
//! holds") the way an attacker or an operator's ordinary configuration would
//! try to break it.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response};
use ratelimit_core::MemoryStore;
use ratelimit_tower::config::Config;
use ratelimit_tower::{FailurePolicy, PeerAddr, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

async fn ok(_req: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::from("ok")))
}

fn req(path: &str, ip: &str, headers: &[(&str, &str)]) -> Request<String> {
    let mut builder = Request::get(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut req = builder.body(String::new()).expect("request");
    req.extensions_mut().insert(PeerAddr(SocketAddr::new(
        ip.parse().expect("an address"),
        40_000,
    )));
    req
}

async fn statuses(config: Config, reqs: Vec<Request<String>>) -> Vec<u16> {
    let layer =
        RateLimitLayer::with_rules(MemoryStore::new(), config).on_failure(FailurePolicy::Closed);
    let service = ServiceBuilder::new().layer(layer).service_fn(ok);
    let mut out = Vec::new();
    for req in reqs {
        let response = service.clone().oneshot(req).await.expect("infallible");
        out.push(response.status().as_u16());
    }
    out
}

/// SECURITY.md, "Every limit holds": a client cannot "drain another client's
/// budget" through the headers it sends. One policy (one quota per client)
/// used by two rules that key clients by two headers, `x-tenant` on the
/// tenant API and `x-api-key` on the public API, an ordinary way to say "10
/// requests an hour per client" once. The two header keys are hashed the same
/// way under one policy name, so the store key of `x-api-key: acme` is the
/// store key of `x-tenant: acme`: a client that knows another's tenant id
/// (not a secret) sends it as its API key on the public API and drains that
/// tenant's budget.
#[tokio::test]
async fn two_header_keys_under_one_policy_do_not_share_budgets() {
    let config = Config::from_toml(
        "[policies.per-client]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\n\
         [[rules]]\npolicy = \"per-client\"\nkey = \"header:x-tenant\"\nroutes = [\"/tenant\"]\n\n\
         [[rules]]\npolicy = \"per-client\"\nkey = \"header:x-api-key\"\nroutes = [\"/public\"]\n",
    )
    .expect("valid");
    let attacker = |_| req("/public/items", "198.51.100.9", &[("x-api-key", "acme")]);
    let mut reqs: Vec<_> = (0..2).map(attacker).collect();
    // The tenant `acme`, from its own address, on its own API.
    reqs.push(req("/tenant/items", "192.0.2.1", &[("x-tenant", "acme")]));
    assert_eq!(
        statuses(config, reqs).await,
        [200, 200, 200],
        "a client sending another's tenant id as its API key drained that tenant's budget"
    );
}

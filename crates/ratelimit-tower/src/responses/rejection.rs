//! [`Rejection`]: why a request was refused. A leaf module: the responses
//! (`reject`, `problem`, `headers`) import it, it imports none of them.

use std::fmt;
use std::sync::Arc;

use ratelimit_core::StoreError;

use crate::decisions::Decisions;

/// Why a request was refused.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rejection {
    /// A limit denied the request. The decisions say which and for how long
    /// (those that [refuse](crate::PolicyDecision::refuses) it; shadow
    /// policies are listed too, and never refuse).
    Limited(Decisions),
    /// The request costs more than a policy could ever admit: retrying cannot help.
    CostTooHigh {
        /// The policy's name.
        policy: String,
        /// The cost asked for.
        cost: u64,
        /// The most the policy admits.
        max: u64,
    },
    /// A rule found no key and is configured to refuse such requests.
    MissingKey,
    /// A rule keys requests by the peer address, and the server gives none:
    /// a wiring mistake (axum: serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`). `500`, gRPC
    /// `INTERNAL`.
    NoPeerAddress,
    /// The store could not decide because of an outage (unreachable, timed
    /// out) and the failure policy refuses the request, or the in-memory store
    /// is full: `503 Service Unavailable` (gRPC `UNAVAILABLE`). The body and
    /// `grpc-message` say so in general terms, never the error's text (which
    /// may name hosts); the layer logs it.
    Unavailable(Arc<StoreError>),
    /// The store answered with an error that is not an outage
    /// ([`StoreError::is_outage`]): a policy conflict, a reply that does not
    /// decode, a permission the Redis user lacks. A configuration mistake or
    /// a bug, which no failure policy lifts: `500 Internal Server Error`
    /// (gRPC `INTERNAL`). The body does not echo the error; the layer logs it.
    Internal(Arc<StoreError>),
}

impl Rejection {
    /// The delay after which the same request could pass, for
    /// [`Rejection::Limited`]: the longest `retry_after` of the limits that
    /// refuse it (shadow policies left out).
    pub fn retry_after_micros(&self) -> Option<u64> {
        match self {
            Rejection::Limited(decisions) => decisions
                .iter()
                .filter(|e| e.refuses())
                .map(|e| e.decision().retry_after_micros())
                .max(),
            _ => None,
        }
    }
}

impl Rejection {
    /// What a client is told (the problem+json `detail`, gRPC's
    /// `grpc-message`): the [`Display`](fmt::Display) text, except for the
    /// refusals that carry a store error ([`Rejection::Unavailable`],
    /// [`Rejection::Internal`]), which say what happened in general terms.
    /// The error's own text (host names, addresses, Redis's error strings,
    /// internal keys) stays in the server's logs, where the layer writes it.
    pub(crate) fn public_detail(&self) -> String {
        match self {
            Rejection::Unavailable(error) if matches!(**error, StoreError::Full { .. }) => {
                String::from("rate limit store full; retry later")
            }
            Rejection::Unavailable(_) => String::from("rate limit store unavailable"),
            Rejection::Internal(_) => {
                String::from("rate limiter failed; the server's logs say why")
            }
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Limited(decisions) => {
                f.write_str("rate limit exceeded")?;
                let mut names = decisions
                    .iter()
                    .filter(|e| e.refuses())
                    .map(|e| e.policy().name());
                if let Some(first) = names.next() {
                    write!(f, " ({first}")?;
                    for name in names {
                        write!(f, ", {name}")?;
                    }
                    f.write_str(")")?;
                }
                Ok(())
            }
            Rejection::CostTooHigh { policy, cost, max } => write!(
                f,
                "request cost {cost} exceeds what policy {policy} can ever admit ({max})"
            ),
            Rejection::MissingKey => f.write_str("no rate-limit key for this request"),
            Rejection::NoPeerAddress => f.write_str(
                "rate limiter misconfigured: no peer address for this request; \
                 serve the axum app with into_make_service_with_connect_info::<SocketAddr>()",
            ),
            Rejection::Unavailable(e) => write!(f, "rate limiter unavailable: {e}"),
            Rejection::Internal(e) => write!(f, "rate limiter failed: {e}"),
        }
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Rejection::Unavailable(e) | Rejection::Internal(e) => Some(&**e),
            _ => None,
        }
    }
}

/// `Retry-After` in delay-seconds: rounded up, and at least 1.
pub(crate) fn retry_after_seconds(micros: u64) -> u64 {
    micros.div_ceil(1_000_000).max(1)
}

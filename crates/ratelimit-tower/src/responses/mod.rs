//! Responses: what a refusal is ([`Rejection`]) and how it reaches the client
//! ([`Reject`], [`HttpRejections`], [`ErrorRejections`]): HTTP `429` with a
//! problem+json body (`problem`), gRPC trailers-only responses (`grpc`), and
//! the rate-limit header fields on every response (`headers`).

pub(crate) mod grpc;
pub mod headers;
pub mod problem;
pub(crate) mod reject;
pub(crate) mod rejection;

pub use reject::{BoxError, ErrorRejections, HttpRejections, Reject, RejectionBody};
pub use rejection::Rejection;

//! Responses: what a refusal is ([`Rejection`]) and how it reaches the client
//! ([`HttpRejections`], the one builder; errors for other request types):
//! HTTP `429` with a problem+json body (`problem`), gRPC trailers-only
//! responses (`grpc`), and the rate-limit header fields on every response
//! (`headers`).

pub(crate) mod fields;
pub(crate) mod grpc;
pub mod headers;
pub(crate) mod problem;
pub(crate) mod reject;
pub(crate) mod rejection;

pub use reject::{ClientRejections, ErrorRejections, HttpRejections, Reject};
pub use rejection::Rejection;

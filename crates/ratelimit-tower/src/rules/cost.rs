//! Cost functions: how much of the budget a request takes.

/// How much a request costs. Cost 0 peeks: the request is checked but takes
/// nothing.
///
/// A number (`u64`) is a fixed price, the same for every request; closures
/// `Fn(&Req) -> u64` price each request.
///
/// ```
/// use ratelimit_tower::Cost;
/// use http::{Method, Request};
///
/// let req = Request::post("/").body(()).unwrap();
/// assert_eq!(10.cost(&req), 10);
///
/// let by_method = |req: &Request<()>| if req.method() == Method::GET { 1 } else { 5 };
/// assert_eq!(by_method.cost(&req), 5);
/// ```
pub trait Cost<Req>: Clone + Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &Req) -> u64;
}

/// The same cost for every request.
impl<Req> Cost<Req> for u64 {
    fn cost(&self, _: &Req) -> u64 {
        *self
    }
}

impl<F, Req> Cost<Req> for F
where
    F: Fn(&Req) -> u64 + Clone + Send + Sync + 'static,
{
    fn cost(&self, req: &Req) -> u64 {
        self(req)
    }
}

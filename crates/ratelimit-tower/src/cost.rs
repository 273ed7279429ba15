//! Cost functions: how much of the budget a request takes.

/// How much a request costs. Cost 0 peeks: the request is checked but takes
/// nothing.
///
/// Closures `Fn(&Req) -> u64` are cost functions; [`Constant`] is the usual
/// fixed price.
///
/// ```
/// use ratelimit_tower::Cost;
/// use http::{Method, Request};
///
/// let by_method = |req: &Request<()>| if req.method() == Method::GET { 1 } else { 5 };
/// let req = Request::post("/").body(()).unwrap();
/// assert_eq!(by_method.cost(&req), 5);
/// ```
pub trait Cost<Req>: Clone + Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &Req) -> u64;
}

/// The same cost for every request (1 by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Constant(pub u64);

impl Default for Constant {
    fn default() -> Self {
        Constant(1)
    }
}

impl<Req> Cost<Req> for Constant {
    fn cost(&self, _: &Req) -> u64 {
        self.0
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

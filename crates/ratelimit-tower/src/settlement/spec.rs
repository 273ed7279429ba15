//! [`Settlement`]: how a rule reads what a request really cost from its
//! response, and when it gives the reservation back; [`ActualCost`], the
//! cost a handler hands over in the response's extensions;
//! [`SettleError`], a rule that cannot settle.

use std::fmt;
use std::sync::Arc;

use http::response::Parts;
use http::{Extensions, HeaderName};
use ratelimit_core::{Policy, Store};

/// What a request really cost, inserted by its handler into the response's
/// extensions, for a rule that settles [from the extension](Settlement::from_extension):
/// a handler that should not write a header, or whose cost should never
/// reach the client.
///
/// ```
/// use ratelimit_tower::ActualCost;
///
/// let mut response = http::Response::new(String::from("done"));
/// response.extensions_mut().insert(ActualCost(417));
/// # assert_eq!(response.extensions().get::<ActualCost>(), Some(&ActualCost(417)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActualCost(pub u64);

type ReadExtension = dyn Fn(&Extensions) -> Option<u64> + Send + Sync;
type IsFailure = dyn Fn(&Parts) -> bool + Send + Sync;

/// How a rule settles a request's cost once its response head arrives: the
/// rule's cost is then only an **estimate**, reserved before the call, and
/// the response says what the request really cost (tokens generated, rows
/// scanned). Give it to a rule with [`Rule::settle`](crate::Rule::settle) or
/// [`RateLimitLayer::settle`](crate::RateLimitLayer::settle).
///
/// - **Where the cost is read**: a response header the service sets
///   ([`from_header`](Settlement::from_header), removed from the response
///   unless [`keep_header`](Settlement::keep_header) says otherwise), or a
///   value the handler puts in the response's extensions
///   ([`from_extension`](Settlement::from_extension) reads [`ActualCost`],
///   [`from_extension_with`](Settlement::from_extension_with) any type).
/// - **A header's value** is a whole number of units in ASCII digits,
///   spaces and tabs around it allowed, sent once. Anything else (a sign, a
///   fraction, hex, an empty value, the header twice) is invalid. A missing
///   or invalid cost settles at the estimate: the reservation stays as it
///   was taken (an estimate of 0 is charged 1: a cost unknown is never
///   free, so a header the service never sends cannot lift the limit). Both are logged (the first of a layer at `warn`, then at
///   `debug`) and counted ([`Stats`](crate::Stats),
///   `ratelimit_settlements_total` outcomes `missing_cost` and
///   `invalid_cost`).
/// - **A huge cost** is charged as twice the policy's limit (outcome
///   `clamped`): a settlement can take a budget at most one full budget
///   into debt, and twice the limit gets there from any reservation, so a
///   larger number would change nothing but the arithmetic. Numbers with
///   more digits than a `u64` holds are huge, never invalid: a cost is never
///   lowered by its size.
/// - **Refunds**: a response the rule classifies as a failure (by default a
///   `5xx` status; [`refund_if`](Settlement::refund_if) sets another test)
///   gives the whole reservation back, whatever cost it names. So does a
///   request whose future is dropped before its response head (the client
///   went away), or whose inner service answers with an error, unless
///   [`refund_on_cancel`](Settlement::refund_on_cancel) says `false`.
///   Whatever the reason, a settlement gives back only what the
///   reservation still holds after the time it was held: nothing once its
///   window ended, or once the refill paid its units back (see
///   [`Settle`](ratelimit_core::Settle)).
///
/// For gRPC, whose failures are HTTP `200` with a `grpc-status` other than
/// `0` (in the head of a trailers-only response), give a test that reads it:
/// `.refund_if(|head| head.headers.get("grpc-status").is_some_and(|s| s != "0"))`.
///
/// The settlement happens when the response head arrives. What the body does
/// afterwards does not change it: a body that fails midway keeps the cost
/// its head named (a service that knows about the failure before it sends
/// the head answers `5xx`; one that learns it later and wants to give units
/// back does so itself, with [`Store::settle`](ratelimit_core::Store::settle)
/// or an admin reward).
///
/// ```
/// use ratelimit_tower::{HeaderKey, MemoryStore, Policy, Rate, RateLimitLayer, Settlement};
///
/// // 1,000 tokens a minute per API key; each call reserves 1 and is settled
/// // to the tokens its response reports in `x-tokens-used`.
/// let budget = Policy::token_bucket(1_000, Rate::per_minute(1_000))?.with_name("tokens")?;
/// let layer = RateLimitLayer::new(MemoryStore::new(), budget, HeaderKey::from_static("x-api-key"))
///     .cost(1)
///     .settle(Settlement::from_static_header("x-tokens-used"))?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Settlement {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    source: Source,
    keep_header: bool,
    // `None`: a 5xx status.
    refund_if: Option<Arc<IsFailure>>,
    refund_on_cancel: bool,
}

#[derive(Clone)]
enum Source {
    Header(HeaderName),
    Extension(Arc<ReadExtension>),
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Settlement");
        match &self.inner.source {
            Source::Header(name) => s.field("header", name),
            Source::Extension(_) => s.field("extension", &".."),
        };
        s.field("keep_header", &self.inner.keep_header)
            .field(
                "refund_if",
                &self.inner.refund_if.as_ref().map_or("5xx", |_| ".."),
            )
            .field("refund_on_cancel", &self.inner.refund_on_cancel)
            .finish()
    }
}

impl Settlement {
    fn with_source(source: Source) -> Self {
        Settlement {
            inner: Arc::new(Inner {
                source,
                keep_header: false,
                refund_if: None,
                refund_on_cancel: true,
            }),
        }
    }

    /// Reads the cost from the response header `name`, which the layer
    /// removes from the response (see [`keep_header`](Settlement::keep_header)).
    pub fn from_header(name: HeaderName) -> Self {
        Settlement::with_source(Source::Header(name))
    }

    /// Reads the cost from the response header `name`, a constant:
    /// `Settlement::from_static_header("x-tokens-used")`.
    ///
    /// # Panics
    ///
    /// As [`HeaderName::from_static`]: when `name` is not a valid header name
    /// in lowercase. A constant, so this shows at the first run.
    pub fn from_static_header(name: &'static str) -> Self {
        Settlement::from_header(HeaderName::from_static(name))
    }

    /// Reads the cost from the [`ActualCost`] the handler inserted into the
    /// response's extensions.
    ///
    /// ```
    /// use ratelimit_tower::{ActualCost, Settlement};
    ///
    /// let settlement = Settlement::from_extension();
    /// // In the handler:
    /// let mut response = http::Response::new(String::from("42 rows"));
    /// response.extensions_mut().insert(ActualCost(42));
    /// # let _ = settlement;
    /// ```
    pub fn from_extension() -> Self {
        Settlement::from_extension_with(|cost: &ActualCost| cost.0)
    }

    /// Reads the cost from a value of type `T` the handler inserted into the
    /// response's extensions, through `read`: for a type the application
    /// already has.
    ///
    /// ```
    /// use ratelimit_tower::Settlement;
    ///
    /// #[derive(Clone)]
    /// struct Usage { prompt_tokens: u64, completion_tokens: u64 }
    ///
    /// let settlement = Settlement::from_extension_with(|usage: &Usage| {
    ///     usage.prompt_tokens.saturating_add(usage.completion_tokens)
    /// });
    /// # let _ = settlement;
    /// ```
    pub fn from_extension_with<T, F>(read: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> u64 + Send + Sync + 'static,
    {
        let read: Arc<ReadExtension> =
            Arc::new(move |extensions: &Extensions| extensions.get::<T>().map(&read));
        Settlement::with_source(Source::Extension(read))
    }

    /// Whether the cost header reaches the client (default `false`: the
    /// layer removes it, so what a request cost stays inside the service).
    /// A header that another settling limit of the same request reads and
    /// does not keep is removed all the same. No effect on a cost read from
    /// the extensions, which never leave.
    #[must_use]
    pub fn keep_header(mut self, keep: bool) -> Self {
        Arc::make_mut(&mut self.inner).keep_header = keep;
        self
    }

    /// Gives the whole reservation back for the responses `is_failure`
    /// accepts, in place of the default test, a `5xx` status. Given the
    /// response's head (status, headers, extensions); `|_| false` never
    /// refunds a response.
    ///
    /// ```
    /// use ratelimit_tower::Settlement;
    ///
    /// // Client and server errors alike cost nothing.
    /// let settlement = Settlement::from_static_header("x-tokens-used")
    ///     .refund_if(|head| head.status.is_client_error() || head.status.is_server_error());
    /// # let _ = settlement;
    /// ```
    #[must_use]
    pub fn refund_if<F>(mut self, is_failure: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.inner).refund_if = Some(Arc::new(is_failure));
        self
    }

    /// Whether a request that ends without a response head gives its
    /// reservation back (default `true`): its future dropped (the client
    /// went away, a timeout layer gave up) or its inner service answering
    /// with an error. `false` keeps the estimate: for work that costs
    /// whether or not anyone waits for it.
    #[must_use]
    pub fn refund_on_cancel(mut self, refund: bool) -> Self {
        Arc::make_mut(&mut self.inner).refund_on_cancel = refund;
        self
    }

    /// The header the cost is read from, if it is read from one.
    pub fn header(&self) -> Option<&HeaderName> {
        match &self.inner.source {
            Source::Header(name) => Some(name),
            Source::Extension(_) => None,
        }
    }

    /// The header the layer removes from the response, if any.
    pub(crate) fn strips(&self) -> Option<&HeaderName> {
        self.header().filter(|_| !self.inner.keep_header)
    }

    /// Whether the response whose head is `parts` gives the reservation back.
    pub(crate) fn is_failure(&self, parts: &Parts) -> bool {
        match &self.inner.refund_if {
            Some(is_failure) => is_failure(parts),
            None => parts.status.is_server_error(),
        }
    }

    /// Whether a request without a response head gives its reservation back.
    pub(crate) fn refunds_on_cancel(&self) -> bool {
        self.inner.refund_on_cancel
    }

    /// The cost the response whose head is `parts` names: `None` when it
    /// names none, `Some(Err(()))` when what it names is not a cost.
    pub(crate) fn cost_in(&self, parts: &Parts) -> Option<Result<u64, ()>> {
        match &self.inner.source {
            Source::Header(name) => super::reading::header_cost(parts.headers.get_all(name)),
            Source::Extension(read) => read(&parts.extensions).map(Ok),
        }
    }
}

/// A rule or a layer that cannot settle costs after the response: refused
/// when it is built ([`Rule::settle`](crate::Rule::settle),
/// [`RateLimitLayer::settle`](crate::RateLimitLayer::settle)), and each of
/// its requests refused (`500`) should it reach a layer anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleError {
    /// The policy's algorithm has no settlement: a concurrency limit, whose
    /// units are permits held and released, not consumed
    /// ([`Policy::supports_settlement`]).
    Unsupported {
        /// The policy's name.
        policy: String,
        /// The algorithm's kind.
        algorithm: &'static str,
    },
    /// The layer's store has no settlement for the policy
    /// ([`Store::supports_settlement`]: a `MultiRegionStore`, whose counts
    /// only grow, or a store that keeps the default): a cost above the
    /// estimate could never be charged.
    StoreUnsupported {
        /// The policy's name.
        policy: String,
        /// The algorithm's kind.
        algorithm: &'static str,
    },
}

impl SettleError {
    /// `Ok` when `policy` can be settled, else the error that says why not.
    pub(crate) fn check(policy: &Policy) -> Result<(), SettleError> {
        if policy.supports_settlement() {
            Ok(())
        } else {
            Err(SettleError::Unsupported {
                policy: policy.name().to_owned(),
                algorithm: policy.algorithm().kind(),
            })
        }
    }

    /// `Ok` when `store` can settle `policy`, else the error that says why
    /// not.
    pub(crate) fn check_in<St: Store>(store: &St, policy: &Policy) -> Result<(), SettleError> {
        SettleError::check(policy)?;
        if store.supports_settlement(policy) {
            Ok(())
        } else {
            Err(SettleError::StoreUnsupported {
                policy: policy.name().to_owned(),
                algorithm: policy.algorithm().kind(),
            })
        }
    }
}

impl fmt::Display for SettleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettleError::Unsupported { policy, algorithm } => write!(
                f,
                "policy `{policy}` ({algorithm}) cannot settle costs after the response: \
                 its units are permits held and released, not consumed"
            ),
            SettleError::StoreUnsupported { policy, algorithm } => write!(
                f,
                "the store cannot settle costs of policy `{policy}` ({algorithm}) after the \
                 response: a cost above the estimate could never be charged"
            ),
        }
    }
}

impl std::error::Error for SettleError {}

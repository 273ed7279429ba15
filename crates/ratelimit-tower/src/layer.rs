//! [`RateLimitLayer`]: the configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Policy, Store};

use crate::decide::Settings;
use crate::metrics::Recorder;
use crate::options::{FailurePolicy, MissingKey, Mode, Stats};
use crate::responses::headers::RateLimitHeaders;
use crate::responses::reject::{ClientRejections, ErrorRejections, HttpRejections};
use crate::responses::rejection::Rejection;
use crate::rules::rule::{And, Rule};
use crate::settlement::{SettleError, Settlement};

/// Rate-limits requests with one or more rules, in a store.
///
/// ```
/// use ratelimit_core::{MemoryStore, Policy, Rate};
/// use ratelimit_tower::{GlobalKey, PeerIp, RateLimitLayer, Rule};
/// use std::time::Duration;
///
/// // 5 requests per 10 seconds per client IP...
/// let layer = RateLimitLayer::new(
///     MemoryStore::new(),
///     Policy::sliding_window_log(5, Duration::from_secs(10))?,
///     PeerIp,
/// )
/// // ...and 1,000 per second for everyone together, all or nothing.
/// .and(Rule::new(Policy::gcra(1_000, Rate::per_second(1_000))?, GlobalKey::default()));
/// # Ok::<(), ratelimit_core::PolicyError>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer<St, P, J = HttpRejections> {
    pub(crate) settings: Settings<St>,
    pub(crate) rules: P,
    pub(crate) reject: J,
}

// Written out so that the settings are the layer's own fields, around its
// rules and refusals: `Settings` is internal.
impl<St: fmt::Debug, P: fmt::Debug, J: fmt::Debug> fmt::Debug for RateLimitLayer<St, P, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Settings {
            stats,
            store,
            mode,
            failure,
            timeout,
            near_limit,
            recorder,
        } = &self.settings;
        f.debug_struct("RateLimitLayer")
            .field("stats", stats)
            .field("store", store)
            .field("rules", &self.rules)
            .field("reject", &self.reject)
            .field("mode", mode)
            .field("failure", failure)
            .field("timeout", timeout)
            .field("near_limit", near_limit)
            .field("recorder", recorder)
            .finish()
    }
}

impl<St, K> RateLimitLayer<St, Rule<K>> {
    /// Limits requests by `key` under `policy`, in `store`, at cost 1,
    /// letting requests through while the store is down
    /// ([`FailurePolicy::Open`], the default of every limiter in these
    /// crates: see [`FailurePolicy`] for why, and
    /// [`on_failure`](RateLimitLayer::on_failure) to choose otherwise).
    pub fn new(store: St, policy: Policy, key: K) -> Self {
        RateLimitLayer::with_rules(store, Rule::new(policy, key))
    }
}

impl<St, P> RateLimitLayer<St, P> {
    /// Limits requests with `rules`: a [`Rule`], rules joined with
    /// [`Rule::and`], or a closure returning the [`Limits`](crate::Limits)
    /// for each request, possibly after an asynchronous lookup. While the
    /// store is down, requests go through ([`FailurePolicy::Open`], see
    /// [`on_failure`](RateLimitLayer::on_failure)).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::Arc;
    /// use ratelimit_core::{MemoryStore, Policy, Rate};
    /// use ratelimit_tower::{Limits, RateLimitLayer};
    ///
    /// let free = Policy::gcra(10, Rate::per_minute(10))?.with_name("free")?;
    /// let pro = Policy::gcra(100, Rate::per_minute(100))?.with_name("pro")?;
    /// let tiers: Arc<HashMap<&'static str, Policy>> = Arc::new(HashMap::from([("key-pro", pro)]));
    ///
    /// let layer = RateLimitLayer::with_rules(MemoryStore::new(), move |req: &http::Request<()>| {
    ///     let api_key = req.headers().get("x-api-key").map(|v| v.as_bytes().to_vec());
    ///     let (tiers, free) = (tiers.clone(), free.clone());
    ///     async move {
    ///         let Some(api_key) = api_key else { return Limits::reject() };
    ///         let policy = std::str::from_utf8(&api_key)
    ///             .ok()
    ///             .and_then(|k| tiers.get(k).cloned())
    ///             .unwrap_or(free);
    ///         Limits::one(policy, api_key, 1)
    ///     }
    /// });
    /// # let _ = layer;
    /// # Ok::<(), ratelimit_core::PolicyError>(())
    /// ```
    pub fn with_rules(store: St, rules: P) -> Self {
        RateLimitLayer {
            settings: Settings {
                stats: Arc::default(),
                store,
                mode: Mode::default(),
                failure: FailurePolicy::default(),
                timeout: None,
                near_limit: crate::metrics::DEFAULT_NEAR_LIMIT,
                recorder: Recorder::default(),
            },
            rules,
            reject: HttpRejections::default(),
        }
    }
}

impl<St, P> RateLimitLayer<St, P, HttpRejections> {
    /// Answers refusals with `f`, which is given the refusal and the response
    /// the layer would send (see [`HttpRejections::on_rejection`]): return
    /// that for the cases you leave alone.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Response, StatusCode};
    /// use ratelimit_tower::{HeaderKey, MemoryStore, Policy, RateLimitLayer, Rejection};
    /// use std::time::Duration;
    ///
    /// let policy = Policy::fixed_window(100, Duration::from_secs(60))?;
    /// let layer = RateLimitLayer::new(MemoryStore::new(), policy, HeaderKey::from_static("x-api-key"))
    ///     // No API key: 401; every other refusal as the layer answers it.
    ///     .on_rejection(|rejection, default| match rejection {
    ///         Rejection::MissingKey => {
    ///             let mut unauthorized = Response::new(Bytes::from_static(b"API key required\n"));
    ///             *unauthorized.status_mut() = StatusCode::UNAUTHORIZED;
    ///             unauthorized
    ///         }
    ///         _ => default,
    ///     });
    /// # let _ = layer;
    /// # Ok::<(), ratelimit_tower::PolicyError>(())
    /// ```
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection, http::Response<bytes::Bytes>) -> http::Response<bytes::Bytes>
            + Send
            + Sync
            + 'static,
    {
        self.reject = self.reject.on_rejection(f);
        self
    }

    /// Which rate-limit headers to send on allowed and denied responses
    /// (default: the IETF `RateLimit-Policy` and `RateLimit` fields).
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.reject = self.reject.headers(headers);
        self
    }
}

impl<St, K, C, J> RateLimitLayer<St, Rule<K, C>, J> {
    /// Prices requests with `cost`: a number for a fixed price, or a closure
    /// over the request ([`Cost`](crate::Cost)).
    ///
    /// ```
    /// use ratelimit_tower::{MemoryStore, PeerIp, Policy, RateLimitLayer};
    /// use std::time::Duration;
    /// use tower::ServiceBuilder;
    ///
    /// let policy = Policy::fixed_window(100, Duration::from_secs(60))?;
    /// // Each request takes 10 of the 100.
    /// let layer = RateLimitLayer::new(MemoryStore::new(), policy, PeerIp).cost(10);
    /// let service = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|_req: http::Request<String>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     });
    /// # let _ = service;
    /// # Ok::<(), ratelimit_tower::PolicyError>(())
    /// ```
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<St, Rule<K, C2>, J> {
        self.map(|rules| rules.cost(cost), |reject| reject)
    }

    /// Settles each request's cost after its response, as `settlement`
    /// says: the [`cost`](RateLimitLayer::cost) is then an estimate,
    /// reserved before the call (see [`Rule::settle`] and [Costs known after
    /// the response](crate#costs-known-after-the-response)).
    ///
    /// # Errors
    ///
    /// [`SettleError::Unsupported`](crate::SettleError::Unsupported) for a
    /// concurrency policy;
    /// [`SettleError::StoreUnsupported`](crate::SettleError::StoreUnsupported)
    /// when the layer's store cannot settle the policy.
    pub fn settle(mut self, settlement: Settlement) -> Result<Self, SettleError>
    where
        St: Store,
    {
        SettleError::check_in(&self.settings.store, self.rules.policy())?;
        self.rules = self.rules.settle(settlement)?;
        Ok(self)
    }

    /// What to do with requests without a key (default: by extractor, see
    /// [`MissingKey`]).
    #[must_use]
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.rules = self.rules.on_missing_key(missing_key);
        self
    }

    /// The policy of the rule.
    pub fn policy(&self) -> &Policy {
        self.rules.policy()
    }
}

impl<St, P, J> RateLimitLayer<St, P, J> {
    /// Checks `rule` too, all or nothing with the rules already there.
    pub fn and<R>(self, rule: R) -> RateLimitLayer<St, And<P, R>, J> {
        self.map(|rules| And(rules, rule), |reject| reject)
    }

    /// The layer with its rules and its rejections made anew from these,
    /// everything else kept.
    fn map<P2, J2>(
        self,
        rules: impl FnOnce(P) -> P2,
        reject: impl FnOnce(J) -> J2,
    ) -> RateLimitLayer<St, P2, J2> {
        RateLimitLayer {
            settings: self.settings,
            rules: rules(self.rules),
            reject: reject(self.reject),
        }
    }

    /// Refusals become errors (a [`Rejection`] in a `tower::BoxError`,
    /// `Box<dyn Error + Send + Sync>`), for request types that are not HTTP
    /// ([`ErrorRejections`]). The inner service's error must convert into
    /// `BoxError`; give it a concrete error type (with an inner
    /// error that is already `BoxError`, the futures may not be `Send` across
    /// `tokio::spawn`, because of how the compiler checks that conversion for
    /// all lifetimes).
    ///
    /// Such a layer does not wrap the inner service's response, so a
    /// concurrency permit ends when that response arrives: right where the
    /// response is the whole work (a query, a job), not where a body
    /// streams after it. For an HTTP client, use
    /// [`for_http_client`](Self::for_http_client), whose response bodies
    /// hold their permits.
    pub fn for_errors(self) -> RateLimitLayer<St, P, ErrorRejections> {
        self.map(|rules| rules, |_| ErrorRejections)
    }

    /// Refusals become errors, as with [`for_errors`](Self::for_errors),
    /// for a stack that sends HTTP requests (`http::Request` in,
    /// `http::Response` out; [`ClientRejections`]): an allowed response's
    /// body holds the request's concurrency permits until it ends or is
    /// dropped, so a download keeps its slot while it streams, and costs
    /// settle from the response's head.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use ratelimit_tower::{GlobalKey, MemoryStore, Policy, RateLimitLayer, Rejection};
    /// use std::time::Duration;
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// let downloads = Policy::concurrency(1, Duration::from_secs(60))?;
    /// let client = ServiceBuilder::new()
    ///     .layer(RateLimitLayer::new(MemoryStore::new(), downloads, GlobalKey::default()).for_http_client())
    ///     .service_fn(|_: Request<()>| async {
    ///         Ok::<_, Infallible>(Response::new(String::from("a large file")))
    ///     });
    /// let first = client.clone().oneshot(Request::new(())).await?;
    /// // Its body has not been read: the slot is still taken.
    /// let second = client.clone().oneshot(Request::new(())).await;
    /// assert!(second.unwrap_err().downcast_ref::<Rejection>().is_some());
    /// drop(first);
    /// assert!(client.oneshot(Request::new(())).await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn for_http_client(self) -> RateLimitLayer<St, P, ClientRejections> {
        self.map(|rules| rules, |_| ClientRejections)
    }

    /// Reject or wait (default: [`Mode::Reject`]).
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// Wait up to `max_delay` for denied requests instead of refusing them
    /// (see [`Mode::Wait`]).
    #[must_use]
    pub fn wait(self, max_delay: Duration) -> Self {
        self.mode(Mode::Wait { max_delay })
    }

    /// What to do when the store cannot decide because of an outage
    /// (default [`FailurePolicy::Open`], as for `ratelimit-axum`'s `Limiter`:
    /// an outage of the store is not an outage of the service). Errors that
    /// are not outages are refused whatever this says.
    #[must_use]
    pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
        self.settings.failure = failure;
        self
    }

    /// What the layer has done when the store could not decide, shared by
    /// every service this layer built.
    pub fn stats(&self) -> &Stats {
        &self.settings.stats
    }

    /// Allowed decisions that leave less than `fraction` of their policy's
    /// limit count in `ratelimit_near_limit_total` (default 0.1: under a
    /// tenth left). Clamped to `0.0..=1.0`; 0 (or NaN) counts none. Only
    /// recorded with the `metrics` feature (see [`metrics`](crate::metrics)).
    #[must_use]
    pub fn near_limit(mut self, fraction: f64) -> Self {
        self.settings.near_limit = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The longest one store call may take before it counts as a failure
    /// (default: none here; stores such as `RedisStore` have their own).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = Some(timeout);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layer's `Debug` lists its settings as fields of its own, in the
    /// order they are set: nothing nests them.
    #[test]
    fn debug_shows_every_setting_as_a_field_of_the_layer() {
        let layer = RateLimitLayer::with_rules("store", "rules")
            .mode(Mode::Wait {
                max_delay: Duration::from_millis(5),
            })
            .on_failure(FailurePolicy::Closed)
            .near_limit(0.25)
            .timeout(Duration::from_millis(7));
        let shown = format!("{layer:#?}");
        assert!(shown.starts_with("RateLimitLayer {\n"), "{shown}");
        let fields: Vec<&str> = shown
            .lines()
            .filter_map(|line| line.strip_prefix("    "))
            .filter(|line| line.starts_with(|c: char| c.is_ascii_lowercase()))
            .collect();
        let names: Vec<&str> = fields
            .iter()
            .map(|field| field.split(':').next().unwrap_or(field))
            .collect();
        assert_eq!(
            names,
            [
                "stats",
                "store",
                "rules",
                "reject",
                "mode",
                "failure",
                "timeout",
                "near_limit",
                "recorder"
            ],
            "{shown}"
        );
        for (field, value) in [
            ("store", "\"store\","),
            ("rules", "\"rules\","),
            ("mode", "Wait {"),
            ("failure", "Closed,"),
            ("timeout", "Some("),
            ("near_limit", "0.25,"),
        ] {
            assert!(
                fields.contains(&format!("{field}: {value}").as_str()),
                "{field} in {shown}"
            );
        }
    }
}

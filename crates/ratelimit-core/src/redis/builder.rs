//! [`RedisStoreBuilder`]: URLs, TLS, cluster, Sentinel, pool, timeouts,
//! prefix, coalescing; `build` connects, loads the scripts and probes the ACL.

use super::*;

/// Configures a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) urls: Vec<String>,
    pub(super) cluster: bool,
    pub(super) prefix: String,
    pub(super) pool_size: u32,
    pub(super) connect_timeout: Duration,
    pub(super) call_timeout: Duration,
    pub(super) max_batch: usize,
    pub(super) fixed_clock: Option<Arc<dyn Clock>>,
    pub(super) allow_unresolved_hosts: bool,
    pub(super) allow_eviction: bool,
    #[cfg(feature = "sentinel")]
    pub(super) sentinel: Option<super::sentinel::Settings>,
    #[cfg(feature = "sentinel")]
    pub(super) master: super::sentinel::MasterOptions,
    #[cfg(feature = "tls")]
    pub(super) root_cert: Option<Vec<u8>>,
    #[cfg(feature = "bb8")]
    pub(super) pool: Option<bb8::Pool<bb8_redis::RedisConnectionManager>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("RedisStoreBuilder");
        f.field("nodes", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("max_batch", &self.max_batch)
            .field("allow_unresolved_hosts", &self.allow_unresolved_hosts)
            .field("allow_eviction", &self.allow_eviction)
            .field("bb8_pool", &self.has_pool());
        #[cfg(feature = "sentinel")]
        f.field(
            "sentinels",
            &self.sentinel.as_ref().map_or(0, |s| s.sentinels.len()),
        )
        .field("master", &self.master);
        f.finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key (default `ratelimit`). Use one prefix per
    /// application sharing a Redis.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many multiplexed connections to keep to a single node (default
    /// 4, at least 1). Each is shared by every concurrent
    /// call, which pipelines its commands; calls take them in turn. On a bb8
    /// pool ([`RedisStore::bb8_builder`]) the pool's `max_size` counts instead.
    /// On a Redis Cluster, the masters share them: each master gets
    /// `size / masters`, rounded down, and at least 1, for the pipelines of
    /// coalescing (see [`max_batch`](Self::max_batch)); redis-rs's cluster
    /// client keeps its own.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// The time allowed to open a connection, TLS, log-in and the store's
    /// ACL check included (default 1 s). A connection
    /// is opened in the background: calls wait for it within their own
    /// [`call_timeout`](Self::call_timeout), and one that takes longer to
    /// open than a call may take is still opened for the calls that follow.
    /// On a bb8 pool, the pool's `connection_timeout` counts instead.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The time allowed for one decision, waiting for a pooled connection
    /// included (default 100 ms). Past it, the call fails with
    /// [`StoreError::Timeout`] and the caller's failure policy applies.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The most work sent to Redis as one call, in units of one simple
    /// decision (default 64; 1 turns coalescing off, and 0
    /// counts as 1). A concurrency check weighs its `max` + 1 units (it reads
    /// every permit held), a sliding-log check 8, any other check 1; a batch
    /// always takes at least one request.
    ///
    /// A request goes out at once while fewer than two calls are in flight
    /// (one with a pool of one connection); the
    /// requests that arrive while that many are in flight are gathered, and
    /// each call that returns sends
    /// up to `max_batch` units of them as one call of the batch function. No timer
    /// and no added wait; each request keeps its own outcome, and the limits
    /// of one [`check_all`](Store::check_all) stay all or nothing. Redis runs
    /// a batch as one script: the bound also bounds how long one call holds
    /// Redis (the bound times a simple decision, or one costly request).
    ///
    /// On a cluster a call declares every key it touches, and Redis refuses
    /// a call whose keys span slots: a batch is one pipeline to a master,
    /// one call per slot, at most `max_batch` units in all, and each master
    /// has one in flight before requests wait. Checks that take concurrency
    /// permits are never batched there.
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Lets [`build`](Self::build) succeed when a Redis host name does not
    /// resolve, for a deployment whose Redis may get its DNS name only after
    /// the application starts: until it resolves, calls fail as an outage
    /// ([`StoreError::Unavailable`]) and the failure policy decides, so under
    /// a fail-open policy every request passes unlimited.
    ///
    /// Without it (the default), `build` resolves the host name of the URL
    /// (of each seed URL on a cluster) and fails with an error naming the
    /// host when one does not resolve within the
    /// [`connect_timeout`](Self::connect_timeout): a mistyped `redis://` URL
    /// is a configuration mistake found at start-up, not an outage that
    /// lifts every limit without a sound. A name that resolves to a server
    /// that is down still builds (the outage is the failure policy's), and a
    /// store on an application's bb8 pool resolves nothing (the pool's
    /// manager connects).
    ///
    /// ```
    /// use ratelimit_core::redis::RedisStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mistyped = RedisStore::builder("redis://no-such-host.invalid:6379").build().await;
    /// assert!(mistyped.unwrap_err().to_string().contains("no-such-host.invalid"));
    ///
    /// // Redis gets its name later: an outage until then.
    /// let later = RedisStore::builder("redis://no-such-host.invalid:6379")
    ///     .allow_unresolved_hosts()
    ///     .build()
    ///     .await?;
    /// # drop(later);
    /// # Ok(())
    /// # }
    /// ```
    pub fn allow_unresolved_hosts(mut self) -> Self {
        self.allow_unresolved_hosts = true;
        self
    }

    /// Builds on a node whose `maxmemory-policy` may evict keys. Every
    /// rate-limit key has a TTL, so every `volatile-*` and `allkeys-*`
    /// policy may evict them once the node is full, and a key evicted
    /// within its window starts again with a full budget: a client that
    /// rotates keys can push its own counters out. Without this,
    /// [`build`](Self::build) refuses such a node (when it may read the
    /// policy with `INFO memory`; on a cluster, every master's). Set
    /// `maxmemory-policy noeviction` instead
    /// where you can: a full node then refuses writes, which the layer
    /// refuses too (`500`), never admits.
    pub fn allow_eviction(mut self) -> Self {
        self.allow_eviction = true;
        self
    }

    /// For `rediss://` URLs: trust the CA certificate `pem` (PEM bytes)
    /// instead of the system's roots, as for a private CA. On a cluster, for
    /// every node.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_cert = Some(pem.into());
        self
    }

    /// Behind Redis Sentinel ([`RedisStore::sentinel_builder`]): log in to
    /// the master, and to the replica that replaces it after a failover, as
    /// `username` with `password`: an ACL user, or `default` with the
    /// `requirepass` password. (The sentinels' own credentials go in their
    /// URLs.) Without it, the store connects to the master without logging in.
    #[cfg(feature = "sentinel")]
    pub fn master_credentials(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.master.credentials = Some((username.into(), password.into()));
        self
    }

    /// Behind Redis Sentinel ([`RedisStore::sentinel_builder`]): the
    /// master's database (default 0; a negative number is refused by
    /// [`build`](Self::build)).
    #[cfg(feature = "sentinel")]
    pub fn master_db(mut self, db: i64) -> Self {
        self.master.db = db;
        self
    }

    /// Behind Redis Sentinel ([`RedisStore::sentinel_builder`]): TLS to the
    /// master and to the replica that replaces it, trusting
    /// [`tls_root_cert`](Self::tls_root_cert) when given, else the system's
    /// roots. The sentinels are reached over TLS when their addresses are
    /// `rediss://` URLs.
    #[cfg(all(feature = "sentinel", feature = "tls"))]
    pub fn master_tls(mut self) -> Self {
        self.master.tls = true;
        self
    }

    /// Makes the scripts use `clock` instead of the Redis server's `TIME`,
    /// so a test can replay a timeline through both stores. Keys then get an
    /// hour of extra TTL, since the timeline does not run in real time. Only
    /// in this workspace's test builds (see `build.rs`), never published.
    #[cfg(ratelimit_test_hooks)]
    // Hidden: `ratelimit-tests` replays timelines with it; test builds only.
    #[doc(hidden)]
    pub fn script_clock_for_tests(mut self, clock: impl Clock) -> Self {
        self.fixed_clock = Some(Arc::new(clock));
        self
    }

    /// Builds the store. A single-node store connects lazily (Redis may be
    /// down at start-up; calls then fail and the failure policy applies); a
    /// cluster store reads the cluster's topology now.
    ///
    /// Fails, among other mistakes, when a host name of the URL (of a seed
    /// URL on a cluster) does not resolve, unless
    /// [`allow_unresolved_hosts`](Self::allow_unresolved_hosts) is set, and
    /// when a single node that answers refuses the URL's credentials or may
    /// evict keys (unless [`allow_eviction`](Self::allow_eviction); one
    /// connection is tried, within the connect timeout; a node that does not
    /// answer then is an outage, not a mistake). Behind Redis Sentinel, fails
    /// when no sentinel answers, none monitors the master's name, or the
    /// sentinels or the master refuse the credentials (see
    /// [`RedisStore::sentinel_builder`]).
    pub async fn build(mut self) -> Result<RedisStore, StoreError> {
        if !valid_prefix(&self.prefix) {
            return Err(StoreError::Backend(
                format!(
                    "invalid key prefix {:?}: use 1 to 64 characters from [A-Za-z0-9._-]",
                    self.prefix
                )
                .into(),
            ));
        }
        if !self.allow_unresolved_hosts {
            resolve_hosts(&self.urls, self.connect_timeout).await?;
        }
        #[cfg(feature = "sentinel")]
        let followed = self.following().await?;
        #[cfg(not(feature = "sentinel"))]
        let followed: Option<Backend> = None;
        let backend = if let Some(followed) = followed {
            followed
        } else if let Some(pooled) = self.pooled()? {
            pooled
        } else if self.cluster {
            #[cfg(feature = "redis-cluster")]
            {
                #[cfg(feature = "tls")]
                let _ = rustls::crypto::ring::default_provider().install_default();
                let watchers = Arc::new(super::masters::Watchers::default());
                let clients = super::cluster::Clients {
                    first: self.cluster_client(0, Some(&watchers))?,
                    routed: self.cluster_client(CLUSTER_RETRIES, None)?,
                    watchers,
                };
                let seed = self.urls.first().map(String::as_str).unwrap_or_default();
                let seed =
                    redis::IntoConnectionInfo::into_connection_info(seed).map_err(backend_error)?;
                let masters = super::masters::Masters::new(
                    seed,
                    #[cfg(feature = "tls")]
                    self.root_cert.clone(),
                    self.connect_timeout,
                    self.pool_size,
                );
                let cluster = super::cluster::Cluster::connect(
                    clients,
                    masters,
                    Duration::from_millis(cluster_retry_wait(self.call_timeout)),
                    self.connect_timeout,
                )
                .await?;
                let connection = cluster.routed();
                // The ACL probe, on the master of its key's slot (the
                // cluster client reconnects on its own, unprobed).
                let probe = AclProbe::new(&self.prefix);
                tokio::time::timeout(self.connect_timeout, probe.run(&mut connection.clone()))
                    .await
                    .map_err(|_| StoreError::Timeout(self.connect_timeout))?
                    .map_err(backend_error)?;
                if !self.allow_eviction {
                    // Every master's `INFO memory` (a user not allowed
                    // `INFO`, or a slow answer, is not checked).
                    let mut command = redis::cmd("INFO");
                    command.arg("memory");
                    let mut asking = connection.clone();
                    let info = command.query_async::<redis::Value>(&mut asking);
                    if let Ok(Ok(info)) = tokio::time::timeout(self.connect_timeout, info).await
                        && let Some(policy) = evicting_anywhere(&info)
                    {
                        return Err(eviction_error(&policy));
                    }
                }
                Backend::Cluster(Box::new(cluster))
            }
            #[cfg(not(feature = "redis-cluster"))]
            {
                return Err(StoreError::Backend(
                    "Redis Cluster needs the `redis-cluster` feature".into(),
                ));
            }
        } else {
            let url = self.urls.first().cloned().unwrap_or_default();
            #[cfg(feature = "tls")]
            let client = {
                // redis-rs uses the process's default rustls provider.
                let _ = rustls::crypto::ring::default_provider().install_default();
                client_trusting(url.as_str(), self.root_cert.clone()).map_err(backend_error)?
            };
            #[cfg(not(feature = "tls"))]
            let client = redis::Client::open(url.as_str()).map_err(backend_error)?;
            check_node(&client, self.connect_timeout, self.allow_eviction).await?;
            Backend::Node(Node::Own(Box::new(Connections::new(
                client,
                self.connect_timeout,
                self.pool_size,
                AclProbe::new(&self.prefix),
            ))))
        };
        let pool_size = match &backend {
            Backend::Node(node) => node.size(),
            #[cfg(feature = "redis-cluster")]
            Backend::Cluster(_) => usize::try_from(self.pool_size).unwrap_or(usize::MAX),
        };
        let coalescer = (self.max_batch > 1).then(|| Coalescer::new(self.max_batch, pool_size));
        Ok(RedisStore {
            inner: Arc::new(Inner {
                backend,
                prefix: self.prefix,
                call_timeout: self.call_timeout,
                scripts: Scripts::new(),
                functions: functions::Mode::default(),
                fixed_clock: self.fixed_clock,
                permit_ids: crate::decision::PermitIds::new(),
                pending_releases: Default::default(),
                coalescer,
            }),
        })
    }
}

impl RedisStoreBuilder {
    /// A client of the cluster at the store's URLs that retries a command
    /// `retries` times (each `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
    /// dropped connection or unreachable node counts one). Each command
    /// sent to a node waits at most the call timeout for its reply (so do
    /// redis-rs's own, such as `CLUSTER SLOTS` and the `PING` after a
    /// connection opens: without it, one node that hangs held up every new
    /// connection for good); the store times each call over all its
    /// attempts itself (see `cluster`), so redis-rs keeps no second timer
    /// per call. `watchers`, when given, hear each connection's slot map
    /// (see `masters`).
    #[cfg(feature = "redis-cluster")]
    fn cluster_client(
        &self,
        retries: u32,
        watchers: Option<&Arc<super::masters::Watchers>>,
    ) -> Result<redis::cluster::ClusterClient, StoreError> {
        #[cfg(feature = "tls")]
        let _ = rustls::crypto::ring::default_provider().install_default();
        let wait = cluster_retry_wait(self.call_timeout);
        let builder = redis::cluster::ClusterClient::builder(self.urls.clone())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.call_timeout)
            .overall_response_timeout(None)
            .retries(retries)
            .min_retry_wait(wait)
            .max_retry_wait(wait.saturating_add(1));
        let builder = match watchers {
            Some(watchers) => {
                builder.read_routing_strategy(super::masters::WatcherFactory(watchers.clone()))
            }
            None => builder,
        };
        #[cfg(feature = "tls")]
        let builder = match self.root_cert.clone() {
            Some(root_cert) => builder.certs(trusting(root_cert)),
            None => builder,
        };
        builder.build().map_err(backend_error)
    }

    fn has_pool(&self) -> bool {
        #[cfg(feature = "bb8")]
        return self.pool.is_some();
        #[cfg(not(feature = "bb8"))]
        false
    }

    /// The backend on the application's bb8 pool, if it gave one.
    #[cfg(feature = "bb8")]
    fn pooled(&mut self) -> Result<Option<Backend>, StoreError> {
        let Some(pool) = self.pool.take() else {
            return Ok(None);
        };
        #[cfg(feature = "tls")]
        if self.root_cert.is_some() {
            return Err(StoreError::Backend(
                "tls_root_cert is for the store's own connections; a bb8 pool connects \
                 as its RedisConnectionManager says"
                    .into(),
            ));
        }
        let probe = AclProbe::new(&self.prefix);
        Ok(Some(Backend::Node(Node::Pool(pool::Bb8::new(pool, probe)))))
    }

    #[cfg(not(feature = "bb8"))]
    #[allow(clippy::unnecessary_wraps)]
    fn pooled(&mut self) -> Result<Option<Backend>, StoreError> {
        Ok(None)
    }

    /// The backend behind Redis Sentinel, if `sentinel_builder` made this
    /// builder: the sentinels are asked for the master now (see
    /// [`Master::check`](super::sentinel::Master::check)).
    #[cfg(feature = "sentinel")]
    async fn following(&mut self) -> Result<Option<Backend>, StoreError> {
        let Some(settings) = self.sentinel.take() else {
            if self.master != super::sentinel::MasterOptions::default() {
                return Err(StoreError::Backend(
                    "master_credentials, master_db and master_tls are for a store built \
                     with sentinel_builder; give a node's credentials and database in its URL"
                        .into(),
                ));
            }
            return Ok(None);
        };
        let urls = settings.urls(&self.master)?;
        if !self.allow_unresolved_hosts {
            resolve_hosts(&urls, self.connect_timeout).await?;
        }
        #[cfg(feature = "tls")]
        let _ = rustls::crypto::ring::default_provider().install_default();
        #[cfg(feature = "tls")]
        let root_cert = self.root_cert.as_deref();
        #[cfg(not(feature = "tls"))]
        let root_cert = None;
        let clients = settings.clients(&self.master, &urls, root_cert)?;
        let events = super::sentinel::Settings::sentinel_clients(&urls, root_cert)?;
        let master = Arc::new(super::sentinel::Master::new(
            clients,
            settings.master_name,
            self.connect_timeout,
        ));
        let named = master.check().await?;
        super::sentinel::watch(&master, events);
        if let Some(client) = &named {
            check_node(client, self.connect_timeout, self.allow_eviction).await?;
        }
        // Each opening asks `master` for the master's client; this one (the
        // master named now, or a sentinel's) is never used to open one.
        let client = match named {
            Some(client) => client,
            None => redis::Client::open(urls[0].as_str()).map_err(backend_error)?,
        };
        Ok(Some(Backend::Node(Node::Own(Box::new(
            Connections::following(
                master,
                client,
                self.connect_timeout,
                self.pool_size,
                AclProbe::new(&self.prefix),
            ),
        )))))
    }
}

/// Resolves the host name of each TCP URL of `urls` (a Unix socket has none;
/// a URL that does not parse is left to the client, which reports it), each
/// within `timeout`: an error naming the first host that does not resolve.
/// Mistakes a node that answers can show at start-up, rather than as
/// refusals or over-admissions later: refused credentials (one connection is
/// tried and a `PING` sent), and, unless `allow_eviction`, a
/// `maxmemory-policy` that may evict rate-limit keys (read with `INFO
/// memory`; a user not allowed `INFO` is not checked). A node that is down,
/// slow or unreachable lets the store build (its calls are outages until it
/// answers), and so does any other error, which every call will report.
async fn check_node(
    client: &redis::Client,
    timeout: Duration,
    allow_eviction: bool,
) -> Result<(), StoreError> {
    let attempt = async {
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await?;
        if allow_eviction {
            return Ok(None);
        }
        let info = redis::cmd("INFO")
            .arg("memory")
            .query_async::<String>(&mut connection)
            .await
            .ok();
        Ok::<_, redis::RedisError>(info)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Err(error))
            if error.kind() == redis::ErrorKind::AuthenticationFailed
                || error.code() == Some("NOAUTH")
                || error.code() == Some("WRONGPASS") =>
        {
            Err(StoreError::Backend(
                format!(
                    "Redis refused the credentials of the URL ({error}); \
                     check its user name and password"
                )
                .into(),
            ))
        }
        Ok(Ok(Some(info))) => match evicting_policy(&info) {
            Some(policy) => Err(eviction_error(policy)),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// A node that may evict keys, under `policy`: a mistake for `build()`.
fn eviction_error(policy: &str) -> StoreError {
    StoreError::Backend(
        format!(
            "Redis's maxmemory-policy is {policy}, which may evict rate-limit keys \
             (each has a TTL) and hand their clients a fresh budget: set \
             maxmemory-policy noeviction, or build with allow_eviction()"
        )
        .into(),
    )
}

/// An evicting policy in any node's `INFO memory` of a cluster's reply (a
/// map of node to text, or one text).
#[cfg(feature = "redis-cluster")]
fn evicting_anywhere(reply: &redis::Value) -> Option<String> {
    match reply {
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(evicting_policy)
            .map(str::to_owned),
        redis::Value::SimpleString(text) => evicting_policy(text).map(str::to_owned),
        redis::Value::VerbatimString { text, .. } => evicting_policy(text).map(str::to_owned),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().find_map(evicting_anywhere)
        }
        redis::Value::Map(pairs) => pairs.iter().find_map(|(_, v)| evicting_anywhere(v)),
        _ => None,
    }
}

/// The `maxmemory_policy` of an `INFO memory` reply, when it may evict keys:
/// a policy other than `noeviction` under a memory bound (`maxmemory` 0 is
/// none).
fn evicting_policy(info: &str) -> Option<&str> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let bounded = field("maxmemory").is_some_and(|bytes| bytes != "0");
    let policy = field("maxmemory_policy")?;
    (bounded && policy != "noeviction").then_some(policy)
}

async fn resolve_hosts(urls: &[String], timeout: Duration) -> Result<(), StoreError> {
    for url in urls {
        let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url.as_str()) else {
            continue;
        };
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
            _ => continue,
        };
        let unresolved = |why: String| {
            StoreError::Backend(
                format!(
                    "Redis host `{host}` does not resolve ({why}): check the URL, or call \
                     `allow_unresolved_hosts()` if the name may appear later (until then, \
                     calls fail as an outage)"
                )
                .into(),
            )
        };
        match tokio::time::timeout(timeout, tokio::net::lookup_host((host.as_str(), port))).await {
            Ok(Ok(mut addresses)) => {
                if addresses.next().is_none() {
                    return Err(unresolved(String::from("no address")));
                }
            }
            Ok(Err(error)) => return Err(unresolved(error.to_string())),
            Err(_) => return Err(unresolved(format!("no answer within {timeout:?}"))),
        }
    }
    Ok(())
}

/// How many times redis-rs's cluster client retries one command: each
/// `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, dropped connection or
/// unreachable node counts one.
#[cfg(feature = "redis-cluster")]
const CLUSTER_RETRIES: u32 = 16;

/// TLS settings that trust the CA certificate `root_cert` (PEM) instead of
/// the system's roots, with no client certificate.
#[cfg(feature = "tls")]
pub(super) fn trusting(root_cert: Vec<u8>) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    }
}

/// A client of the node at `info`; over TLS it trusts `root_cert` (PEM)
/// when given, else the system's roots.
#[cfg(feature = "tls")]
pub(super) fn client_trusting(
    info: impl redis::IntoConnectionInfo,
    root_cert: Option<Vec<u8>>,
) -> redis::RedisResult<redis::Client> {
    match root_cert {
        Some(root_cert) => redis::Client::build_with_tls(info, trusting(root_cert)),
        None => redis::Client::open(info),
    }
}

/// The wait, in milliseconds, before redis-rs retries a command that met
/// `TRYAGAIN` (a slot half migrated) or a node it could not connect to: one
/// [`CLUSTER_RETRIES`]th of the call timeout, at least 1 ms, so that the
/// retries of a migration span the call timeout. (The bounds given to
/// redis-rs, this and this + 1, make its jittered wait this constant.)
///
/// redis-rs waits the same before retrying a refused node (after the
/// `MOVED` from another master that served it in its place, which also
/// counts a retry): a stopped master therefore fails after about half the
/// call timeout, not at once. Its default (1.28 s and more) outlasted any
/// call timeout below it, so a migration's `TRYAGAIN` was a timeout, and an
/// outage, instead of a decision.
#[cfg(feature = "redis-cluster")]
fn cluster_retry_wait(call_timeout: Duration) -> u64 {
    let per_retry = call_timeout / CLUSTER_RETRIES;
    u64::try_from(per_retry.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

pub(super) fn valid_prefix(prefix: &str) -> bool {
    (1..=64).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

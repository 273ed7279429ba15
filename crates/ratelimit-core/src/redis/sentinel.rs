//! Redis Sentinel (feature `sentinel`): the store decides on the master the
//! sentinels name, through redis-rs's `SentinelClient`, and asks them again
//! whenever that master may have changed.
//!
//! A [`Master`] holds the master last named and an epoch that changes each
//! time the sentinels name another node. Connections remember the epoch they
//! were opened in (see `connections`), so once the master changes, every
//! connection to the old one is dropped before its next use. The master
//! becomes *suspect* after anything that may mean a failover: a connection
//! that broke or timed out, a write refused by a read-only replica
//! (`READONLY`: a master demoted under the store), a connection that could
//! not be opened. The next call then asks the sentinels first (one lookup
//! at a time, shared by the calls that wait for it, run in a task of its
//! own so that it completes for the calls that follow one that timed out).
//! While no sentinel names a master that answers as one, calls fail as an
//! outage and the failure policy decides.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError,
    ServerErrorKind,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::connections::Link;
use super::errors::is_outage;
use super::scripts::AclProbe;
use crate::StoreError;

/// The port of a sentinel whose address gives none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// What [`RedisStore::sentinel_builder`](super::RedisStore::sentinel_builder)
/// was given.
#[derive(Clone, Default)]
pub(super) struct Settings {
    /// The sentinels' addresses, as given.
    pub(super) sentinels: Vec<String>,
    /// The name the sentinels monitor the master under.
    pub(super) master_name: String,
}

/// How to reach the master: the builder's `master_*` options.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct MasterOptions {
    /// Log-in to the master: user name and password.
    pub(super) credentials: Option<(String, String)>,
    /// The master's database.
    pub(super) db: i64,
    /// TLS to the master (feature `tls`).
    pub(super) tls: bool,
}

impl std::fmt::Debug for MasterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterOptions")
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("db", &self.db)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The sentinels' addresses as `redis://` or `rediss://` URLs, each with
    /// a port ([`DEFAULT_SENTINEL_PORT`] where it gave none), or an error
    /// naming the first that is not an address.
    pub(super) fn urls(&self, master: &MasterOptions) -> Result<Vec<String>, StoreError> {
        if self.sentinels.is_empty() {
            return Err(config_error(
                "sentinel_builder needs the address of at least one sentinel".into(),
            ));
        }
        if self.master_name.trim().is_empty() {
            return Err(config_error(
                "sentinel_builder needs the master's name, as the sentinels monitor it \
                 (`sentinel monitor <name> ...`)"
                    .into(),
            ));
        }
        if master.db < 0 {
            return Err(config_error(format!(
                "master_db({}): a database is a number from 0",
                master.db
            )));
        }
        self.sentinels
            .iter()
            .map(|text| sentinel_url(text))
            .collect()
    }

    /// A `SentinelClient` for the master named `master_name`, logging in to
    /// the sentinels as their URLs say and to the master as the `master_*`
    /// options say; over TLS, trusting `root_cert` (PEM) when given.
    pub(super) fn client(
        &self,
        master: &MasterOptions,
        urls: &[String],
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] root_cert: Option<&[u8]>,
    ) -> Result<SentinelClient, StoreError> {
        let mut addresses = Vec::with_capacity(urls.len());
        let mut login: Option<(Option<String>, Option<String>)> = None;
        for url in urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| config_error(format!("sentinel {}: {e}", redacted(url))))?;
            let settings = info.redis_settings();
            if settings.db() != 0 {
                return Err(config_error(format!(
                    "sentinel {}: a sentinel has no database; give the master's with master_db()",
                    redacted(url)
                )));
            }
            let this = (
                settings.username().map(str::to_owned),
                settings.password().map(str::to_owned),
            );
            match &login {
                None => login = Some(this),
                Some(first) if *first != this => {
                    return Err(config_error(
                        "the sentinels' URLs give different credentials; every sentinel is \
                         logged in to with the same user and password"
                            .into(),
                    ));
                }
                Some(_) => {}
            }
            addresses.push(info.addr().clone());
        }
        let mut builder = SentinelClientBuilder::new(
            addresses.iter().cloned(),
            &self.master_name,
            SentinelServerType::Master,
        )
        .map_err(super::backend_error)?;
        if let Some((username, password)) = login {
            if let Some(username) = username {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = password {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if let Some((username, password)) = &master.credentials {
            builder = builder
                .set_client_to_redis_username(username)
                .set_client_to_redis_password(password);
        }
        if master.db != 0 {
            builder = builder.set_client_to_redis_db(master.db);
        }
        #[cfg(feature = "tls")]
        {
            if master.tls {
                builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
                if let Some(pem) = root_cert {
                    builder = builder
                        .set_client_to_redis_certificates(super::builder::trusting(pem.to_vec()));
                }
            }
            let tls = addresses
                .iter()
                .filter(|a| matches!(a, ConnectionAddr::TcpTls { .. }))
                .count();
            if let Some(pem) = root_cert.filter(|_| tls > 0) {
                if tls < addresses.len() {
                    return Err(config_error(
                        "some sentinels are rediss:// URLs and some are not: with \
                         tls_root_cert, give every sentinel over TLS, or none"
                            .into(),
                    ));
                }
                builder = builder
                    .set_client_to_sentinel_certificates(super::builder::trusting(pem.to_vec()));
            }
        }
        #[cfg(not(feature = "tls"))]
        if master.tls
            || addresses
                .iter()
                .any(|a| matches!(a, ConnectionAddr::TcpTls { .. }))
        {
            return Err(config_error(
                "TLS to the sentinels or the master needs the `tls` feature".into(),
            ));
        }
        builder.build().map_err(super::backend_error)
    }
}

/// `text` (`host:port`, `host`, or a `redis://`/`rediss://` URL) as a URL
/// with a port.
fn sentinel_url(text: &str) -> Result<String, StoreError> {
    let text = text.trim();
    let url = if text.contains("://") {
        text.to_owned()
    } else {
        format!("redis://{text}")
    };
    let not_an_address = || {
        config_error(format!(
            "sentinel {:?} is not an address: give host:port or a redis:// or rediss:// URL",
            redacted(text)
        ))
    };
    let mut parsed = redis::parse_redis_url(&url).ok_or_else(not_an_address)?;
    if matches!(parsed.scheme(), "redis" | "rediss") {
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(not_an_address());
        }
        if parsed.port().is_none() {
            parsed
                .set_port(Some(DEFAULT_SENTINEL_PORT))
                .map_err(|()| not_an_address())?;
        }
    }
    Ok(parsed.as_str().to_owned())
}

/// `text` without the password a URL may hold, for an error message.
fn redacted(text: &str) -> String {
    match (text.find("://"), text.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &text[..scheme], &text[at + 1..])
        }
        _ => text.to_owned(),
    }
}

fn config_error(message: String) -> StoreError {
    StoreError::Backend(message.into())
}

/// The master the sentinels name, and the lookups that find it.
pub(super) struct Master {
    /// The name the sentinels monitor it under.
    name: String,
    /// redis-rs's client of the sentinels, which names the master after
    /// checking with `ROLE` that it is one. One lookup at a time.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The longest a lookup may take.
    timeout: Duration,
    /// Which master: changes each time the sentinels name another node.
    epoch: AtomicU64,
    /// Whether the master may have changed since the last lookup.
    suspect: AtomicBool,
    /// How many lookups were started (their ids).
    lookups: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The master last named, and its address.
    named: Option<(redis::Client, ConnectionAddr)>,
    /// The lookup under way, if any.
    lookup: Option<Underway>,
}

/// What a lookup gives its waiters: nothing yet, then whether it found a
/// master.
type Looked = Option<Result<(), RedisError>>;

/// A lookup under way: its id, what it gives, and when it ends at the
/// latest (past it, its task is gone with its runtime).
struct Underway {
    id: u64,
    looked: watch::Receiver<Looked>,
    ends: Instant,
}

impl Master {
    /// A master named `name`, looked up through `sentinels` within `timeout`
    /// each time (not yet: the first call, or [`check`](Self::check), asks).
    pub(super) fn new(sentinels: SentinelClient, name: String, timeout: Duration) -> Self {
        Master {
            name,
            sentinels: tokio::sync::Mutex::new(sentinels),
            timeout,
            epoch: AtomicU64::new(0),
            suspect: AtomicBool::new(true),
            lookups: AtomicU64::new(0),
            state: Mutex::default(),
        }
    }

    /// The epoch of the master last named (0 before any).
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the next call asks the sentinels first.
    pub(super) fn is_suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// The master may have changed: the next call asks the sentinels first.
    pub(super) fn suspect(&self) {
        self.suspect.store(true, Ordering::Release);
    }

    /// The address of the master last named, as `host:port`.
    pub(super) fn address(&self) -> Option<String> {
        self.state
            .lock()
            .named
            .as_ref()
            .map(|(_, addr)| match addr {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    format!("{host}:{port}")
                }
                other => format!("{other:?}"),
            })
    }

    /// Notes `client` as the master: a new epoch when it is another node.
    fn name_master(&self, client: redis::Client) {
        let addr = client.get_connection_info().addr().clone();
        let mut state = self.state.lock();
        let moved = state.named.as_ref().is_none_or(|(_, known)| *known != addr);
        if moved {
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        state.named = Some((client, addr));
    }

    /// What `build()` checks: that the sentinels answer and name a master.
    /// `Ok(Some(client))`: the master they name, which answers as one;
    /// `Ok(None)`: they know the name, but its master does not answer now
    /// (an outage, as a single node that is down when the store is built);
    /// an error when no sentinel answers, none monitors the name, or the
    /// sentinels or the master refuse the credentials.
    pub(super) async fn check(&self) -> Result<Option<redis::Client>, StoreError> {
        let mut sentinels = self.sentinels.lock().await;
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let found = tokio::time::timeout(self.timeout, sentinels.async_get_client()).await;
        let error = match found {
            Ok(Ok(client)) => {
                self.name_master(client.clone());
                self.suspect.store(false, Ordering::Release);
                return Ok(Some(client));
            }
            Ok(Err(e)) if refused_credentials(&e) => {
                return Err(config_error(format!(
                    "Redis refused the credentials ({e}): a sentinel's come from its URL, \
                     the master's from master_credentials()"
                )));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        // Why no master: ask one sentinel whether it knows the name.
        let known = async {
            let sentinel = sentinels.async_get_sentinel_client().await?;
            let mut connection = sentinel.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name)
                .query_async::<Option<(String, u16)>>(&mut connection)
                .await
        };
        match tokio::time::timeout(self.timeout, known).await {
            Ok(Ok(Some(_))) => Ok(None),
            Ok(Ok(None)) => Err(config_error(format!(
                "no sentinel monitors a master named {:?} (check the name given to \
                 sentinel_builder against `sentinel monitor <name>`)",
                self.name
            ))),
            Ok(Err(e)) if refused_credentials(&e) => Err(config_error(format!(
                "a sentinel refused the credentials of its URL ({e})"
            ))),
            Ok(Err(e)) => Err(config_error(format!(
                "no sentinel answers ({e}; looking up the master: {error}): check the \
                 addresses given to sentinel_builder, the sentinels' own (usually port \
                 {DEFAULT_SENTINEL_PORT}), not the master's"
            ))),
            Err(_) => Err(config_error(format!(
                "no sentinel answers within {:?} (looking up the master: {error}): check \
                 the addresses given to sentinel_builder",
                self.timeout
            ))),
        }
    }

    /// Asks the sentinels for the master, or waits for the lookup under
    /// way: an outage error when they name none that answers as a master.
    pub(super) async fn look_up(self: &Arc<Self>) -> Result<(), RedisError> {
        // A second round only when the first lookup was lost with its
        // runtime (a store shared by runtimes, one of them shut down).
        for _ in 0..2 {
            let (mut looked, start) = {
                let mut state = self.state.lock();
                let now = Instant::now();
                match &state.lookup {
                    Some(underway) if now <= underway.ends => (underway.looked.clone(), None),
                    _ => {
                        let id = self.lookups.fetch_add(1, Ordering::Relaxed);
                        let (sender, looked) = watch::channel(None);
                        state.lookup = Some(Underway {
                            id,
                            looked: looked.clone(),
                            ends: now + self.timeout,
                        });
                        let task = Lookup {
                            master: Arc::clone(self),
                            id,
                            sender,
                        };
                        (looked, Some(task))
                    }
                }
            };
            // Spawned with the state's lock released: a task that cannot run
            // is dropped at once, and its drop takes the lock.
            if let Some(task) = start {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return Err(RedisError::from((
                        ErrorKind::Client,
                        "RedisStore needs a tokio runtime",
                    )));
                };
                runtime.spawn(task.run());
            }
            if let Ok(result) = looked.wait_for(Option::is_some).await
                && let Some(result) = &*result
            {
                return result.clone();
            }
        }
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the lookup of the master stopped with the runtime that ran it",
        )))
    }

    /// A new connection to the master (asking the sentinels first when the
    /// master is suspect or not known yet), probed, and the epoch of the
    /// master it leads to. A connection that cannot be opened makes the
    /// master suspect; the probe finding a read-only replica (the sentinels'
    /// answer is already stale) is an outage, not the mistake it is on a
    /// single node.
    pub(super) async fn open(
        self: &Arc<Self>,
        config: &AsyncConnectionConfig,
        probe: &AclProbe,
    ) -> Result<(Link, u64), RedisError> {
        if self.is_suspect() || self.state.lock().named.is_none() {
            self.look_up().await?;
        }
        let epoch = self.epoch();
        let client = self.state.lock().named.as_ref().map(|(c, _)| c.clone());
        let Some(client) = client else {
            return Err(no_master(&self.name));
        };
        let opened = async {
            let mut link = Link::Multiplexed(
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?,
            );
            probe.run(&mut link).await.map_err(replica_is_outage)?;
            Ok(link)
        }
        .await;
        if opened.as_ref().is_err_and(is_outage) {
            self.suspect();
        }
        opened.map(|link| (link, epoch))
    }
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("name", &self.name)
            .field("address", &self.address())
            .field("epoch", &self.epoch())
            .field("suspect", &self.is_suspect())
            .field("lookups", &self.lookups.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// One lookup, run as a task; dropped unfinished (its runtime shut down),
/// it frees the master for another.
struct Lookup {
    master: Arc<Master>,
    id: u64,
    sender: watch::Sender<Looked>,
}

impl Lookup {
    async fn run(self) {
        let master = &self.master;
        // Whatever fails from now on calls for the next lookup.
        master.suspect.store(false, Ordering::Release);
        let found = tokio::time::timeout(master.timeout, async {
            master.sentinels.lock().await.async_get_client().await
        })
        .await;
        let result = match found {
            Ok(Ok(client)) => {
                master.name_master(client);
                Ok(())
            }
            Ok(Err(e)) if refused_credentials(&e) => Err(e),
            Ok(Err(e)) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!(
                    "the sentinels name no master of {:?} that answers as one: {e}",
                    master.name
                ),
            ))),
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the sentinels did not name the master of {:?} within {:?}",
                    master.name, master.timeout
                ),
            ))),
        };
        if result.is_err() {
            master.suspect();
        }
        let mut state = master.state.lock();
        self.end(&mut state);
        self.sender.send_replace(Some(result));
        drop(state);
    }

    /// Frees the master for the next lookup, unless another took it meanwhile.
    fn end(&self, state: &mut State) {
        if state
            .lookup
            .as_ref()
            .is_some_and(|underway| underway.id == self.id)
        {
            state.lookup = None;
        }
    }
}

impl Drop for Lookup {
    fn drop(&mut self) {
        let mut state = self.master.state.lock();
        if state
            .lookup
            .as_ref()
            .is_some_and(|underway| underway.id == self.id)
        {
            // Unfinished: the next call asks again.
            self.master.suspect();
        }
        self.end(&mut state);
    }
}

/// Whether `e` says credentials were refused: a mistake, not an outage.
fn refused_credentials(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
}

/// The store's probe found a read-only replica where the sentinels named the
/// master: they have not seen a failover yet, or the store asked a sentinel
/// that has not. An outage (`READONLY`) that the next lookup may end.
fn replica_is_outage(e: RedisError) -> RedisError {
    if e.code() == Some("RATELIMIT_REPLICA") {
        RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "the node the sentinels named as master is a read-only replica",
            e.to_string(),
        ))
    } else {
        e
    }
}

fn no_master(name: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!("the sentinels have not named a master of {name:?} yet"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_the_sentinel_port_when_it_gives_none() {
        assert_eq!(sentinel_url("10.0.0.1").unwrap(), "redis://10.0.0.1:26379");
        assert_eq!(
            sentinel_url("10.0.0.1:5000").unwrap(),
            "redis://10.0.0.1:5000"
        );
        assert_eq!(
            sentinel_url("redis://u:p@sentinel-a").unwrap(),
            "redis://u:p@sentinel-a:26379"
        );
        assert_eq!(
            sentinel_url("rediss://sentinel-a:26380").unwrap(),
            "rediss://sentinel-a:26380"
        );
        for bad in ["", "http://x:1", "redis://", ":26379", "a b:1"] {
            assert!(sentinel_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_error_never_shows_a_password() {
        assert_eq!(redacted("redis://user:secret@host:1"), "redis://***@host:1");
        assert_eq!(redacted("host:1"), "host:1");
        let settings = Settings {
            sentinels: vec!["redis://u:secret@a:1".into(), "redis://u:other@b:1".into()],
            master_name: "m".into(),
        };
        let master = MasterOptions::default();
        let urls = settings.urls(&master).unwrap();
        let Err(e) = settings.client(&master, &urls, None) else {
            panic!("two passwords accepted");
        };
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn settings_are_checked_before_anything_connects() {
        let settings = |sentinels: &[&str], name: &str| Settings {
            sentinels: sentinels.iter().map(|s| (*s).to_owned()).collect(),
            master_name: name.to_owned(),
        };
        let default = MasterOptions::default();
        let message = |s: Settings, m: &MasterOptions| s.urls(m).unwrap_err().to_string();
        assert!(message(settings(&[], "m"), &default).contains("at least one sentinel"));
        assert!(message(settings(&["a:1"], " "), &default).contains("master's name"));
        let negative = MasterOptions {
            db: -1,
            ..MasterOptions::default()
        };
        assert!(message(settings(&["a:1"], "m"), &negative).contains("master_db"));
        let db = settings(&["redis://a:1/2"], "m");
        let urls = db.urls(&default).unwrap();
        let Err(e) = db.client(&default, &urls, None) else {
            panic!("a sentinel URL with a database accepted");
        };
        assert!(e.to_string().contains("no database"), "{e}");
    }
}

//! [`Master`]: the master the sentinels name, the lookups that find it, the
//! failovers the sentinels report (see `events`), and the connections opened
//! to the master.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use parking_lot::Mutex;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{DEFAULT_SENTINEL_PORT, config_error};
use crate::StoreError;
use crate::redis::connections::{Link, answer, spawn_here};
use crate::redis::errors::is_outage;
use crate::redis::scripts::AclProbe;

/// The master the sentinels name, and the lookups that find it.
pub(in crate::redis) struct Master {
    /// The name the sentinels monitor it under.
    name: String,
    /// redis-rs's client of each sentinel, which names the master after
    /// checking with `ROLE` that it is one. One lookup at a time asks them
    /// all at once.
    sentinels: Vec<tokio::sync::Mutex<SentinelClient>>,
    /// The longest a lookup may take.
    timeout: Duration,
    /// Which master: changes each time the sentinels name another node.
    epoch: AtomicU64,
    /// How many times the master became suspect (it may have changed), and
    /// the count of those a lookup has answered: the master is suspect
    /// while the first is larger. A lookup answers the suspicions made
    /// before it started only, so a call that comes while one is under way
    /// waits for it, and one that fails meanwhile calls for another.
    suspicions: AtomicU64,
    answered: AtomicU64,
    /// How many lookups were started (their ids).
    lookups: AtomicU64,
    /// Whether a sentinel reported a failover under way (see
    /// [`failover_under_way`](Self::failover_under_way)).
    failing_over: AtomicBool,
    state: Mutex<State>,
    /// The tasks that watch the sentinels' events (see `events`), ended
    /// with the master, and a client of each sentinel to start them again.
    pub(in crate::redis) watchers: Mutex<Watchers>,
    /// Whether the watch ended with the runtime that ran it (or never
    /// started, built without one): the next call starts it again on its
    /// own runtime.
    pub(in crate::redis) unwatched: AtomicBool,
    /// Which start of the watch runs now: a task of an earlier one, ending,
    /// marks nothing.
    pub(in crate::redis) watch_generation: AtomicU64,
}

/// The tasks that watch the sentinels' events, and their clients.
#[derive(Default)]
pub(in crate::redis) struct Watchers {
    pub(in crate::redis) tasks: Vec<tokio::task::AbortHandle>,
    pub(in crate::redis) sentinels: Vec<redis::Client>,
}

#[derive(Default)]
struct State {
    /// The master last named, and its address.
    named: Option<(redis::Client, ConnectionAddr)>,
    /// The lookup under way, if any.
    lookup: Option<Underway>,
    /// Per sentinel (in the order given), the failover it reported under
    /// way, until when at the latest (when its end went unheard).
    failovers: Vec<Option<Instant>>,
    /// The node the sentinels last failed over from, as `(host, port)`,
    /// until when: a lookup that names it then is a sentinel that has not
    /// heard of the failover yet (the old master, still up, answers `ROLE`
    /// as a master until the sentinels demote it, seconds later).
    demoted: Option<((String, u16), Instant)>,
    /// The node that failover promoted, as `(host, port)`.
    promoted: Option<(String, u16)>,
    /// Per sentinel, the master whose failover it last aborted, as
    /// `(host, port)`, and until when a try of it reported is that one.
    aborts: Vec<Option<((String, u16), Instant)>>,
    /// The newest configuration epoch of the master's name that a sentinel
    /// gave with a master the store took (see [`Master::ask`]).
    config_epoch: Option<u64>,
}

/// How long after a failover a lookup naming the old master is taken for a
/// sentinel that has not heard of it yet: sentinels tell one another every
/// 2 s, and demote an old master that is still up within about 10 s.
const DEMOTED_FOR: Duration = Duration::from_secs(15);

/// How often a lookup asks the sentinels again while they settle after a
/// failover.
const SETTLING_RETRY: Duration = Duration::from_millis(50);

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
    /// A master named `name`, looked up through `sentinels` (a client of
    /// each) within `timeout` each time (not yet: the first call, or
    /// [`check`](Self::check), asks).
    pub(in crate::redis) fn new(
        sentinels: Vec<SentinelClient>,
        name: String,
        timeout: Duration,
    ) -> Self {
        Master {
            name,
            sentinels: sentinels.into_iter().map(tokio::sync::Mutex::new).collect(),
            timeout,
            epoch: AtomicU64::new(0),
            suspicions: AtomicU64::new(1),
            answered: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            failing_over: AtomicBool::new(false),
            state: Mutex::default(),
            watchers: Mutex::default(),
            unwatched: AtomicBool::new(false),
            watch_generation: AtomicU64::new(0),
        }
    }

    /// The name the sentinels monitor the master under.
    pub(in crate::redis) fn name(&self) -> &str {
        &self.name
    }

    /// The longest a lookup (or a connection to a sentinel) may take.
    pub(in crate::redis) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// An outage error while a sentinel reports a failover of the master
    /// under way: the master may change any moment, and what it admits after
    /// its replica's promotion would be lost, so nothing is decided until
    /// the failover ends (`+switch-master`, or its abort).
    pub(in crate::redis) fn failover_under_way(&self) -> Result<(), RedisError> {
        if !self.failing_over.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut state = self.state.lock();
        let now = Instant::now();
        for failover in &mut state.failovers {
            if failover.is_some_and(|until| until <= now) {
                *failover = None;
            }
        }
        self.note_failovers(&state);
        if state.failovers.iter().any(Option::is_some) {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!(
                    "a failover of {:?} is under way: nothing is decided until the sentinels \
                     name the new master",
                    self.name
                ),
            )));
        }
        Ok(())
    }

    /// Notes in `failing_over` whether any failover is under way.
    fn note_failovers(&self, state: &State) {
        let any = state.failovers.iter().any(Option::is_some);
        self.failing_over.store(any, Ordering::Release);
    }

    /// Sentinel `index` reports a failover of the master under way
    /// (`in_progress`), or none, for at most `limit` (when its end goes
    /// unheard).
    pub(in crate::redis) fn failover_reported(
        &self,
        index: usize,
        in_progress: bool,
        limit: Duration,
    ) {
        let mut state = self.state.lock();
        if state.failovers.len() <= index {
            state.failovers.resize(index + 1, None);
        }
        state.failovers[index] = in_progress.then(|| Instant::now() + limit);
        self.note_failovers(&state);
    }

    /// Whether `host`:`port` is the master the sentinels just failed over
    /// from: a failover of it that a sentinel tries later (one that lost the
    /// election, until it gives up) cannot change the master any more.
    pub(in crate::redis) fn was_demoted(&self, host: &str, port: u16) -> bool {
        let state = self.state.lock();
        state
            .demoted
            .as_ref()
            .is_some_and(|((old_host, old_port), until)| {
                old_host == host && *old_port == port && Instant::now() < *until
            })
    }

    /// Sentinel `index` aborted a failover of `master` (`host`, `port`):
    /// for `window` (its failover timeout) a try of it reported may be the
    /// aborted one, delivered late (or one ordered with `SENTINEL
    /// FAILOVER`, which starts at once: the sentinel tells which).
    pub(in crate::redis) fn aborted(&self, index: usize, master: (String, u16), window: Duration) {
        let mut state = self.state.lock();
        if state.aborts.len() <= index {
            state.aborts.resize(index + 1, None);
        }
        state.aborts[index] = Some((master, Instant::now() + window));
    }

    /// Whether sentinel `index` aborted a failover of `host`:`port` so
    /// lately that a try of it reported now may be that aborted one.
    pub(in crate::redis) fn was_aborted(&self, index: usize, host: &str, port: u16) -> bool {
        let state = self.state.lock();
        state.aborts.get(index).is_some_and(|abort| {
            abort
                .as_ref()
                .is_some_and(|((h, p), until)| h == host && *p == port && Instant::now() < *until)
        })
    }

    /// The sentinels failed the master over from `old` to `new` (`host`,
    /// `port`): every failover ends, and the master is to be looked up
    /// again (returns whether it is) unless the store follows `new` already.
    /// Each sentinel reports the same switch when it hears of it: a repeat
    /// changes nothing (a lookup then could meet sentinels that still flag
    /// the new master down, and ending failovers would end one started
    /// since).
    pub(in crate::redis) fn switched(&self, old: (String, u16), new: (String, u16)) -> bool {
        let now = Instant::now();
        let (follows_new, reported) = {
            let state = self.state.lock();
            let follows_new = state.named.as_ref().is_some_and(|(_, addr)| {
                matches!(addr, ConnectionAddr::Tcp(host, port)
                    | ConnectionAddr::TcpTls { host, port, .. } if *host == new.0 && *port == new.1)
            });
            let reported = state.promoted.as_ref() == Some(&new)
                && state
                    .demoted
                    .as_ref()
                    .is_some_and(|(from, until)| *from == old && now < *until);
            (follows_new, reported)
        };
        // A repeat ends nothing: a failover another sentinel started since
        // the switch was first heard is still under way.
        if reported {
            return false;
        }
        // Suspect first: a call that sees the failover over must also see
        // that the master is to be looked up.
        let heard = follows_new;
        if !heard {
            self.suspect();
        }
        let mut state = self.state.lock();
        state.failovers.iter_mut().for_each(|f| *f = None);
        state.demoted = Some((old, now + DEMOTED_FOR));
        state.promoted = Some(new);
        self.note_failovers(&state);
        !heard
    }

    /// The epoch of the master last named (0 before any).
    pub(in crate::redis) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the next call asks the sentinels first.
    pub(in crate::redis) fn is_suspect(&self) -> bool {
        self.suspicions.load(Ordering::Acquire) > self.answered.load(Ordering::Acquire)
    }

    /// The master may have changed: the next call asks the sentinels first.
    pub(in crate::redis) fn suspect(&self) {
        self.suspicions.fetch_add(1, Ordering::AcqRel);
    }

    /// The address of the master last named, as `host:port`.
    pub(in crate::redis) fn address(&self) -> Option<String> {
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

    /// `client`, unless it leads to the node the sentinels just failed over
    /// from (a sentinel that has not heard of the failover yet).
    fn not_demoted(&self, client: redis::Client) -> Result<redis::Client, RedisError> {
        let mut state = self.state.lock();
        let Some(((host, port), until)) = &state.demoted else {
            return Ok(client);
        };
        if Instant::now() >= *until {
            state.demoted = None;
            return Ok(client);
        }
        let stale = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(h, p)
            | ConnectionAddr::TcpTls {
                host: h, port: p, ..
            } => h == host && p == port,
            _ => false,
        };
        if stale {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!(
                    "a sentinel still names {host}:{port}, the master of {:?} before its \
                     failover",
                    self.name
                ),
            )));
        }
        Ok(client)
    }

    /// Asks every sentinel at once (each through redis-rs's
    /// `SentinelClient`: `SENTINEL MASTERS`, then `ROLE` on the master it
    /// names, then `SENTINEL MASTER` for the configuration epoch of its
    /// answer): the first master that answers as one, is not the node just
    /// failed over from, and comes with a configuration epoch no older than
    /// the newest the store has seen (or is the master it follows). A
    /// sentinel that missed a failover (cut off, or down, while it happened)
    /// names the old master under an older epoch until it hears of it, and
    /// the old master, up again, answers `ROLE` as a master until the
    /// sentinels demote it: what it admits is lost, so such an answer is
    /// never taken. A sentinel that hangs delays no lookup. When none names
    /// one, the most telling error: refused credentials first, then one met
    /// on a master a sentinel named, then any.
    async fn ask(&self) -> Result<redis::Client, RedisError> {
        let mut asking: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|sentinel| async move {
                let mut sentinel = sentinel.lock().await;
                let client = sentinel.async_get_client().await?;
                let epoch = self.config_epoch(&mut sentinel, &client).await?;
                Ok::<_, RedisError>((client, epoch))
            })
            .collect();
        let (mut errors, mut stale) = (Vec::new(), Vec::new());
        while let Some(answer) = asking.next().await {
            match answer.and_then(|(client, epoch)| Ok((self.not_demoted(client)?, epoch))) {
                // An older epoch naming the master followed already
                // changes nothing: its sentinels were set up anew.
                Ok((client, epoch)) if self.take_epoch(epoch, false) || self.follows(&client) => {
                    return Ok(client);
                }
                Ok(older) => stale.push(older),
                Err(e) => errors.push(e),
            }
        }
        // Every sentinel answered, all under an older epoch: a set of
        // sentinels set up anew (their epochs start again), not one that
        // missed a failover; their newest answer.
        if errors.is_empty() && stale.len() == self.sentinels.len() {
            let newest = stale.into_iter().max_by_key(|(_, epoch)| *epoch);
            if let Some((client, epoch)) = newest {
                self.take_epoch(epoch, true);
                return Ok(client);
            }
        } else if !stale.is_empty() {
            errors.push(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!(
                    "a sentinel names a master of {:?} under an older configuration than \
                     another named (it missed a failover)",
                    self.name
                ),
            )));
        }
        let rank = |e: &RedisError| {
            if refused_credentials(e) {
                0
            } else if e.kind() != ErrorKind::MasterNameNotFoundBySentinel {
                1
            } else {
                2
            }
        };
        Err(errors
            .into_iter()
            .min_by_key(rank)
            .unwrap_or_else(|| no_master(&self.name)))
    }

    /// The configuration epoch of the master's name on `sentinel`
    /// (`SENTINEL MASTER`), which must still name `client`'s node (else it
    /// changed its answer meanwhile: an outage, asked again).
    async fn config_epoch(
        &self,
        sentinel: &mut SentinelClient,
        client: &redis::Client,
    ) -> Result<u64, RedisError> {
        let mut connection = sentinel
            .async_get_sentinel_client()
            .await?
            .get_multiplexed_async_connection()
            .await?;
        let view: HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.name)
            .query_async(&mut connection)
            .await?;
        let named = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                view.get("ip") == Some(host)
                    && view.get("port").and_then(|p| p.parse::<u16>().ok()) == Some(*port)
            }
            _ => false,
        };
        if !named {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!(
                    "a sentinel changed the master of {:?} while asked",
                    self.name
                ),
            )));
        }
        view.get("config-epoch")
            .and_then(|epoch| epoch.parse().ok())
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::Parse,
                    "a sentinel's SENTINEL MASTER gave no config-epoch",
                ))
            })
    }

    /// Whether `client` leads to the master the store follows now.
    fn follows(&self, client: &redis::Client) -> bool {
        let state = self.state.lock();
        state
            .named
            .as_ref()
            .is_some_and(|(_, addr)| addr == client.get_connection_info().addr())
    }

    /// Whether a master named under configuration `epoch` may be taken: no
    /// older than the newest seen (then noted), or any with `anew`.
    fn take_epoch(&self, epoch: u64, anew: bool) -> bool {
        let mut state = self.state.lock();
        if anew || state.config_epoch.is_none_or(|newest| epoch >= newest) {
            state.config_epoch = Some(epoch);
            return true;
        }
        false
    }

    /// [`ask`](Self::ask), again every [`SETTLING_RETRY`] while the
    /// sentinels name no usable master just after a failover (for a moment
    /// after `+switch-master` they list the new master as not yet connected,
    /// or still name the old one): a call then decides as soon as they
    /// settle, within the lookup's timeout, instead of failing and leaving
    /// light traffic undecided until its next call.
    async fn ask_while_settling(&self) -> Result<redis::Client, RedisError> {
        loop {
            match self.ask().await {
                Err(e)
                    if !refused_credentials(&e) && !is_mistake(&e) && self.recently_switched() =>
                {
                    tokio::time::sleep(SETTLING_RETRY).await;
                }
                answer => return answer,
            }
        }
    }

    /// Whether the sentinels failed the master over a moment ago (within
    /// [`DEMOTED_FOR`]).
    fn recently_switched(&self) -> bool {
        self.state
            .lock()
            .demoted
            .as_ref()
            .is_some_and(|(_, until)| Instant::now() < *until)
    }

    /// Whether a sentinel that answers monitors the master's name, asked of
    /// every sentinel at once: `Ok(true)` as soon as one names its address,
    /// `Ok(false)` when those that answer all know no such name, the most
    /// telling error when none answers.
    async fn knows_the_name(&self) -> Result<bool, RedisError> {
        let mut asking: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|sentinel| async move {
                let sentinel = sentinel.lock().await.async_get_sentinel_client().await?;
                let mut connection = sentinel.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.name)
                    .query_async::<Option<(String, u16)>>(&mut connection)
                    .await
            })
            .collect();
        let (mut unknown, mut errors) = (false, Vec::new());
        while let Some(answer) = asking.next().await {
            match answer {
                Ok(Some(_)) => return Ok(true),
                Ok(None) => unknown = true,
                Err(e) => errors.push(e),
            }
        }
        if unknown {
            return Ok(false);
        }
        errors
            .into_iter()
            .min_by_key(|e| u8::from(!refused_credentials(e)))
            .map_or(Ok(false), Err)
    }

    /// What `build()` checks: that the sentinels answer and name a master.
    /// `Ok(Some(client))`: the master they name, which answers as one;
    /// `Ok(None)`: they know the name, but its master does not answer now
    /// (an outage, as a single node that is down when the store is built);
    /// an error when no sentinel answers, none monitors the name, or the
    /// sentinels or the master refuse the credentials.
    pub(in crate::redis) async fn check(&self) -> Result<Option<redis::Client>, StoreError> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let suspicions = self.suspicions.load(Ordering::Acquire);
        let found = tokio::time::timeout(self.timeout, self.ask()).await;
        let error = match found {
            Ok(Ok(client)) => {
                self.name_master(client.clone());
                self.answered.fetch_max(suspicions, Ordering::AcqRel);
                return Ok(Some(client));
            }
            Ok(Err(e)) if e.code() == Some("NOPERM") => {
                return Err(config_error(format!(
                    "a Redis user lacks a permission ({e}): behind Sentinel, the master's \
                     user (master_credentials()) needs +role or +info besides the store's \
                     own commands (SECURITY.md)"
                )));
            }
            Ok(Err(e)) if refused_credentials(&e) => {
                return Err(config_error(format!(
                    "Redis refused the credentials ({e}): a sentinel's come from its URL, \
                     the master's from master_credentials()"
                )));
            }
            Ok(Err(e)) if is_mistake(&e) => {
                return Err(config_error(format!(
                    "the master the sentinels name cannot be used: {e}"
                )));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        // Why no master: whether the sentinels know the name.
        match tokio::time::timeout(self.timeout, self.knows_the_name()).await {
            Ok(Ok(true)) => Ok(None),
            Ok(Ok(false)) => Err(config_error(format!(
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
    pub(in crate::redis) async fn look_up(self: &Arc<Self>) -> Result<(), RedisError> {
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
                spawn_here(task.run())?;
            }
            if let Some(result) = answer(&mut looked).await {
                return result;
            }
        }
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the lookup of the master stopped with the runtime that ran it",
        )))
    }

    /// A new connection to the master (asking the sentinels first when the
    /// master is suspect or not known yet), probed, and the epoch of the
    /// master it leads to (the opening makes the master suspect when it
    /// fails). The probe finding a read-only replica (the sentinels' answer
    /// is already stale) is an outage, not the mistake it is on a single
    /// node.
    pub(in crate::redis) async fn open(
        self: &Arc<Self>,
        config: &AsyncConnectionConfig,
        probe: &AclProbe,
    ) -> Result<(Link, u64), RedisError> {
        if self.is_suspect() || self.state.lock().named.is_none() {
            self.look_up().await?;
        }
        // Read together: a lookup notes its client and bumps the epoch
        // under this lock.
        let (client, epoch) = {
            let state = self.state.lock();
            let client = state.named.as_ref().map(|(client, _)| client.clone());
            (client, self.epoch())
        };
        let Some(client) = client else {
            return Err(no_master(&self.name));
        };
        let mut link = Link::new(
            client
                .get_multiplexed_async_connection_with_config(config)
                .await?,
        );
        probe.run(&mut link).await.map_err(replica_is_outage)?;
        Ok((link, epoch))
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        for watcher in self.watchers.get_mut().tasks.drain(..) {
            watcher.abort();
        }
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
        // What becomes suspect from now on calls for the next lookup.
        let suspicions = master.suspicions.load(Ordering::Acquire);
        let found = tokio::time::timeout(master.timeout, master.ask_while_settling()).await;
        let result = match found {
            Ok(Ok(client)) => {
                master.name_master(client);
                Ok(())
            }
            Ok(Err(e)) if refused_credentials(&e) || is_mistake(&e) => Err(e),
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
        if result.is_ok() {
            master.answered.fetch_max(suspicions, Ordering::AcqRel);
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
        // Unfinished, it answered nothing: the next call asks again.
        self.end(&mut state);
    }
}

/// Whether a lookup's `e` is a mistake that no wait mends (a TLS
/// certificate refused, say), not an outage: no master found, a sentinel
/// or a master unreachable, or an address that is no sentinel (which the
/// store reports as no sentinel answering) are not.
fn is_mistake(e: &RedisError) -> bool {
    !is_outage(e)
        && !matches!(
            e.kind(),
            ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::InvalidClientConfig
        )
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

//! Coalescing: the decisions that arrive while calls are in flight go to
//! Redis together, as one call of the batch function (`batch.lua`), or on
//! a Redis Cluster as one pipeline per master.
//!
//! Every decision belongs to a lane ([`LaneId`]): a single node has one
//! lane; a Redis Cluster one per master. A call declares every key it
//! touches and Redis refuses the keys of several slots in one call
//! (`CROSSSLOT`), whatever flags the function carries, so a cluster's batch
//! is a pipeline of calls, one per slot, sent on the master's own
//! connection (see `masters`).
//! On a single node, while the lane has fewer calls in flight than its bound
//! ([`MAX_CALLS_IN_FLIGHT`], or the pool size if smaller) and nothing waits,
//! a decision goes out at once, alone, sent by its caller as it would be
//! without coalescing ([`Alone`]): there is no timer and no added wait. (On
//! a cluster it goes at once too, as a pipeline of one, from a task.) Once
//! that many calls are in flight, the decisions that arrive
//! wait, and each call that returns takes, in their order of arrival, up to
//! `max_batch` units of them ([`weight`]) as its next call. When more units
//! wait than the calls in flight would take in one turn, one more call
//! starts: no decision waits behind more than one batch.
//!
//! Batches run in tasks of their own ([`Driver`]), so a caller that goes
//! away never strands the others (a caller sending alone that goes away
//! hands what queued behind it to a task), and a task dropped with its
//! runtime counts itself out of its lane. A caller that goes away before
//! its batch is sent is left out of it; after, its result is dropped, and a
//! concurrency permit it received is released (its [`Unclaimed`] guard
//! travels with its result).
//!
//! On a cluster, a call of a pipeline that Redis does not run (`MOVED`,
//! `ASK`, `TRYAGAIN`, `CLUSTERDOWN`: the slot moved, is moving, or has no
//! master now) is never followed as a whole: each of its requests goes
//! again on its own, through redis-rs's routing, to its slot's owner.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use redis::{RedisError, Value};
use smallvec::{SmallVec, smallvec};
use tokio::sync::oneshot;

use super::unclaimed::{SentOn, Unclaimed, Via};
use super::{Arg, RedisStore, StateKeys, check_fields, decision_of, parameters};
use crate::policy::Algorithm;
use crate::{Decision, PermitId, Policy, StoreError};

/// The default bound on the decisions of one batch.
pub(crate) const DEFAULT_MAX_BATCH: usize = 64;

/// The calls a lane keeps in flight before the requests that arrive wait
/// for a batch: two, so that Redis runs one batch while the client answers
/// the other and gathers the next. More calls make smaller batches, and
/// Redis and the client then spend more per decision, since each call costs
/// system calls and wake-ups whatever it carries; one call alone leaves
/// Redis idle while the client works. One more call still starts when more
/// waits than those in flight take on their next turn (see
/// [`RedisStore::submit`]).
pub(super) const MAX_CALLS_IN_FLIGHT: usize = 2;

/// The same bound for a lane of a cluster's master: one pipeline. Each
/// master of a cluster gets only its share of the requests in flight, and a
/// second pipeline would halve what each one carries, while most of a round
/// trip's cost is its system calls and wake-ups, on both sides, whatever it
/// carries: one pipeline per master costs the nodes and the client less CPU
/// per decision (BENCHMARKS.md).
#[cfg(feature = "redis-cluster")]
const MAX_PIPELINES_PER_MASTER: usize = 1;

/// The most times a lane yields, after a batch, for the callers it answered
/// to queue their next requests ([`RedisStore::gather`]): a few are enough
/// for full batches; more stop early anyway, once the queue stops growing.
const GATHER_YIELDS: usize = 4;

/// One request: its checks (one, or the limits of a multi-limit check, all in
/// one slot) and where its answer goes.
pub(super) struct Item {
    pub(super) keys: SmallVec<[String; 1]>,
    /// Its keys' hash slot on a cluster (0 on a single node): found once,
    /// for its master's lane, then its call in that master's pipeline.
    /// Read only by a cluster's pipelines.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(super) slot: u16,
    pub(super) requests: SmallVec<[(Policy, u64, PermitId); 1]>,
    /// Boxed: present for semaphore checks only, and the item moves several
    /// times on its way (unboxed, every item would be nearly twice as large).
    pub(super) unclaimed: Option<Box<Unclaimed>>,
    pub(super) reply: oneshot::Sender<Answer>,
    /// The summed [`weight`] of its checks.
    pub(super) weight: usize,
}

/// A request's decisions, with its permits' guard (claimed by the caller
/// once it has them, released if the answer is dropped).
pub(super) type Answer = (Result<Decided, StoreError>, Option<Box<Unclaimed>>);

/// A request's decisions, one per check: held inline for a request of one
/// check (most), which then takes no allocation of its own (the request's
/// keys and checks likewise, in [`Item`]).
pub(super) type Decided = SmallVec<[Decision; 1]>;

/// Which requests may share a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum LaneId {
    /// Every request of a single node.
    Node,
    /// The requests of one master of a cluster (an index of `masters`),
    /// whatever their slots: each batch is one pipeline, a call per slot.
    #[cfg(feature = "redis-cluster")]
    Master(u16),
}

#[derive(Default)]
struct Lane {
    queue: VecDeque<Item>,
    /// The summed weight of the queue's requests.
    queued: usize,
    in_flight: usize,
}

/// What one check costs Redis, in units of a one-string decision (fixed
/// window, sliding window counter, token bucket, GCRA, leaky bucket: a few
/// µs each in a batch). A batch holds at most `max_batch` units, or one
/// request whatever its weight, so it never holds Redis much longer than
/// `max_batch` simple decisions or one costly one.
///
/// A concurrency check reads its string of every permit held, up to its
/// `max` (each permit a small fraction of a simple decision's work): one
/// unit per permit is far more than it costs, and keeps a large semaphore
/// alone in its call. A sliding-log
/// check reads and writes its whole log, one string of up to 2,048 entries
/// of 14 bytes, and searches it in Lua: 8 units.
pub(super) fn weight(policy: &Policy) -> usize {
    match policy.algorithm() {
        Algorithm::Concurrency(a) => usize::try_from(a.max())
            .unwrap_or(usize::MAX)
            .saturating_add(1),
        Algorithm::SlidingWindowLog(_) => 8,
        _ => 1,
    }
}

/// The lanes of a store, with their bounds.
pub(super) struct Coalescer {
    max_batch: usize,
    max_in_flight: usize,
    /// Hashed with foldhash: each request looks its lane up twice, and
    /// SipHash made that cost more than the rest of the lane's bookkeeping.
    lanes: Mutex<HashMap<LaneId, Lane, foldhash::fast::RandomState>>,
    calls: AtomicU64,
    requests: AtomicU64,
}

/// What a store's coalescing did so far ([`RedisStore::coalescing`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalescingStats {
    /// Calls sent by the coalescer (a batch of one request included).
    pub calls: u64,
    /// Requests those calls decided (a multi-limit check counts once).
    pub requests: u64,
}

impl CoalescingStats {
    /// The mean number of requests per call (0 before the first call).
    pub fn mean_batch(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.requests as f64 / self.calls as f64
        }
    }
}

impl Coalescer {
    /// Batches of at most `max_batch` units, at most `pool_size` calls per
    /// lane (and [`MAX_CALLS_IN_FLIGHT`]) before requests wait (each at
    /// least 1).
    pub(super) fn new(max_batch: usize, pool_size: usize) -> Self {
        Coalescer {
            max_batch: max_batch.max(1),
            max_in_flight: pool_size.clamp(1, MAX_CALLS_IN_FLIGHT),
            lanes: Mutex::new(HashMap::default()),
            calls: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// How many calls `lane` keeps in flight before requests wait.
    fn bound(&self, lane: LaneId) -> usize {
        match lane {
            LaneId::Node => self.max_in_flight,
            #[cfg(feature = "redis-cluster")]
            LaneId::Master(_) => MAX_PIPELINES_PER_MASTER,
        }
    }

    /// The calls and requests so far.
    pub(super) fn stats(&self) -> CoalescingStats {
        CoalescingStats {
            calls: self.calls.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }

    /// The first requests of `lane` whose callers still wait, up to
    /// `max_batch` units of [`weight`] (at least one request).
    fn take(&self, lane: &mut Lane) -> Vec<Item> {
        let mut batch = Vec::new();
        let mut room = self.max_batch;
        while room > 0 {
            let Some(front) = lane.queue.front() else {
                break;
            };
            if !batch.is_empty() && front.weight > room && !front.reply.is_closed() {
                break;
            }
            let Some(mut item) = lane.queue.pop_front() else {
                break;
            };
            lane.queued = lane.queued.saturating_sub(item.weight);
            if item.reply.is_closed() {
                // Never sent: nothing to release.
                if let Some(unclaimed) = item.unclaimed.as_mut() {
                    unclaimed.claim();
                }
                continue;
            }
            room = room.saturating_sub(item.weight);
            batch.push(item);
        }
        batch
    }
}

/// The calls of one lane in a task of their own, counted in flight until
/// the task ends, however it ends. Dropped before it finished (its runtime
/// shut down, or it panicked), it counts itself out and puts the requests
/// it had taken but not sent back at the front of the lane's queue, where
/// the lane's next call takes them. When no call is left in flight on the
/// lane, nothing would send what waits there until a new request came (its
/// callers would time out, though Redis is up): those requests are dropped
/// instead, and each caller, seeing its answer's channel closed, sends its
/// request again on its own. It never spawns from its drop: the runtime it
/// would spawn on may be the one going away.
pub(super) struct Driver {
    store: RedisStore,
    lane: LaneId,
    /// Taken from the queue, not yet sent.
    batch: Vec<Item>,
    /// Ended normally, counted out already.
    finished: bool,
}

impl Driver {
    fn new(store: RedisStore, lane: LaneId, batch: Vec<Item>) -> Self {
        Driver {
            store,
            lane,
            batch,
            finished: false,
        }
    }

    /// Runs the driver in a task on the current runtime. Spawned with no
    /// lock held: a runtime shutting down drops the task at once, and its
    /// drop takes the lanes' lock.
    fn start(self) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let store = self.store.clone();
                runtime.spawn(store.drive(self));
            }
            // Dropped: its requests go back to the lane, or to their callers (see
            // its `Drop`).
            Err(_) => drop(self),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Some(coalescer) = self.store.inner.coalescer.as_ref() else {
            return;
        };
        let orphans: Vec<Item> = {
            let mut lanes = coalescer.lanes.lock();
            let state = lanes.entry(self.lane).or_default();
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight > 0 {
                for item in self.batch.drain(..).rev() {
                    state.queued = state.queued.saturating_add(item.weight);
                    state.queue.push_front(item);
                }
                return;
            }
            let waiting = lanes.remove(&self.lane).map(|lane| lane.queue);
            self.batch
                .drain(..)
                .chain(waiting.into_iter().flatten())
                .collect()
        };
        // Dropped after the lock: never sent, so they hold no permit.
        for mut item in orphans {
            if let Some(unclaimed) = item.unclaimed.as_mut() {
                unclaimed.claim();
            }
        }
    }
}

/// A call its caller sends itself, the lane being idle: counted in flight
/// until dropped (sent, or its caller gone); then whatever queued meanwhile
/// goes in a task.
pub(super) struct Alone {
    store: RedisStore,
    lane: LaneId,
}

impl Drop for Alone {
    fn drop(&mut self) {
        self.store.finish_alone(self.lane);
    }
}

impl RedisStore {
    /// When `lane` has room and nothing waits: the caller sends its request
    /// itself, at once, as it would without coalescing (no task, no channel).
    pub(super) fn go_alone(&self, coalescer: &Coalescer, lane: LaneId) -> Option<Alone> {
        let mut lanes = coalescer.lanes.lock();
        let state = lanes.entry(lane).or_default();
        if state.in_flight >= coalescer.bound(lane) || !state.queue.is_empty() {
            return None;
        }
        state.in_flight += 1;
        coalescer.calls.fetch_add(1, Ordering::Relaxed);
        coalescer.requests.fetch_add(1, Ordering::Relaxed);
        Some(Alone {
            store: self.clone(),
            lane,
        })
    }

    /// The end of a call sent alone: what queued behind it goes now.
    fn finish_alone(&self, lane: LaneId) {
        if let Some(batch) = self.next_batch(lane) {
            // Still counted in flight: the driver's now.
            Driver::new(self.clone(), lane, batch).start();
        }
    }

    /// What a call on `lane` that has ended sends next, keeping its place
    /// in flight; none when nothing waits, and then its place is given up
    /// (and the lane dropped once idle).
    fn next_batch(&self, lane: LaneId) -> Option<Vec<Item>> {
        let coalescer = self.inner.coalescer.as_ref()?;
        let mut lanes = coalescer.lanes.lock();
        let state = lanes.get_mut(&lane)?;
        let batch = coalescer.take(state);
        if batch.is_empty() {
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 && state.queue.is_empty() {
                lanes.remove(&lane);
            }
            return None;
        }
        Some(batch)
    }

    /// Queues `item` on `lane`, and starts a call for it (and whatever
    /// waits) if the lane's bound allows. Needs a tokio runtime.
    pub(super) fn submit(&self, coalescer: &Coalescer, lane: LaneId, item: Item) {
        if tokio::runtime::Handle::try_current().is_err() {
            let error = StoreError::Backend("RedisStore needs a tokio runtime".into());
            let _ = item.reply.send((Err(error), item.unclaimed));
            return;
        }
        let driver = {
            let mut lanes = coalescer.lanes.lock();
            let state = lanes.entry(lane).or_default();
            state.queued = state.queued.saturating_add(item.weight);
            state.queue.push_back(item);
            // More waiting than the calls in flight take on their next turn:
            // one more call, so that no request waits behind two batches.
            let start = state.in_flight < coalescer.bound(lane)
                || state.queued > coalescer.max_batch.saturating_mul(state.in_flight);
            if !start {
                return;
            }
            state.in_flight += 1;
            Driver::new(self.clone(), lane, coalescer.take(state))
        };
        driver.start();
    }

    /// Starts a call for what waits on `lane` if nothing would send it: the
    /// lane has room for a call and requests queued. A waiting caller that
    /// has had no answer for a call timeout asks this as it gives up, so
    /// that requests
    /// queued behind a call that was lost (its task dropped with the runtime
    /// that ran it) go out without waiting for another request to come.
    pub(super) fn kick(&self, lane: LaneId) {
        let Some(coalescer) = self.inner.coalescer.as_ref() else {
            return;
        };
        let driver = {
            let mut lanes = coalescer.lanes.lock();
            let Some(state) = lanes.get_mut(&lane) else {
                return;
            };
            if state.in_flight >= coalescer.bound(lane) || state.queue.is_empty() {
                return;
            }
            state.in_flight += 1;
            Driver::new(self.clone(), lane, coalescer.take(state))
        };
        driver.start();
    }

    /// Sends the driver's batch, then whatever waits on its lane, until
    /// nothing does.
    async fn drive(self, mut driver: Driver) {
        loop {
            let batch = std::mem::take(&mut driver.batch);
            if !batch.is_empty() {
                let answered = batch.len();
                self.send_batch(driver.lane, batch).await;
                if answered > 1 {
                    self.gather(driver.lane).await;
                }
            }
            let Some(batch) = self.next_batch(driver.lane) else {
                driver.finished = true;
                return;
            };
            driver.batch = batch;
        }
    }

    /// Lets the callers a batch's answers woke make their next requests
    /// before the lane takes its next batch: yields to the runtime while
    /// the lane's queue grows and holds less than a batch, at most
    /// [`GATHER_YIELDS`] times. Without it
    /// the lane would take what had queued before those callers ran, and
    /// they would go out later in a small batch of their own, so fewer
    /// decisions per second. No timer: a yield lets ready tasks run, and
    /// a request that finds its lane idle still goes out at once, alone.
    async fn gather(&self, lane: LaneId) {
        let Some(coalescer) = self.inner.coalescer.as_ref() else {
            return;
        };
        let queued = || {
            coalescer
                .lanes
                .lock()
                .get(&lane)
                .map_or(0, |state| state.queued)
        };
        let mut before = queued();
        for _ in 0..GATHER_YIELDS {
            if before >= coalescer.max_batch {
                // A full batch waits: it goes now.
                return;
            }
            tokio::task::yield_now().await;
            let now = queued();
            if now == before {
                return;
            }
            before = now;
        }
    }

    /// One call for every request of `batch`, and each its answer. A batch
    /// of one request is the call it would be without coalescing. On a
    /// cluster, one pipeline to the lane's master, a call per slot (see
    /// `masters`).
    async fn send_batch(&self, lane: LaneId, mut batch: Vec<Item>) {
        if let Some(coalescer) = self.inner.coalescer.as_ref() {
            coalescer.calls.fetch_add(1, Ordering::Relaxed);
            coalescer
                .requests
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        #[cfg(feature = "redis-cluster")]
        if let (LaneId::Master(master), super::Backend::Cluster(cluster)) =
            (lane, &self.inner.backend)
        {
            // Boxed: the pipeline's state would make every batch's future larger.
            Box::pin(self.send_to_master(cluster, master, batch)).await;
            return;
        }
        #[cfg(not(feature = "redis-cluster"))]
        let _ = lane;
        if batch.len() == 1
            && let Some(item) = batch.pop()
        {
            self.send_alone(item).await;
            return;
        }
        let sent_on = SentOn::default();
        let via = if batch.iter().any(|item| item.unclaimed.is_some()) {
            Via::Record(&sent_on)
        } else {
            Via::Pool
        };
        let args = batch_args(&batch, self.fixed_now());
        // Every state key, written into the command.
        let keys = StateKeys(batch.iter().flat_map(|item| item.keys.iter()));
        let reply = self.inner.decide_batch(&keys, &args, via).await;
        self.deliver(batch, reply, &sent_on);
    }

    /// One request sent as it would be without coalescing, and its answer.
    async fn send_alone(&self, item: Item) {
        let sent_on = SentOn::default();
        let via = item
            .unclaimed
            .as_ref()
            .map_or(Via::Pool, |_| Via::Record(&sent_on));
        let result = if item.keys.len() == 1 {
            let (policy, cost, permit) = &item.requests[0];
            self.clone()
                .check_one(item.keys[0].clone(), policy.clone(), *cost, *permit, via)
                .await
                .map(|d| smallvec![d])
        } else {
            self.check_group(&item.keys, &item.requests, via)
                .await
                .map(|(decisions, _)| SmallVec::from_vec(decisions))
        };
        answer(item, result, &sent_on);
    }

    /// Each request of `batch` its answer from the batch's `reply`.
    fn deliver(&self, batch: Vec<Item>, reply: Result<Value, StoreError>, sent_on: &SentOn) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                // A timeout or a dropped connection: an outage for each.
                for item in batch {
                    answer(item, Err(share(&error)), sent_on);
                }
                return;
            }
        };
        match batch_results(&batch, &reply) {
            Ok(results) => {
                for (item, result) in batch.into_iter().zip(results) {
                    answer(item, result, sent_on);
                }
            }
            Err(wrong) => {
                // A reply that does not decode is a bug, never an outage.
                let error = StoreError::Backend(
                    format!("undecodable reply to a batch of decisions: {wrong}").into(),
                );
                for item in batch {
                    answer(item, Err(share(&error)), sent_on);
                }
            }
        }
    }

    /// Sends each of `items`, undecided, again on its own, in tasks (as
    /// many calls, which the lane does not wait for), through the cluster
    /// client, which follows the cluster's redirections (see `cluster`).
    #[cfg(feature = "redis-cluster")]
    pub(super) fn send_again(&self, items: Vec<Item>) {
        if let Some(coalescer) = self.inner.coalescer.as_ref() {
            coalescer
                .calls
                .fetch_add(items.len() as u64, Ordering::Relaxed);
        }
        let runtime = tokio::runtime::Handle::try_current();
        for item in items {
            match &runtime {
                Ok(runtime) => {
                    let store = self.clone();
                    runtime.spawn(async move { store.send_alone(item).await });
                }
                Err(_) => {
                    let error = StoreError::Backend("RedisStore needs a tokio runtime".into());
                    answer(item, Err(error), &SentOn::default());
                }
            }
        }
    }
}

/// The arguments of one call of `batch.lua` for `batch` (its keys are every
/// state key: [`StateKeys`]): the time, each
/// distinct form of check (algorithm, cost, two parameters) once, then per
/// request the index of its check's form, or `-m` and the indexes of its `m`
/// checks' forms, each concurrency check followed by its permit id.
///
/// Redis parses every argument, a large part of a batched decision's work:
/// a form's index is one argument per check where the form is five.
pub(super) fn batch_args(batch: &[Item], fixed_now: u64) -> Vec<Arg<'static>> {
    let checks: usize = batch.iter().map(|item| item.keys.len()).sum();
    // A batch holds a few distinct forms (one per policy and cost): a list
    // searched in order costs less than hashing each check.
    let mut forms: Vec<(&'static str, u64, u64, u64)> = Vec::new();
    let mut form_args = Vec::new();
    let mut request_args = Vec::with_capacity(checks + batch.len());
    for item in batch {
        if item.requests.len() != 1 {
            request_args.push(Arg::Owned(format!("-{}", item.requests.len())));
        }
        for (policy, cost, permit) in &item.requests {
            let algorithm = policy.algorithm();
            let (p1, p2) = parameters(algorithm);
            let form = (algorithm.kind(), *cost, p1, p2);
            let index = match forms.iter().position(|f| *f == form) {
                Some(i) => i,
                None => {
                    forms.push(form);
                    form_args.extend([
                        Arg::Str(form.0),
                        Arg::Int(form.1),
                        Arg::Int(p1),
                        Arg::Int(p2),
                    ]);
                    forms.len() - 1
                }
            };
            request_args.push(Arg::Int(index as u64 + 1));
            if matches!(algorithm, Algorithm::Concurrency(_)) {
                request_args.push(if permit.0 == 0 {
                    Arg::Int(0)
                } else {
                    Arg::Owned(permit.to_string())
                });
            }
        }
    }
    let mut args = Vec::with_capacity(2 + form_args.len() + request_args.len());
    args.push(Arg::Int(fixed_now));
    args.push(Arg::Int(forms.len() as u64));
    args.extend(form_args);
    args.extend(request_args);
    args
}

/// Each request's decisions (or its error) from the batch's reply
/// (`batch.lua`): one flat array, four integers per check (`{allowed,
/// remaining, reset, wait}`), or one string in place of a failed request's
/// checks, its error message. What is wrong when it does not decode.
/// Inline for one request: most calls of a cluster's pipeline carry one.
pub(super) fn batch_results(
    batch: &[Item],
    reply: &Value,
) -> Result<SmallVec<[Result<Decided, StoreError>; 1]>, String> {
    let Value::Array(values) = reply else {
        return Err(format!("not an array: {reply:?}"));
    };
    let mut values = values.as_slice();
    let mut results = SmallVec::with_capacity(batch.len());
    for (i, item) in batch.iter().enumerate() {
        let message = match values.first() {
            Some(Value::BulkString(message)) => Some(message.as_slice()),
            Some(Value::SimpleString(message)) => Some(message.as_bytes()),
            _ => None,
        };
        if let Some(message) = message {
            results.push(Err(request_error(item, message)));
            values = &values[1..];
            continue;
        }
        let checks = item.requests.len();
        let Some((fields, rest)) = values.split_at_checked(4 * checks) else {
            return Err(format!(
                "{} values left for request {i} of {}, which has {checks} checks",
                values.len(),
                batch.len()
            ));
        };
        values = rest;
        let fields = fields
            .chunks_exact(4)
            .map(check_fields)
            .collect::<Result<SmallVec<[[u64; 4]; 1]>, String>>()
            .map_err(|e| format!("request {i}: {e}"))?;
        // A request of several checks takes all or nothing: when one denies,
        // the others report a peek, which holds no permit.
        let all = fields.iter().all(|f| f[0] == 1);
        let decisions = fields
            .iter()
            .zip(&item.requests)
            .map(
                |(&[allowed, remaining, reset, wait], (policy, cost, permit))| {
                    let limit = parameters(policy.algorithm()).0;
                    let (permit, cost) = if all {
                        (*permit, *cost)
                    } else {
                        (PermitId(0), 0)
                    };
                    decision_of(allowed == 1, limit, remaining, reset, wait, permit, cost)
                },
            )
            .collect();
        results.push(Ok(decisions));
    }
    if !values.is_empty() {
        return Err(format!(
            "{} values more than {} requests take",
            values.len(),
            batch.len()
        ));
    }
    Ok(results)
}

/// The error of one request of a batch (`batch.lua` sends its message): a
/// policy conflict when it names one of the request's state keys (or is
/// Redis's `WRONGTYPE` on a request of one check), as for a call of its own.
fn request_error(item: &Item, message: &[u8]) -> StoreError {
    let message = String::from_utf8_lossy(message);
    let mut words = message.split_whitespace();
    let named = match words.next() {
        Some("RATELIMIT_CONFLICT") => words.next(),
        Some(code) if code.starts_with("WRONGTYPE") && item.keys.len() == 1 => {
            item.keys.first().map(String::as_str)
        }
        _ => None,
    };
    let policy = named.and_then(|named| {
        item.keys
            .iter()
            .position(|k| k == named)
            .map(|i| item.requests[i].0.name().to_owned())
    });
    match policy {
        Some(policy) => StoreError::PolicyConflict { policy },
        None => StoreError::Backend(format!("batch request failed: {message}").into()),
    }
}

/// Sends `item` its answer (the guard records where its check was sent).
/// A caller gone meanwhile drops it, which releases its permits.
pub(super) fn answer(mut item: Item, result: Result<Decided, StoreError>, sent_on: &SentOn) {
    if let Some(unclaimed) = item.unclaimed.as_mut() {
        sent_on.copy_to(unclaimed.sent_on());
    }
    let _ = item.reply.send((result, item.unclaimed));
}

/// A copy of `error` for each request of a batch.
pub(super) fn share(error: &StoreError) -> StoreError {
    let source = |e: &(dyn std::error::Error + Send + Sync + 'static)| -> Box<dyn std::error::Error + Send + Sync> {
        match e.downcast_ref::<RedisError>() {
            Some(e) => Box::new(e.clone()),
            None => e.to_string().into(),
        }
    };
    match error {
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::Unavailable(e) => StoreError::Unavailable(source(e.as_ref())),
        StoreError::Backend(e) => StoreError::Backend(source(e.as_ref())),
        StoreError::PolicyConflict { policy } => StoreError::PolicyConflict {
            policy: policy.clone(),
        },
        other => StoreError::Backend(other.to_string().into()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn item(checks: usize) -> Item {
        let policy = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
        Item {
            keys: smallvec!["k".to_owned(); checks],
            slot: 0,
            requests: smallvec![(policy, 1, PermitId(0)); checks],
            unclaimed: None,
            reply: oneshot::channel().0,
            weight: checks,
        }
    }

    fn ints(values: &[i64]) -> Vec<Value> {
        values.iter().map(|&n| Value::Int(n)).collect()
    }

    fn text(message: &str) -> Value {
        Value::BulkString(message.as_bytes().to_vec())
    }

    #[test]
    fn a_batch_reply_reads_as_each_requests_answer() {
        let batch = [item(1), item(2), item(1), item(1)];
        let mut values = ints(&[1, 9, 1_000_000, 0]);
        values.push(text("ERR no"));
        values.extend(ints(&[0, 0, 1_000_000, 500_000]));
        values.push(text("RATELIMIT_CONFLICT k"));
        let answers = batch_results(&batch, &Value::Array(values)).unwrap();
        let first = answers[0].as_ref().unwrap();
        assert!(first[0].is_allowed() && first[0].remaining() == 9);
        assert!(matches!(answers[1], Err(StoreError::Backend(_))));
        let third = answers[2].as_ref().unwrap();
        assert!(!third[0].is_allowed());
        assert_eq!(third[0].retry_after(), Some(Duration::from_millis(500)));
        assert!(
            matches!(&answers[3], Err(StoreError::PolicyConflict { .. })),
            "{:?}",
            answers[3]
        );
    }

    /// A short, long or garbled reply is an error that says what is wrong,
    /// never a panic and never a decision.
    #[test]
    fn a_garbled_batch_reply_says_what_is_wrong() {
        let batch = [item(1), item(2)];
        let ok = [1, 9, 1_000_000, 0];
        let reply = |values: Vec<Value>| Value::Array(values);
        for (reply, says) in [
            (Value::Int(1), "not an array"),
            (reply(Vec::new()), "0 values left for request 0"),
            (reply(ints(&[1, 9, 1])), "3 values left for request 0"),
            (
                reply(ints(&[ok, ok].concat())),
                "4 values left for request 1 of 2, which has 2 checks",
            ),
            (
                reply(ints(&[ok, ok, ok, ok].concat())),
                "4 values more than 2 requests take",
            ),
            (
                reply(ints(&[ok, ok, [2, 0, 0, 0]].concat())),
                "request 1: allowed is 2",
            ),
            (
                reply(ints(&[ok, ok, [1, -1, 0, 0]].concat())),
                "request 1: int(-1) is not a count",
            ),
            (
                reply(vec![
                    Value::Nil,
                    Value::Int(1),
                    Value::Int(1),
                    Value::Int(1),
                ]),
                "request 0: nil is not a count",
            ),
            (
                reply([ints(&ok), vec![text("ERR x")], vec![text("extra")]].concat()),
                "1 values more than 2 requests take",
            ),
        ] {
            match batch_results(&batch, &reply) {
                Err(e) => assert!(e.contains(says), "{e:?} should say {says:?}"),
                Ok(answers) => panic!("{reply:?} read as {answers:?}"),
            }
        }
    }
}

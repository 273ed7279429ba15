//! The model: regions with their Redis and clocks, instances running
//! rounds of pushes, requests decided with [`counts`](crate::multi_region::counts).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Range;

use crate::Policy;
use crate::multi_region::counts::{self, Count};

pub(super) const WINDOW: u64 = 1_000_000;
/// Reference times start here, so clocks behind the reference stay positive.
pub(super) const BASE: u64 = 20 * WINDOW;

/// A field of a key's hash: a count, or what was heard of a peer's own
/// window (the sender's window start and length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Field {
    Count {
        region: usize,
        start: u64,
        window: u64,
    },
    Seen {
        from: usize,
        start: u64,
        window: u64,
    },
}

/// One admission as its region's Redis saw it: reference time, key, window
/// start, window, the region's count there after it.
type Logged = (u64, u16, u64, u64, u64);

/// A mark's ticket: the receiver's clock when it was taken.
pub(super) type Ticket = u64;

#[derive(Debug, Clone, Default)]
pub(super) struct Heard {
    pub(super) at: u64,
    pub(super) skewed: bool,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Redis {
    pub(super) fields: BTreeMap<(u16, Field), u64>,
    /// (key, window start, window) -> (sequence number, value).
    pub(super) outbox: BTreeMap<(u16, u64, u64), (u64, u64)>,
    /// The outbox by sequence number.
    pub(super) by_seq: BTreeMap<u64, (u16, u64, u64)>,
    pub(super) seq: u64,
    /// Per peer: what was delivered to it.
    pub(super) cursor: Vec<u64>,
    /// Per peer: its freshest mark.
    pub(super) heard: Vec<Option<Heard>>,
}

/// An instance of `region` cut off from `peer`'s Redis `during` those
/// reference times.
#[derive(Debug, Clone)]
pub(super) struct Cut {
    pub(super) region: usize,
    pub(super) instance: usize,
    pub(super) peer: usize,
    pub(super) during: Range<u64>,
}

#[derive(Debug, Clone)]
pub(super) struct Simulation {
    /// The policy, and the one it becomes at a reload (same name).
    pub(super) policy: Policy,
    pub(super) reload: Option<(u64, Policy)>,
    pub(super) regions: usize,
    pub(super) instances: usize,
    pub(super) sync: u64,
    /// The one-way lag of each round, in turn (reordering when they differ).
    pub(super) lags: Vec<u64>,
    pub(super) staleness: u64,
    pub(super) max_skew: u64,
    /// Each region's clock minus the reference, µs.
    pub(super) offsets: Vec<i64>,
    pub(super) cuts: Vec<Cut>,
}

/// One admitted request, at a reference time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Admitted {
    pub(super) at: u64,
    pub(super) region: usize,
    pub(super) key: u16,
    pub(super) cost: u64,
}

/// What happens next in the model, ordered by time then kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Event {
    /// A round's merges and mark land in the peer's Redis.
    Land(Round),
    /// A round's answer reaches its instance.
    Answer(Round),
    /// An instance starts a round to a peer.
    Start {
        region: usize,
        instance: usize,
        peer: usize,
    },
    /// A request (index into the requests).
    Request(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Round {
    pub(super) region: usize,
    pub(super) instance: usize,
    pub(super) peer: usize,
    /// None: only a ticket asked for.
    pub(super) entries: Option<Vec<(u16, u64, u64, u64)>>,
    pub(super) ticket: Ticket,
    /// The sender's clock at its read, and the sequence number read up to.
    pub(super) sender_clock: u64,
    pub(super) end: u64,
    pub(super) failed: bool,
}

impl Simulation {
    /// `regions` regions of `instances` instances each under `policy`, a
    /// round to each peer every `sync` µs taking `lags` in turn: no reload,
    /// clocks that agree, no cut, peers stale after a [`WINDOW`], a skew of
    /// 50 ms allowed.
    pub(super) fn new(
        policy: Policy,
        regions: usize,
        instances: usize,
        sync: u64,
        lags: Vec<u64>,
    ) -> Simulation {
        Simulation {
            policy,
            reload: None,
            regions,
            instances,
            sync,
            lags,
            staleness: WINDOW,
            max_skew: 50_000,
            offsets: vec![0; regions],
            cuts: Vec::new(),
        }
    }

    pub(super) fn clock(&self, region: usize, at: u64) -> u64 {
        u64::try_from(i64::try_from(at).unwrap_or(i64::MAX) + self.offsets[region]).unwrap_or(0)
    }

    pub(super) fn policy_at(&self, at: u64) -> &Policy {
        match &self.reload {
            Some((when, policy)) if at >= *when => policy,
            _ => &self.policy,
        }
    }

    fn cut(&self, region: usize, instance: usize, peer: usize, at: u64) -> bool {
        self.cuts.iter().any(|c| {
            c.region == region && c.instance == instance && c.peer == peer && c.during.contains(&at)
        })
    }

    fn name(region: usize) -> String {
        format!("r{region}")
    }

    /// The peers `region`'s Redis counts conservatively at its clock `now`:
    /// never marked, marked longer than the staleness ago, or skewed.
    fn conservative(&self, redis: &Redis, region: usize, now: u64) -> Vec<usize> {
        (0..self.regions)
            .filter(|&p| p != region)
            .filter(|&p| {
                redis.heard[p]
                    .as_ref()
                    .is_none_or(|h| now.saturating_sub(h.at) > self.staleness || h.skewed)
            })
            .collect()
    }

    /// Runs `requests` (reference time, region, key, cost), and returns the
    /// admitted ones, and the regions' Redis at the end.
    ///
    /// Panics when a region counts a peer as fresh (its freshest mark within
    /// the staleness) while a count the peer admitted before the staleness
    /// ago, of a window that still matters, has not landed: what a mark
    /// claims must be true.
    pub(super) fn run(&self, requests: &[(u64, usize, u16, u64)]) -> (Vec<Admitted>, Vec<Redis>) {
        let n = self.regions;
        let mut redis: Vec<Redis> = (0..n)
            .map(|_| Redis {
                cursor: vec![0; n],
                heard: vec![None; n],
                ..Redis::default()
            })
            .collect();
        // Per (region, instance, peer): its ticket, and whether a round is on.
        let mut tickets: BTreeMap<(usize, usize, usize), Ticket> = BTreeMap::new();
        let mut busy: BTreeMap<(usize, usize, usize), bool> = BTreeMap::new();
        let end = requests.iter().map(|r| r.0).max().unwrap_or(BASE) + 1;
        let mut events: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
        for (i, request) in requests.iter().enumerate() {
            events.push(Reverse((request.0, Event::Request(i))));
        }
        for region in 0..n {
            for instance in 0..self.instances {
                for peer in (0..n).filter(|&p| p != region) {
                    // Instances tick at their own phase.
                    let phase = BASE + (instance as u64 * self.sync) / self.instances as u64;
                    events.push(Reverse((
                        phase,
                        Event::Start {
                            region,
                            instance,
                            peer,
                        },
                    )));
                }
            }
        }
        let mut rounds = 0usize;
        let mut admitted = Vec::new();
        // Per region, what it admitted.
        let mut log: Vec<Vec<Logged>> = vec![Vec::new(); n];
        while let Some(Reverse((now, event))) = events.pop() {
            if now > end {
                break;
            }
            match event {
                Event::Request(i) => {
                    let (_, region, key, cost) = requests[i];
                    let clock = self.clock(region, now);
                    let conservative = self.conservative(&redis[region], region, clock);
                    for peer in (0..n).filter(|p| *p != region && !conservative.contains(p)) {
                        for &(at, key, start, w, value) in &log[peer] {
                            let matters = start + 2 * w + self.max_skew > clock;
                            if at + self.staleness < now && matters {
                                let seen = redis[region]
                                    .fields
                                    .get(&(
                                        key,
                                        Field::Seen {
                                            from: peer,
                                            start,
                                            window: w,
                                        },
                                    ))
                                    .copied()
                                    .unwrap_or(0);
                                assert!(
                                    seen >= value,
                                    "r{region} counts r{peer} fresh at {now}, but its count {value} of key {key} admitted at {at} has not landed ({seen})"
                                );
                            }
                        }
                    }
                    if let Some((start, w, value)) =
                        self.decide(&mut redis[region], region, now, key, cost)
                    {
                        log[region].push((now, key, start, w, value));
                        admitted.push(Admitted {
                            at: now,
                            region,
                            key,
                            cost,
                        });
                    }
                }
                Event::Start {
                    region,
                    instance,
                    peer,
                } => {
                    events.push(Reverse((
                        now + self.sync,
                        Event::Start {
                            region,
                            instance,
                            peer,
                        },
                    )));
                    let id = (region, instance, peer);
                    if busy.get(&id).copied().unwrap_or(false) {
                        continue;
                    }
                    busy.insert(id, true);
                    let lag = self.lags[rounds % self.lags.len()];
                    rounds += 1;
                    let failed = self.cut(region, instance, peer, now)
                        || self.cut(region, instance, peer, now + lag);
                    let (entries, ticket) = match tickets.get(&id) {
                        None => (None, 0),
                        Some(&ticket) => {
                            let sender = &redis[region];
                            let clock = self.clock(region, now);
                            let entries = sender
                                .by_seq
                                .range(sender.cursor[peer] + 1..)
                                .map(|(_, entry)| entry)
                                .filter(|&&(_, start, w)| start + 2 * w + self.max_skew > clock)
                                .map(|&entry| {
                                    let (key, start, w) = entry;
                                    (key, start, w, sender.outbox[&entry].1)
                                })
                                .collect();
                            (Some(entries), ticket)
                        }
                    };
                    let round = Round {
                        region,
                        instance,
                        peer,
                        entries,
                        ticket,
                        sender_clock: self.clock(region, now),
                        end: redis[region].seq,
                        failed,
                    };
                    events.push(Reverse((now + lag, Event::Land(round))));
                }
                Event::Land(mut round) => {
                    let lag = self.lags[rounds % self.lags.len()];
                    if !round.failed {
                        let clock = self.clock(round.peer, now);
                        if let Some(entries) = &round.entries {
                            let receiver = &mut redis[round.peer];
                            for &(key, start, w, value) in entries {
                                self.merge(receiver, round.region, clock, key, start, w, value);
                            }
                            let lo = i128::from(round.sender_clock) - i128::from(clock);
                            let hi = i128::from(round.sender_clock) - i128::from(round.ticket);
                            let skew = i128::from(self.max_skew);
                            let heard = receiver.heard[round.region].get_or_insert_default();
                            heard.at = heard.at.max(round.ticket);
                            heard.skewed = lo > skew || hi < -skew;
                        }
                        round.ticket = clock;
                    }
                    events.push(Reverse((now + lag, Event::Answer(round))));
                }
                Event::Answer(round) => {
                    let id = (round.region, round.instance, round.peer);
                    busy.insert(id, false);
                    if round.failed {
                        continue;
                    }
                    tickets.insert(id, round.ticket);
                    if round.entries.is_some() {
                        let cursor = &mut redis[round.region].cursor[round.peer];
                        *cursor = (*cursor).max(round.end);
                    }
                }
            }
        }
        (admitted, redis)
    }

    /// `merge.lua`: what the receiver had not heard of `from`'s window is
    /// added in the window of the receiver's clock.
    #[allow(clippy::too_many_arguments)]
    fn merge(
        &self,
        receiver: &mut Redis,
        from: usize,
        clock: u64,
        key: u16,
        start: u64,
        w: u64,
        value: u64,
    ) {
        if start + 2 * w + self.max_skew <= clock {
            return;
        }
        let seen = receiver
            .fields
            .entry((
                key,
                Field::Seen {
                    from,
                    start,
                    window: w,
                },
            ))
            .or_insert(0);
        if value <= *seen {
            return;
        }
        let delta = value - *seen;
        *seen = value;
        *receiver
            .fields
            .entry((
                key,
                Field::Count {
                    region: from,
                    start: clock - clock % w,
                    window: w,
                },
            ))
            .or_insert(0) += delta;
    }

    /// `decide.lua`: one request in `region`'s Redis; when it passed, the
    /// window it counted in and the region's count there after it (cost 0:
    /// the count as it was).
    fn decide(
        &self,
        redis: &mut Redis,
        region: usize,
        at: u64,
        key: u16,
        cost: u64,
    ) -> Option<(u64, u64, u64)> {
        let now = self.clock(region, at);
        let policy = self.policy_at(at);
        if cost > policy.max_cost() {
            // The store refuses it as an error before deciding.
            return None;
        }
        let w = policy.algorithm().window_micros();
        let names: Vec<String> = (0..self.regions).map(Self::name).collect();
        let conservative: Vec<&str> = self
            .conservative(redis, region, now)
            .into_iter()
            .map(|p| names[p].as_str())
            .collect();
        let counts: Vec<Count> = redis
            .fields
            .range(
                (
                    key,
                    Field::Count {
                        region: 0,
                        start: 0,
                        window: 0,
                    },
                )..,
            )
            .take_while(|((k, _), _)| *k == key)
            .filter_map(|((_, field), &value)| match *field {
                Field::Count {
                    region,
                    start,
                    window,
                } => Some(Count::new(names[region].clone(), start, window, value)),
                Field::Seen { .. } => None,
            })
            .collect();
        let share = counts::conservative_share(policy.limit(), self.regions as u64);
        let (start, global) = counts::view(&names[region], &counts, w, now, &conservative, share);
        let decision = counts::decide(policy, start, now, cost, global).expect("supported");
        if !decision.is_allowed() {
            return None;
        }
        let field = (
            key,
            Field::Count {
                region,
                start,
                window: w,
            },
        );
        if cost > 0 {
            *redis.fields.entry(field).or_insert(0) += cost;
            let value = redis.fields[&field];
            redis.seq += 1;
            if let Some((seq, _)) = redis.outbox.insert((key, start, w), (redis.seq, value)) {
                redis.by_seq.remove(&seq);
            }
            redis.by_seq.insert(redis.seq, (key, start, w));
        }
        Some((start, w, redis.fields.get(&field).copied().unwrap_or(0)))
    }
}

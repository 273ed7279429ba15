//! One round of pushes from this region to one peer.
//!
//! Every admission writes its count to the region's outbox, in the same
//! script (`decide.lua`), so the outbox holds everything the region
//! admitted, whichever instance admitted it and whether or not its reply
//! arrived. A round:
//!
//! 1. reads this region's Redis's run and replication ids (`INFO`), then
//!    the outbox after the peer's cursor (what was delivered to it),
//!    1,024 entries per read, until a read reaches the end; the outbox
//!    starts a new epoch when the ids are not the ones it recorded
//!    (`outbox.lua`), and a round during which they changed fails;
//! 2. pushes them to the peer's Redis, [`PUSH_BATCH`] entries per merge
//!    (`merge.lua`), [`PUSH_PIPELINE`] merges per pipeline, every pipeline
//!    at once and in order on one connection, so a round takes one round
//!    trip, plus its reads and the merges' time in the peer's Redis,
//!    whatever the number of keys;
//! 3. behind the last merge, *marks* the peer's Redis (`mark.lua`) with a
//!    ticket, a time of the peer's Redis taken before the last read: every
//!    count admitted before it has landed. The mark checks that every merge
//!    of the round ran before it. Then it moves the cursor.
//!
//! Every instance of a region pushes the region's whole outbox from one
//! shared cursor, so an instance cut off from a peer costs nothing while
//! another one reaches it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Script, Value};

use super::peer::{
    Peer, Ticket, Timing, arrived_key, bad_reply, heard_key, micros, number, outbox_keys,
    rounds_key, script, text,
};
use crate::StoreError;
use crate::clock::Clock;
use crate::redis::backend_error;

/// The most entries one push to a peer carries.
pub(crate) const PUSH_BATCH: usize = 256;

/// The most merges one pipeline to a peer carries (the peer's Redis runs a
/// pipeline's commands one after the other, serving others in between
/// pipelines).
pub(crate) const PUSH_PIPELINE: usize = 8;

/// The most outbox entries one read returns.
const READ_CHUNK: usize = 1024;

/// The most outbox entries one round reads; a longer backlog is delivered
/// over several rounds, marked by the one that reaches its end.
pub(super) const ROUND_ENTRIES: usize = 65_536;

/// What a round needs of its region: its Redis, names, timing and scripts.
pub(super) struct Pusher {
    region: String,
    prefix: String,
    local: ConnectionManager,
    timing: Timing,
    fixed_clock: Option<Arc<dyn Clock>>,
    /// A random id of this instance, and its rounds so far: round ids.
    instance: u64,
    rounds: AtomicU64,
    /// The most outbox entries one round reads ([`ROUND_ENTRIES`] but in
    /// tests of a backlog longer than a round).
    round: usize,
    merge: Arc<Script>,
    mark: Arc<Script>,
    outbox: Script,
    cursor: Script,
}

/// One read of the outbox.
struct Read {
    epoch: String,
    /// The sequence number read after (the cursor, when read from it).
    after: u64,
    last: u64,
    done: bool,
    clock: u64,
    born: String,
    entries: Vec<Entry>,
}

/// What a round's mark claims: every count admitted before `ticket` (a time
/// of the peer's Redis) has landed there, read by a last read when this
/// region's clock read `clock`, on top of what the cursor says was
/// delivered into the generation `relied` (empty: nothing, the round
/// started from the outbox's beginning), up to `cursor` in the outbox's
/// `epoch`; the round delivers up to `last`.
struct Mark<'a> {
    ticket: Ticket,
    clock: u64,
    relied: &'a str,
    cursor: u64,
    epoch: &'a str,
    last: u64,
    /// False when the round read only part of a longer backlog: it claims
    /// no ticket, and only learns the generation its part landed in.
    whole: bool,
}

/// The answer to a mark.
enum Marked {
    /// Marked, in this generation of the peer's Redis.
    Yes(String),
    /// The peer's Redis no longer holds what the cursor says.
    StartOver,
    /// A merge of the round had not run.
    Incomplete,
}

fn parse_mark(reply: &Value) -> Result<(Ticket, Marked), StoreError> {
    let bad = || bad_reply("mark.lua", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let [real, clock, marked, born] = items.as_slice() else {
        return Err(bad());
    };
    let ticket = Ticket {
        real: number(real).ok_or_else(bad)?,
        clock: number(clock).ok_or_else(bad)?,
    };
    let marked = match number(marked).ok_or_else(bad)? {
        1 => Marked::Yes(text(born).ok_or_else(bad)?),
        0 => Marked::StartOver,
        _ => Marked::Incomplete,
    };
    Ok((ticket, marked))
}

/// One entry of the outbox: this region's count of a key in one window.
struct Entry {
    hash: String,
    start: u64,
    window: u64,
    value: u64,
}

/// `<start>:<window>:<hash>`.
fn parse_member(member: &str, value: u64) -> Option<Entry> {
    let (start, rest) = member.split_once(':')?;
    let (window, hash) = rest.split_once(':')?;
    Some(Entry {
        hash: hash.to_owned(),
        start: start.parse().ok()?,
        window: window.parse().ok()?,
        value,
    })
}

impl Pusher {
    pub(super) fn new(
        region: String,
        prefix: String,
        local: ConnectionManager,
        timing: Timing,
        fixed_clock: Option<Arc<dyn Clock>>,
        round: usize,
    ) -> Self {
        Pusher {
            region,
            prefix,
            local,
            timing,
            fixed_clock,
            instance: {
                use std::hash::{BuildHasher, Hasher};
                std::collections::hash_map::RandomState::new()
                    .build_hasher()
                    .finish()
            },
            rounds: AtomicU64::new(0),
            round,
            merge: Arc::new(script(include_str!("lua/merge.lua"))),
            mark: Arc::new(script(include_str!("lua/mark.lua"))),
            outbox: script(include_str!("lua/outbox.lua")),
            cursor: script(include_str!("lua/cursor.lua")),
        }
    }

    fn fixed_now(&self) -> u64 {
        self.fixed_clock.as_ref().map_or(0, |c| c.now())
    }

    /// One round to `peer` (see the module docs).
    pub(super) async fn round(&self, peer: &Peer) -> Result<(), StoreError> {
        let held = *peer.ticket.lock();
        let ticket = match held {
            Some(ticket) => ticket,
            None => self.ask_ticket(peer).await?,
        };
        let run = self.data_ids().await?;
        // Everything after the cursor, read before anything is sent: the
        // last read, after the ticket, is what the mark claims.
        let mut entries = Vec::new();
        let mut after = None;
        let mut first: Option<(String, String, u64)> = None;
        let end = loop {
            let read = self.read(peer, after, &run).await?;
            match &first {
                Some((epoch, _, _)) if *epoch != read.epoch => {
                    return Err(StoreError::Backend(
                        "multi-region: the outbox started a new epoch during a round".into(),
                    ));
                }
                Some(_) => {}
                None => first = Some((read.epoch.clone(), read.born.clone(), read.after)),
            }
            entries.extend(read.entries);
            after = Some(read.last);
            if read.done {
                break Some((read.last, read.clock));
            }
            if entries.len() >= self.round {
                break None;
            }
        };
        // A restart while the outbox was read (from a snapshot that
        // recorded the run read before) could leave the old epoch standing
        // for other counts: the next round starts a new one.
        if self.data_ids().await? != run {
            return Err(StoreError::Backend(
                "multi-region: this region's Redis restarted during a round".into(),
            ));
        }
        let (epoch, relied, cursor) = first.unwrap_or_default();
        // A backlog longer than one round is delivered in part and claims
        // nothing (the peer counts this region at its share once the
        // staleness passes without a mark); the next round goes on from
        // where this one stopped.
        let (last, clock, whole) = match end {
            Some((last, clock)) => (last, clock, true),
            None => (after.unwrap_or(0), 0, false),
        };
        let mark = Mark {
            ticket,
            clock,
            relied: &relied,
            cursor,
            epoch: &epoch,
            last,
            whole,
        };
        match self.send(peer, &epoch, &entries, mark).await? {
            Marked::Yes(born) => self.move_cursor(peer, Some(last), &epoch, &born).await,
            // The peer's Redis no longer holds what the cursor says: the
            // next round pushes the whole outbox.
            Marked::StartOver => self.move_cursor(peer, None, &epoch, &relied).await,
            Marked::Incomplete => Err(StoreError::Backend(
                "multi-region: a merge of the round had not run when it was marked".into(),
            )),
        }
    }

    /// Sends `entries` to the peer, [`PUSH_BATCH`] per merge and
    /// [`PUSH_PIPELINE`] merges per pipeline, then `mark` at the end of the
    /// last pipeline. The pipelines go out at once, in order, on one
    /// connection, so the peer's Redis runs every merge before the mark
    /// (which checks it did) and a round takes one round trip whatever its
    /// size, plus the time the peer's Redis takes to run it.
    async fn send(
        &self,
        peer: &Peer,
        epoch: &str,
        entries: &[Entry],
        mark: Mark<'_>,
    ) -> Result<Marked, StoreError> {
        let round = self.next_round();
        let batches: Vec<&[Entry]> = entries.chunks(PUSH_BATCH).collect();
        let mut pipes: Vec<redis::Pipeline> = batches
            .chunks(PUSH_PIPELINE)
            .map(|group| {
                let mut pipe = redis::pipe();
                for batch in group {
                    pipe.add_command(self.merge_command(peer, epoch, &round, batch));
                }
                pipe
            })
            .collect();
        if pipes.is_empty() {
            pipes.push(redis::pipe());
        }
        if let Some(last) = pipes.last_mut() {
            last.add_command(self.mark_command(peer, Some(&mark), &round, batches.len()));
        }
        let sends = pipes
            .into_iter()
            .map(|pipe| Box::pin(self.send_pipeline(peer, pipe)) as Pending)
            .collect();
        let mut replies = Vec::new();
        for reply in in_order(sends).await {
            replies = reply?;
        }
        let reply = replies
            .last()
            .ok_or_else(|| StoreError::Backend("multi-region: no reply to the mark".into()))?;
        let (next, marked) = parse_mark(reply)?;
        *peer.ticket.lock() = Some(next);
        Ok(marked)
    }

    /// Sends one pipeline to the peer (loading the scripts first if its
    /// Redis lost them, then sending it once more: merges are idempotent,
    /// and a mark whose round's merges did not all run marks nothing).
    fn send_pipeline(
        &self,
        peer: &Peer,
        pipe: redis::Pipeline,
    ) -> impl Future<Output = Result<Vec<Value>, StoreError>> + Send + 'static {
        let mut connection = peer.connection.clone();
        let timeout = self.timing.push_timeout;
        let (merge, mark) = (Arc::clone(&self.merge), Arc::clone(&self.mark));
        async move {
            let send = async {
                match pipe.query_async::<Vec<Value>>(&mut connection).await {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        merge.prepare_invoke().load_async(&mut connection).await?;
                        mark.prepare_invoke().load_async(&mut connection).await?;
                        pipe.query_async::<Vec<Value>>(&mut connection).await
                    }
                    other => other,
                }
            };
            tokio::time::timeout(timeout, send)
                .await
                .map_err(|_| StoreError::Timeout(timeout))?
                .map_err(backend_error)
        }
    }

    /// A fresh id for one round of this instance.
    fn next_round(&self) -> String {
        let n = self.rounds.fetch_add(1, Ordering::Relaxed);
        format!("{:x}-{n}", self.instance)
    }

    /// `EVALSHA merge.lua` of one batch.
    fn merge_command(&self, peer: &Peer, epoch: &str, round: &str, batch: &[Entry]) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.merge.get_hash())
            .arg(batch.len() + 2)
            .arg(arrived_key(&self.prefix, &self.region))
            .arg(rounds_key(&self.prefix, &self.region));
        for entry in batch {
            cmd.arg(&entry.hash);
        }
        cmd.arg(&self.region)
            .arg(epoch)
            .arg(peer.clock_arg())
            .arg(micros(self.timing.max_skew))
            .arg(&self.prefix)
            .arg(round);
        for entry in batch {
            cmd.arg(entry.start).arg(entry.window).arg(entry.value);
        }
        cmd
    }

    /// `EVALSHA mark.lua`: a mark behind `merges` merges of `round`, or a
    /// request for a ticket only.
    fn mark_command(
        &self,
        peer: &Peer,
        mark: Option<&Mark<'_>>,
        round: &str,
        merges: usize,
    ) -> redis::Cmd {
        // The heard hash outlives the staleness by far, and expires after
        // a day of silence at most.
        let ttl = self
            .timing
            .staleness
            .saturating_mul(10)
            .clamp(Duration::from_secs(60), Duration::from_secs(86_400));
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.mark.get_hash())
            .arg(2)
            .arg(heard_key(&self.prefix, &self.region))
            .arg(rounds_key(&self.prefix, &self.region))
            .arg(mark.map_or(0, |m| m.ticket.real))
            .arg(mark.map_or(0, |m| m.ticket.clock))
            .arg(mark.map_or(0, |m| m.clock))
            .arg(peer.clock_arg())
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(micros(self.timing.max_skew))
            .arg(mark.map_or("", |m| m.relied))
            .arg(round)
            .arg(merges)
            .arg(u8::from(mark.is_some_and(|m| m.whole)))
            .arg(mark.map_or(0, |m| m.cursor))
            .arg(mark.map_or("", |m| m.epoch))
            .arg(mark.map_or(0, |m| m.last));
        cmd
    }

    /// What this region's Redis holds its data as: its run id and its
    /// replication id (`INFO server`, `INFO replication`), one of which is
    /// another after a restart, a promotion or a full resync from another
    /// node, whenever the data may have been replaced (see `outbox.lua`).
    async fn data_ids(&self) -> Result<String, StoreError> {
        let mut connection = self.local.clone();
        let timeout = self.timing.push_timeout;
        let (server, replication): (String, String) = tokio::time::timeout(
            timeout,
            redis::pipe()
                .cmd("INFO")
                .arg("server")
                .cmd("INFO")
                .arg("replication")
                .query_async(&mut connection),
        )
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
        .map_err(backend_error)?;
        let field = |info: &str, name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|id| id.trim().to_owned())
                .ok_or_else(|| {
                    StoreError::Backend(format!("multi-region: INFO has no {name}").into())
                })
        };
        Ok(format!(
            "{}:{}",
            field(&server, "run_id:")?,
            field(&replication, "master_replid:")?
        ))
    }

    /// Reads the outbox after `after` (the peer's cursor when `None`), in
    /// this Redis's run `run`.
    async fn read(&self, peer: &Peer, after: Option<u64>, run: &str) -> Result<Read, StoreError> {
        let keys = outbox_keys(&self.prefix);
        let mut invocation = self.outbox.prepare_invoke();
        invocation
            .key(&keys[0])
            .key(&keys[2])
            .key(&keys[3])
            .arg(&peer.name)
            .arg(after.map_or(-1, |a| i64::try_from(a).unwrap_or(i64::MAX)))
            .arg(READ_CHUNK)
            .arg(self.fixed_now())
            .arg(micros(self.timing.max_skew))
            .arg(run);
        let reply =
            super::peer::invoke_local(&self.local, &invocation, self.timing.push_timeout).await?;
        let bad = || bad_reply("outbox.lua", &reply);
        let Value::Array(items) = &reply else {
            return Err(bad());
        };
        if items.len() < 6 || items.len() % 2 != 0 {
            return Err(bad());
        }
        let entries = items[6..]
            .chunks_exact(2)
            .map(|pair| parse_member(&text(&pair[0])?, number(&pair[1])?))
            .collect::<Option<Vec<Entry>>>()
            .ok_or_else(bad)?;
        Ok(Read {
            epoch: text(&items[0]).ok_or_else(bad)?,
            after: number(&items[1]).ok_or_else(bad)?,
            last: number(&items[2]).ok_or_else(bad)?,
            done: number(&items[3]).ok_or_else(bad)? == 1,
            clock: number(&items[4]).ok_or_else(bad)?,
            born: text(&items[5]).ok_or_else(bad)?,
            entries,
        })
    }

    /// A ticket of the peer's Redis, nothing marked.
    async fn ask_ticket(&self, peer: &Peer) -> Result<Ticket, StoreError> {
        let mut pipe = redis::pipe();
        pipe.add_command(self.mark_command(peer, None, "", 0));
        let replies = self.send_pipeline(peer, pipe).await?;
        let reply = replies
            .first()
            .ok_or_else(|| StoreError::Backend("multi-region: no reply to the mark".into()))?;
        let (ticket, _) = parse_mark(reply)?;
        *peer.ticket.lock() = Some(ticket);
        Ok(ticket)
    }

    /// Moves the peer's cursor forward to `to`, or back to 0 when `None`.
    async fn move_cursor(
        &self,
        peer: &Peer,
        to: Option<u64>,
        epoch: &str,
        born: &str,
    ) -> Result<(), StoreError> {
        let keys = outbox_keys(&self.prefix);
        let mut invocation = self.cursor.prepare_invoke();
        invocation
            .key(&keys[3])
            .arg(&peer.name)
            .arg(to.map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX)))
            .arg(epoch)
            .arg(born);
        super::peer::invoke_local(&self.local, &invocation, self.timing.push_timeout).await?;
        Ok(())
    }
}

/// A pipeline on its way to a peer.
type Pending = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Value>, StoreError>> + Send>>;

/// Drives `sends` together, each first polled in the order given, so their
/// commands go out on the connection in that order; their outputs, in that
/// order.
async fn in_order(mut sends: Vec<Pending>) -> Vec<Result<Vec<Value>, StoreError>> {
    let mut outputs: Vec<Option<Result<Vec<Value>, StoreError>>> =
        sends.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (send, output) in sends.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match send.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

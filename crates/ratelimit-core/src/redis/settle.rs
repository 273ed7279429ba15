//! [`Store::settle`](crate::Store::settle) for [`RedisStore`]: every limit
//! of a request in one call of `settle.lua` on a single node; on a Redis
//! Cluster, one call per hash slot.

use std::cmp::Ordering;

use redis::Value;
#[cfg(feature = "redis-cluster")]
use redis::cluster_routing::Slot;

use super::{
    Arg, Named, RedisStore, Via, admin, decision_from, parameters, policy_conflict, protocol_error,
};
#[cfg(feature = "redis-cluster")]
use super::{Backend, slot_number};
use crate::settle::{Settle, SettleFuture, SettlementId};
use crate::store::Merged;
use crate::{Decision, PermitId, Policy, StoreError};

/// One limit to settle: its state key, its policy, what it consumed and
/// what it cost.
type Part = (String, Policy, u64, u64);

impl RedisStore {
    /// [`Store::settle`](crate::Store::settle): duplicates merged, then
    /// [`settle_parts`](Self::settle_parts).
    pub(super) fn settle_boxed(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        let merged = match Merged::settles(settles, |s| self.state_key(s.key, s.policy)) {
            Ok(merged) => merged,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let parts: Vec<Part> = merged
            .items
            .iter()
            .map(|p| {
                let key = self.state_key(p.key, p.policy);
                (key, p.policy.clone(), p.reserved, p.actual)
            })
            .collect();
        let of = merged.of;
        let store = self.clone();
        Box::pin(async move {
            if parts.is_empty() {
                return Ok(Vec::new());
            }
            let decisions = store.settle_parts(id, parts).await?;
            crate::store::spread(&of, &decisions)
        })
    }

    /// Settles `parts` (distinct state keys) under `id`: one call on a
    /// single node. On a Redis Cluster a call touches one hash slot: limits
    /// on one user key share its hash tag and settle in one call; the others
    /// settle slot by slot, in slot order as `check_all` decides them, each
    /// slot whatever the others answered (a settlement reports what was
    /// really spent: a part that failed is no reason to undo one that did
    /// not). The first error is returned; the same settlement sent again
    /// settles the slots that failed and changes nothing in the others.
    async fn settle_parts(
        &self,
        id: SettlementId,
        parts: Vec<Part>,
    ) -> Result<Vec<Decision>, StoreError> {
        let id = id.to_string();
        #[cfg(feature = "redis-cluster")]
        if matches!(self.inner.backend, Backend::Cluster(_)) {
            let mut groups: Vec<(u16, Slot, Vec<usize>)> = Vec::new();
            for (i, (key, ..)) in parts.iter().enumerate() {
                let slot = Slot::for_key(key);
                match groups.iter_mut().find(|(_, s, _)| *s == slot) {
                    Some((_, _, indexes)) => indexes.push(i),
                    None => groups.push((slot_number(slot).unwrap_or(u16::MAX), slot, vec![i])),
                }
            }
            if groups.len() > 1 {
                groups.sort_by_key(|(number, _, _)| *number);
                let mut decisions: Vec<Option<Decision>> = vec![None; parts.len()];
                let mut first_error = None;
                for (_, _, indexes) in &groups {
                    let group: Vec<Part> = indexes.iter().map(|&i| parts[i].clone()).collect();
                    match self.settle_group(&id, &group).await {
                        Ok(settled) => {
                            for (&i, d) in indexes.iter().zip(settled) {
                                decisions[i] = Some(d);
                            }
                        }
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                if let Some(error) = first_error {
                    return Err(error);
                }
                return Ok(decisions.into_iter().flatten().collect());
            }
        }
        self.settle_group(&id, &parts).await
    }

    /// One call of `settle.lua` on `parts`, whose keys share a node (a slot,
    /// on a cluster): all or nothing, each part counted once per `id`.
    async fn settle_group(&self, id: &str, parts: &[Part]) -> Result<Vec<Decision>, StoreError> {
        let mut keys = Vec::with_capacity(2 * parts.len());
        let mut args = Vec::with_capacity(2 + 5 * parts.len());
        args.push(Arg::Int(self.fixed_now()));
        args.push(Arg::Str(id));
        for (key, policy, reserved, actual) in parts {
            keys.push(key.clone());
            keys.push(admin::applied_key(key));
            let (operation, amount) = operation(policy, *reserved, *actual);
            let (p1, p2) = parameters(policy.algorithm());
            args.push(Arg::Str(policy.algorithm().kind()));
            args.push(Arg::Str(operation));
            args.push(Arg::Int(amount));
            args.push(Arg::Int(p1));
            args.push(Arg::Int(p2));
        }
        let (script, source) = self.inner.scripts.get(Named::Settle);
        let reply = self
            .inner
            .eval(
                script,
                source,
                keys.as_slice(),
                &args,
                Via::Pool,
                self.inner.deadline(),
            )
            .await
            .map_err(|e| policy_conflict(e, parts.iter().map(|(key, policy, ..)| (key, policy))))?;
        let items = match &reply {
            Value::Array(items) if items.len() == parts.len() => items,
            other => return Err(protocol_error("a settlement", other)),
        };
        items
            .iter()
            .map(|item| decision_from(item, PermitId(0), 0))
            .collect()
    }
}

/// What `settle.lua` does to a limit that consumed `reserved` and cost
/// `actual`, as [`Algorithm::settle`](crate::Algorithm::settle) does: a
/// penalty or a refund of the difference (at most four times the limit: no
/// state holds more, and the script's arithmetic stays exact), or a peek.
fn operation(policy: &Policy, reserved: u64, actual: u64) -> (&'static str, u64) {
    let cap = policy.limit().saturating_mul(4);
    match actual.cmp(&reserved) {
        Ordering::Greater => ("penalize", (actual - reserved).min(cap)),
        Ordering::Less => ("refund", (reserved - actual).min(cap)),
        Ordering::Equal => ("peek", 0),
    }
}

//! [`AdminStore`] for [`RedisStore`]: penalties and rewards in `admin.lua`,
//! blocks and unblocks in `block.lua` (a block lives in the state key, in
//! front of the state: the read every check makes finds it), resets as
//! `DEL`.

use std::time::Duration;

use super::{Arg, BoxFuture, Named, RedisStore, Via, decision_from, parameters, policy_conflict};
use crate::admin::{Adjustment, AdminStore, block_micros};
use crate::store::Store;
use crate::{Decision, PermitId, Policy, StoreError};

/// The key beside `state_key`, in its slot, that remembers the operations
/// applied to it which must count once (`applied_ids` in prelude.lua): the
/// state key's name (which ends with its hash tag) and `:applied`, so never
/// another state key.
pub(super) fn applied_key(state_key: &str) -> String {
    let mut key = String::with_capacity(state_key.len() + 8);
    key.push_str(state_key);
    key.push_str(":applied");
    key
}

impl RedisStore {
    async fn adjust(
        self,
        state_key: String,
        policy: Policy,
        adjustment: Adjustment,
        amount: u64,
    ) -> Result<Decision, StoreError> {
        let (p1, p2) = parameters(policy.algorithm());
        // No state holds more than four times the limit (the sliding window
        // counter's two windows of up to twice the limit each), so a larger
        // amount changes nothing, and this keeps the script's doubles exact.
        let amount = amount.min(4 * policy.limit());
        // One id for every resend of this call: applied once (admin.lua).
        let id = self.inner.permit_ids.fresh().to_string();
        let args = [
            Arg::Int(self.fixed_now()),
            Arg::Str(adjustment.name()),
            Arg::Str(policy.algorithm().kind()),
            Arg::Int(amount),
            Arg::Int(p1),
            Arg::Int(p2),
            Arg::Str(&id),
        ];
        let applied = applied_key(&state_key);
        let keys = [state_key, applied];
        let reply = self
            .on_keys(self.inner.scripts.get(Named::Admin), &keys, &args)
            .await
            .map_err(|e| policy_conflict(e, [(&keys[0], &policy)]))?;
        decision_from(&reply, PermitId(0), 0)
    }

    /// Blocks `state_key` of `policy` for `micros` µs, or lifts its block
    /// (0). The script peeks at the state under the policy, so the key lives
    /// no longer than the later of the block and the state.
    async fn block_for(
        self,
        state_key: String,
        policy: Policy,
        micros: u64,
    ) -> Result<(), StoreError> {
        let (p1, p2) = parameters(policy.algorithm());
        // Two windows: the longest a state can matter, a debt's included.
        let longest = policy.algorithm().window_micros().saturating_mul(2);
        let args = [
            Arg::Int(self.fixed_now()),
            Arg::Int(micros),
            Arg::Str(policy.algorithm().kind()),
            Arg::Int(p1),
            Arg::Int(p2),
            Arg::Int(longest),
        ];
        self.on_keys(
            self.inner.scripts.get(Named::Block),
            std::slice::from_ref(&state_key),
            &args,
        )
        .await
        .map(|_| ())
    }

    /// Runs an admin script (`admin.lua`, `block.lua`: its handle and
    /// source) on a state key (and the keys beside it in its slot).
    async fn on_keys(
        &self,
        (script, source): (&redis::Script, &'static str),
        keys: &[String],
        args: &[Arg<'_>],
    ) -> Result<redis::Value, StoreError> {
        self.inner
            .eval(script, source, keys, args, Via::Pool, self.inner.deadline())
            .await
    }

    /// `DEL` of a state key (and the block in it).
    async fn delete(self, state_key: String) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&state_key);
        self.inner.run(&cmd).await.map(|_| ())
    }
}

/// Every operation is one command: a script (`EVALSHA`, server `TIME`) for
/// penalties, rewards, blocks and unblocks, `DEL` for resets; peeks are
/// checks of cost 0. Every key written has a TTL: a state its own (at most
/// two windows for a state in debt), a blocked one until the later of its
/// block's end and its state's own, so that an unblock gives the state back
/// its own lifetime, however long the block was.
impl AdminStore for RedisStore {
    type DecisionFuture = BoxFuture<Decision>;
    type UpdateFuture = BoxFuture<()>;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        self.check(key, policy, 0)
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        Box::pin(self.clone().delete(self.state_key(key, policy)))
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.adjust_boxed(key, policy, Adjustment::Penalize, amount)
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.adjust_boxed(key, policy, Adjustment::Reward, amount)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        let micros = block_micros(duration);
        let state_key = self.state_key(key, policy);
        Box::pin(self.clone().block_for(state_key, policy.clone(), micros))
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        let state_key = self.state_key(key, policy);
        Box::pin(self.clone().block_for(state_key, policy.clone(), 0))
    }
}

impl RedisStore {
    pub(super) fn adjust_boxed(
        &self,
        key: &[u8],
        policy: &Policy,
        adjustment: Adjustment,
        amount: u64,
    ) -> BoxFuture<Decision> {
        if let Err(e) = adjustment.check(policy) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let state_key = self.state_key(key, policy);
        Box::pin(
            self.clone()
                .adjust(state_key, policy.clone(), adjustment, amount),
        )
    }
}

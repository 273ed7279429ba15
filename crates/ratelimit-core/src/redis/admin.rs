//! [`AdminStore`] for [`RedisStore`]: penalties and rewards in `admin.lua`,
//! blocks in `block.lua` (a block key next to the state key, in the same
//! hash slot, read by every check script), resets and unblocks as `DEL`.

use std::time::Duration;

use super::{
    Arg, BoxFuture, RedisStore, Via, WithBlocks, decision_from, parameters, policy_conflict,
};
use crate::admin::{Adjustment, AdminStore, block_micros};
use crate::store::Store;
use crate::{Decision, PermitId, Policy, StoreError, key};

impl RedisStore {
    /// The Redis key that holds a block of `key` under `policy`
    /// ([`AdminStore::block`]): [`state_key`](RedisStore::state_key) followed
    /// by `:block`, in the same cluster slot. It expires when the block ends.
    pub fn block_key(&self, key: &[u8], policy: &Policy) -> String {
        key::block_key(&self.state_key(key, policy))
    }

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
        let args = [
            Arg::Int(self.fixed_now()),
            Arg::Str(adjustment.name()),
            Arg::Str(policy.algorithm().kind()),
            Arg::Int(amount),
            Arg::Int(p1),
            Arg::Int(p2),
        ];
        let (script, source) = self.inner.scripts.admin();
        let keys = WithBlocks(std::slice::from_ref(&state_key).iter());
        let reply = self
            .inner
            .eval(script, source, &keys, &args, Via::Pool)
            .await
            .map_err(|e| policy_conflict(e, [(&state_key, &policy)]))?;
        decision_from(&reply, PermitId(0), 0)
    }

    async fn block_for(self, block_key: String, micros: u64) -> Result<(), StoreError> {
        let args = [Arg::Int(self.fixed_now()), Arg::Int(micros)];
        let (script, source) = self.inner.scripts.block();
        self.inner
            .eval(
                script,
                source,
                std::slice::from_ref(&block_key),
                &args,
                Via::Pool,
            )
            .await
            .map(|_| ())
    }

    /// `DEL` of keys in one slot.
    async fn delete(self, keys: Vec<String>) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&keys);
        self.inner.run(&cmd).await.map(|_| ())
    }
}

/// Every operation is one command: a script (`EVALSHA`, server `TIME`) for
/// penalties, rewards and blocks, `DEL` for resets and unblocks; peeks are
/// checks of cost 0. Every key written has a TTL: a state its own (at most
/// two windows for a state in debt), a block key the block's duration.
impl AdminStore for RedisStore {
    type DecisionFuture = BoxFuture<Decision>;
    type UpdateFuture = BoxFuture<()>;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        self.check(key, policy, 0)
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        let state_key = self.state_key(key, policy);
        let block_key = key::block_key(&state_key);
        Box::pin(self.clone().delete(vec![state_key, block_key]))
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.adjust_boxed(key, policy, Adjustment::Penalize, amount)
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.adjust_boxed(key, policy, Adjustment::Reward, amount)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        let micros = block_micros(duration);
        let block_key = self.block_key(key, policy);
        if micros == 0 {
            return Box::pin(self.clone().delete(vec![block_key]));
        }
        Box::pin(self.clone().block_for(block_key, micros))
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        Box::pin(self.clone().delete(vec![self.block_key(key, policy)]))
    }
}

impl RedisStore {
    fn adjust_boxed(
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

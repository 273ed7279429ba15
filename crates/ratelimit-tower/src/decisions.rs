//! The decisions made for a request, as a request extension.

use std::sync::Arc;

use ratelimit_core::{Decision, Policy};

/// One policy's decision for a request.
#[derive(Debug, Clone)]
pub struct PolicyDecision {
    policy: Policy,
    decision: Decision,
}

impl PolicyDecision {
    /// Pairs a policy with its decision.
    pub fn new(policy: Policy, decision: Decision) -> Self {
        PolicyDecision { policy, decision }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

/// The rate-limit decisions made for a request, inserted into the request's
/// extensions by the layer before the inner service runs, so later layers and
/// handlers can read them (remaining quota, reset time).
/// Cloning is cheap (the list is shared).
#[derive(Debug, Clone, Default)]
pub struct Decisions {
    entries: Arc<[PolicyDecision]>,
}

impl Decisions {
    /// Decisions from a list.
    pub fn new(entries: Vec<PolicyDecision>) -> Self {
        Decisions {
            entries: entries.into(),
        }
    }

    /// The decisions, in the order the policies were checked.
    pub fn iter(&self) -> std::slice::Iter<'_, PolicyDecision> {
        self.entries.iter()
    }

    /// Whether every decision allows the request.
    pub fn allowed(&self) -> bool {
        self.entries.iter().all(|e| e.decision.is_allowed())
    }

    /// The most restrictive decision: the denied one with the longest retry,
    /// else the allowed one with the least remaining.
    pub fn tightest(&self) -> Option<&PolicyDecision> {
        self.entries.iter().max_by_key(|e| {
            let d = &e.decision;
            (
                !d.is_allowed(),
                d.retry_after_micros(),
                std::cmp::Reverse(d.remaining()),
            )
        })
    }

    /// The number of decisions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no decision.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a PolicyDecision;
    type IntoIter = std::slice::Iter<'a, PolicyDecision>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

//! The decisions made for a request, as a request extension.

use std::sync::Arc;

use ratelimit_core::{Decision, Policy};

/// One policy's decision for a request.
#[derive(Debug, Clone)]
pub struct PolicyDecision {
    policy: Policy,
    decision: Decision,
    estimate: Option<u64>,
}

impl PolicyDecision {
    /// Pairs a policy with its decision.
    pub fn new(policy: Policy, decision: Decision) -> Self {
        PolicyDecision {
            policy,
            decision,
            estimate: None,
        }
    }

    /// The same, for a limit that reserved `estimate` and settles after the
    /// response ([`Settlement`](crate::Settlement)).
    pub(crate) fn with_estimate(mut self, estimate: Option<u64>) -> Self {
        self.estimate = estimate;
        self
    }

    /// The same policy (and estimate) with `decision`: what the limit
    /// reports once settled.
    pub(crate) fn with_decision(mut self, decision: Decision) -> Self {
        self.decision = decision;
        self
    }

    /// For a limit whose cost is settled after the response
    /// ([`Settlement`](crate::Settlement)), the estimate it reserved before
    /// the call (its rule's cost): what the decision has taken so far. The
    /// response then settles it to the actual cost. `None` for a limit
    /// charged its cost once and for all.
    pub fn estimate(&self) -> Option<u64> {
        self.estimate
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Whether the policy is in shadow mode: decided and counted, never
    /// enforced (see [`Policy::with_shadow`]).
    pub fn is_shadow(&self) -> bool {
        self.policy.is_shadow()
    }

    /// Whether this decision refuses the request: the policy denied it and
    /// is enforced (a shadow policy never refuses).
    pub fn refuses(&self) -> bool {
        !self.decision.is_allowed() && !self.policy.is_shadow()
    }
}

/// The rate-limit decisions made for a request, inserted into the request's
/// extensions by the layer before the inner service runs, so later layers and
/// handlers can read them (remaining quota, reset time).
/// Cloning is cheap: one decision is held inline, several are shared.
///
/// Shadow policies are listed with the others, in the order the limits were
/// given, and may have denied an allowed request
/// ([`PolicyDecision::is_shadow`]).
#[derive(Debug, Clone, Default)]
pub struct Decisions {
    entries: Entries,
}

/// No decision, one (the common case: no allocation), or several.
#[derive(Debug, Clone, Default)]
enum Entries {
    #[default]
    None,
    One(PolicyDecision),
    Several(Arc<[PolicyDecision]>),
}

impl Decisions {
    /// Decisions from a list.
    pub fn new(mut entries: Vec<PolicyDecision>) -> Self {
        let entries = match entries.len() {
            0 => Entries::None,
            1 => entries.pop().map_or(Entries::None, Entries::One),
            _ => Entries::Several(entries.into()),
        };
        Decisions { entries }
    }

    /// One decision.
    pub(crate) fn one(entry: PolicyDecision) -> Self {
        Decisions {
            entries: Entries::One(entry),
        }
    }

    /// The decisions, in the order the policies were checked.
    pub fn iter(&self) -> std::slice::Iter<'_, PolicyDecision> {
        self.as_slice().iter()
    }

    /// Whether the request may pass: no decision [refuses](PolicyDecision::refuses)
    /// it (shadow policies may have denied it).
    pub fn allowed(&self) -> bool {
        !self.iter().any(PolicyDecision::refuses)
    }

    /// The most restrictive decision: the one that [refuses](PolicyDecision::refuses)
    /// the request with the longest retry, else the one with the least
    /// remaining (a shadow policy's included), denied ones first.
    pub fn tightest(&self) -> Option<&PolicyDecision> {
        self.iter().max_by_key(|e| {
            let d = &e.decision;
            (
                e.refuses(),
                !d.is_allowed(),
                d.retry_after_micros(),
                std::cmp::Reverse(d.remaining()),
            )
        })
    }

    /// The decisions, as a slice.
    pub(crate) fn as_slice(&self) -> &[PolicyDecision] {
        match &self.entries {
            Entries::None => &[],
            Entries::One(entry) => std::slice::from_ref(entry),
            Entries::Several(entries) => entries,
        }
    }

    /// The number of decisions.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there is no decision.
    pub fn is_empty(&self) -> bool {
        matches!(self.entries, Entries::None)
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a PolicyDecision;
    type IntoIter = std::slice::Iter<'a, PolicyDecision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// None, one (held inline) and several (shared) decisions read alike.
    #[test]
    fn none_one_and_several() {
        let policy = |name: &str| {
            Policy::fixed_window(5, Duration::from_secs(10))
                .unwrap()
                .with_name(name)
                .unwrap()
        };
        let allowed = |name: &str, remaining| {
            PolicyDecision::new(policy(name), Decision::allow(5, remaining, 1_000_000))
        };
        let denied = PolicyDecision::new(policy("c"), Decision::deny(5, 0, 3_000_000, 2_000_000));
        let names = |d: &Decisions| {
            d.iter()
                .map(|e| e.policy().name().to_owned())
                .collect::<Vec<_>>()
        };

        for empty in [Decisions::default(), Decisions::new(Vec::new())] {
            assert!(empty.is_empty() && empty.allowed() && empty.tightest().is_none());
        }
        let one = Decisions::new(vec![allowed("a", 4)]);
        assert_eq!((one.len(), names(&one)), (1, vec!["a".to_owned()]));
        assert!(one.allowed());
        let several = Decisions::new(vec![allowed("a", 4), allowed("b", 1), denied]);
        let cloned = several.clone();
        assert_eq!(names(&cloned), ["a", "b", "c"]);
        assert!(!cloned.allowed());
        assert_eq!(cloned.tightest().unwrap().policy().name(), "c");
        let two = Decisions::new(vec![allowed("a", 4), allowed("b", 1)]);
        assert_eq!(two.tightest().unwrap().policy().name(), "b");
        assert_eq!((&two).into_iter().count(), 2);
    }
}

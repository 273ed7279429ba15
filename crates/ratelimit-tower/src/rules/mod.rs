//! Rules: which limits a request is checked against ([`Rule`], [`And`],
//! [`RuleProvider`], [`Limits`]) and what it costs ([`Cost`]).

pub(crate) mod cost;
pub(crate) mod rule;

pub use cost::Cost;
pub use rule::{And, Limits, Rule, RuleProvider};

//! Costs known only after the response: a rule with a [`Settlement`]
//! reserves its cost as an estimate before the call and settles it, for
//! every such limit of the request in one store call, when the response head
//! arrives (see the crate docs, [Costs known after the
//! response](crate#costs-known-after-the-response)).

mod reading;
pub(crate) mod reservation;
mod spec;

pub use spec::{ActualCost, SettleError, Settlement};

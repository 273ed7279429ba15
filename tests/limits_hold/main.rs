//! Every limit holds on the paths users and attackers take: route rules
//! against a real axum router (`routing`), and attacks written from the
//! documents alone, on the HTTP face (`attacks`), on reloads, permits,
//! parameter changes, the key bound and client keys (`attacks2`), on shared
//! policies, escape spellings, Redis eviction, upgrades and cancellation
//! beside shadow policies (`attacks3`), on
//! settlements after the response (`attack_settle`), on how keys reach
//! the stores (`attack_keys`) and on other spellings of one value or path
//! that the service behind the layer reads alike (`attack_spellings`).
//! One binary, so the suite links it once.

mod attack_keys;
mod attack_settle;
mod attack_spellings;
mod attacks;
mod attacks2;
mod attacks3;
mod route_rules_together;
mod routing;
mod rules;

//! Every limit holds on the paths users and attackers take: route rules
//! against a real axum router (`routing`), and the attacks of reviewers who
//! had not seen the code, on the HTTP face (`attacks`) and on reloads,
//! permits, parameter changes, the key bound and client keys (`attacks2`),
//! and of the third review (`attacks3`: shared policies, escape spellings,
//! Redis eviction, upgrades, cancellation beside shadow policies), on
//! settlements after the response (`attack_settle`) and on how keys reach
//! the stores (`attack_keys`).
//! One binary, so the suite links it once.

mod attack_keys;
mod attack_settle;
mod attacks;
mod attacks2;
mod attacks3;
mod routing;
mod rules;

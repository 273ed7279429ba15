//! The multi-region wiring of the `distributed` example: `--region NAME`,
//! `--peer NAME=URL` (repeatable), `--sync DURATION`, `--staleness DURATION`
//! and `--max-skew DURATION`, and the [`MultiRegionStore`] they build.

use std::time::Duration;

use ratelimit_core::multi_region::MultiRegionStore;
use ratelimit_core::{AlgorithmKind, Policy};

/// The multi-region flags of one instance (`#[command(flatten)]` them).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RegionFlags {
    /// Serve region NAME: decide in its own --redis against the counts of
    /// every region (fixed-window or sliding-window only).
    #[arg(long, value_name = "NAME")]
    pub region: Option<String>,
    /// Another region and its Redis, such as us=redis://10.0.2.1:6379; once
    /// per other region.
    #[arg(long = "peer", value_name = "NAME=URL", value_parser = parse_peer)]
    pub peers: Vec<(String, String)>,
    /// How often counts go to the peers [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = crate::nonzero_duration)]
    pub sync: Option<Duration>,
    /// How old a peer's freshest complete push may be before it counts at
    /// its conservative share; more than twice --sync [default: 2s].
    #[arg(long, value_name = "DURATION", value_parser = crate::nonzero_duration)]
    pub staleness: Option<Duration>,
    /// The clock difference between regions that changes nothing; a peer
    /// further off counts at its conservative share [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = crate::nonzero_duration)]
    pub max_skew: Option<Duration>,
}

/// Parses `NAME=URL` (the value of `--peer`).
pub fn parse_peer(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, url))
            if !name.is_empty()
                && (url.starts_with("redis://") || url.starts_with("rediss://")) =>
        {
            Ok((name.to_owned(), url.to_owned()))
        }
        _ => Err(format!(
            "--peer: {text:?} is not NAME=URL, such as us=redis://10.0.2.1:6379"
        )),
    }
}

impl RegionFlags {
    /// Refuses combinations that make no sense: peers, `--sync`,
    /// `--staleness` or `--max-skew` without `--region`, a region without
    /// peers, or a region on a Redis Cluster.
    pub fn check(&self, cluster: bool) -> Result<(), String> {
        let tuned = self.sync.is_some() || self.staleness.is_some() || self.max_skew.is_some();
        match &self.region {
            None if !self.peers.is_empty() || tuned => Err(String::from(
                "--peer, --sync, --staleness and --max-skew need --region",
            )),
            Some(_) if self.peers.is_empty() => {
                Err(String::from("--region needs at least one --peer NAME=URL"))
            }
            Some(_) if cluster => Err(String::from(
                "--region: each region's Redis is one node, not a --cluster",
            )),
            _ => Ok(()),
        }
    }

    /// The store of this region on `redis` (its own Redis), or `None`
    /// without `--region`. Decisions get `timeout` each. A policy whose
    /// state is not a count per window is refused here, at start-up.
    pub async fn store(
        &self,
        redis: &str,
        timeout: Duration,
        policy: &Policy,
    ) -> Result<Option<MultiRegionStore>, String> {
        let Some(region) = &self.region else {
            return Ok(None);
        };
        // The algorithms whose state is a count per window.
        if !matches!(
            policy.algorithm().algorithm_kind(),
            AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
        ) {
            return Err(format!(
                "--region: --algorithm {} is not supported across regions (use fixed-window or sliding-window)",
                policy.algorithm().kind()
            ));
        }
        let mut builder = MultiRegionStore::builder(region.clone(), redis).call_timeout(timeout);
        if let Some(sync) = self.sync {
            builder = builder.sync(sync);
        }
        if let Some(staleness) = self.staleness {
            builder = builder.staleness(staleness);
        }
        if let Some(max_skew) = self.max_skew {
            builder = builder.max_skew(max_skew);
        }
        for (name, url) in &self.peers {
            builder = builder.peer(name.clone(), url.clone());
        }
        let store = builder
            .build()
            .await
            .map_err(|e| format!("--region {region} --redis {redis}: {e}"))?;
        eprintln!(
            "region {region}: deciding in {redis}, syncing with {} every {}",
            self.peers
                .iter()
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            self.sync.map_or_else(
                || String::from("100ms (the default)"),
                |sync| format!("{sync:?}")
            )
        );
        Ok(Some(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_name_equals_url() {
        assert_eq!(
            parse_peer("us=redis://127.0.0.1:6380").expect("valid"),
            ("us".to_owned(), "redis://127.0.0.1:6380".to_owned())
        );
        assert!(parse_peer("us").is_err());
        assert!(parse_peer("=redis://x").is_err());
        assert!(parse_peer("us=http://x").is_err());
    }

    #[test]
    fn flags_that_need_a_region_are_refused_without_one() {
        let flags = RegionFlags {
            peers: vec![("us".into(), "redis://x".into())],
            ..RegionFlags::default()
        };
        assert!(flags.check(false).is_err());
        let alone = RegionFlags {
            region: Some("eu".into()),
            ..RegionFlags::default()
        };
        assert!(alone.check(false).is_err());
        let tuned = RegionFlags {
            staleness: Some(Duration::from_secs(5)),
            ..RegionFlags::default()
        };
        assert!(tuned.check(false).is_err());
    }
}

//! [`ReloadableRules`]: a [`Config`] that can be replaced while serving.

use std::fmt;
use std::future::{Ready, ready};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use http::Request;

use super::compile::{describe, headers_apart};
use super::schema::KeyPart;
use super::{Config, ConfigError, ConfigErrorKind, Format};
use crate::rules::rule::{Limits, RuleProvider};

/// Rules from a [`Config`] that can be replaced at run time, without
/// dropping or holding back a request.
///
/// Each request reads the configuration in force when it arrives, with one
/// atomic load (no lock); a reload swaps in the new one atomically. The
/// limits of a request are taken from one configuration, so requests in
/// flight finish under the limits they started with. A reload that fails
/// (a bad file) leaves the configuration in force as it was.
///
/// Clones share the configuration: keep one to reload, give another to
/// [`RateLimitLayer::with_rules`](crate::RateLimitLayer::with_rules).
///
/// A reload refuses to give a policy name in force another algorithm (see
/// [stored state](super#reloading-and-stored-state)).
///
/// # Reloads that would lift limits
///
/// An empty file, or one cut short (a writer that died halfway, a file read
/// while it was written in place), often still parses: `""`, or any prefix
/// that ends before the `[[rules]]`, is a configuration without rules, and
/// would lift every limit. So a reload is refused
/// ([`ConfigErrorKind::RulesDropped`]) when the new configuration
///
/// - defines no rules,
/// - defines fewer rules than the one in force, or
/// - defines fewer policies than the one in force.
///
/// A reloader does not start from a configuration without rules either
/// ([`from_file`](ReloadableRules::from_file),
/// [`from_str`](ReloadableRules::from_str)). A policy is never keyed by
/// another header ([`ConfigErrorKind::Rule`]), nor given another algorithm,
/// than a configuration put in force before gave it, however many reloads
/// lie between.
///
/// A file cut after a rule's optional field, with as many rules and
/// policies, still loads: cut before a rule's last `cost`, its `settle`
/// table or one of its fields, or an `[ip]` section, its defaults apply.
/// Write the new file beside the old one and rename it over it.
///
/// Changing rules and policies, adding some, or renaming a policy (one name
/// replaced by another) is not dropping one. A renamed policy is a new limit:
/// its state is another, so every key starts with a full budget under it
/// (which is how an algorithm is changed; a cut file never renames). To remove rules or policies on
/// purpose, or to load a configuration without rules, build the reloader with
/// [`allow_dropping_rules`](ReloadableRules::allow_dropping_rules). The
/// refusal is logged and counted like any failed reload, and the
/// configuration in force stays.
///
/// ```
/// use ratelimit_tower::config::{ConfigErrorKind, Format, ReloadableRules};
///
/// let toml = |algorithm: &str, limit: u32| format!(r#"
///     [policies.api]
///     algorithm = "{algorithm}"
///     limit = {limit}
///     window = "1m"
///
///     [[rules]]
///     policy = "api"
///     key = "ip"
/// "#);
/// let rules = ReloadableRules::from_str(&toml("fixed-window", 10), Format::Toml)?;
/// rules.reload_from_str(&toml("fixed-window", 20), Format::Toml)?;
/// assert_eq!(rules.current().policy("api").unwrap().limit(), 20);
///
/// let error = rules.reload_from_str(&toml("sliding-log", 20), Format::Toml).unwrap_err();
/// assert_eq!(error.kind(), ConfigErrorKind::AlgorithmChanged);
/// assert_eq!(error.path(), "policies.api.algorithm");
/// assert_eq!(rules.current().policy("api").unwrap().algorithm().kind(), "fixed-window");
///
/// // An empty (or truncated) file would lift every limit: refused.
/// let error = rules.reload_from_str("", Format::Toml).unwrap_err();
/// assert_eq!(error.kind(), ConfigErrorKind::RulesDropped);
/// assert_eq!(rules.current().rule_count(), 1);
///
/// // Unless the reloader was told it is meant.
/// let rules = rules.allow_dropping_rules(true);
/// rules.reload_from_str("", Format::Toml)?;
/// assert_eq!(rules.current().rule_count(), 0);
/// # Ok::<(), ratelimit_tower::config::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ReloadableRules {
    shared: Arc<Shared>,
}

struct Shared {
    current: ArcSwap<Config>,
    /// Held while a reload checks and swaps, so two reloads do not interleave;
    /// requests never take it. Also records which file version is loaded.
    reload: Mutex<Option<(PathBuf, Option<Stamp>)>>,
    /// [`ReloadableRules::allow_dropping_rules`].
    allow_dropping: AtomicBool,
    /// What every configuration put in force gave each policy.
    seen: Mutex<Seen>,
}

/// Each policy's keys (of the rules over it) and algorithm, in every
/// configuration put in force: a policy is never keyed by another header
/// (see [`refuse_rekeyed`]) nor given another algorithm under its name,
/// even over several reloads.
#[derive(Default)]
struct Seen {
    keys: Vec<(String, Box<[KeyPart]>)>,
    algorithms: Vec<(String, &'static str)>,
}

impl Seen {
    /// Adds what `config` gives its policies.
    fn add(&mut self, config: &Config) {
        for rule in config.inner.rules.iter() {
            let pair = (rule.policy.name().to_owned(), rule.written_key.clone());
            if !self.keys.contains(&pair) {
                self.keys.push(pair);
            }
        }
        for policy in config.policies() {
            let pair = (policy.name().to_owned(), policy.algorithm().kind());
            if !self.algorithms.contains(&pair) {
                self.algorithms.push(pair);
            }
        }
    }
}

/// What identifies a version of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    /// The inode: a file replaced by a rename (as editors and Kubernetes
    /// config maps do) is another file even with the same time and size.
    inode: u64,
    /// A hash of the content: an edit that keeps the size and puts the
    /// modification time back (`cp -p`, `touch -r`, two writes within the
    /// file system's time resolution) is another version too. `None` when
    /// the file cannot be read.
    content: Option<u64>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0;
    // A configuration file is small: reading it at each check costs little.
    let content = std::fs::read(path).ok().map(|bytes| {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&bytes, &mut hasher);
        std::hash::Hasher::finish(&hasher)
    });
    Some(Stamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode,
        content,
    })
}

impl fmt::Debug for ReloadableRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadableRules")
            .field("current", &self.shared.current.load())
            .finish()
    }
}

impl ReloadableRules {
    /// Starts with `config`.
    pub fn new(config: Config) -> Self {
        let mut seen = Seen::default();
        seen.add(&config);
        ReloadableRules {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(config),
                reload: Mutex::new(None),
                allow_dropping: AtomicBool::new(false),
                seen: Mutex::new(seen),
            }),
        }
    }

    /// Whether a reload may drop rules or policies in force, or load a
    /// configuration without rules (default `false`: such a reload is
    /// refused with [`ConfigErrorKind::RulesDropped`]; see
    /// [reloads that would lift limits](ReloadableRules#reloads-that-would-lift-limits)).
    ///
    /// Set it when removing rules is what a reload is for, knowing that an
    /// empty or truncated file is then loaded too. The setting is shared by
    /// every clone, [`watch_file`](ReloadableRules::watch_file)'s included.
    pub fn allow_dropping_rules(self, allow: bool) -> Self {
        self.shared.allow_dropping.store(allow, Ordering::Relaxed);
        self
    }

    /// Starts with the configuration in `text`.
    ///
    /// # Errors
    ///
    /// As [`Config::parse`]; [`ConfigErrorKind::RulesDropped`] when it
    /// defines no rules (start from [`ReloadableRules::new`] if that is
    /// meant).
    pub fn from_str(text: &str, format: Format) -> Result<Self, ConfigError> {
        Config::parse(text, format)
            .and_then(with_rules)
            .map(ReloadableRules::new)
    }

    /// Starts with the configuration in the file at `path`, remembering its
    /// version for [`watch_file`](ReloadableRules::watch_file).
    ///
    /// # Errors
    ///
    /// As [`Config::from_file`]; [`ConfigErrorKind::Changing`] when the file
    /// changed while it was read; [`ConfigErrorKind::RulesDropped`] when it
    /// defines no rules.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let version = stamp(path);
        let config = Config::from_file(path);
        if stamp(path) != version {
            return Err(changing(path));
        }
        let rules = ReloadableRules::new(with_rules(config?).map_err(|e| e.in_file(path))?);
        *rules.lock() = Some((path.to_owned(), version));
        Ok(rules)
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Config> {
        self.shared.current.load_full()
    }

    /// Puts `config` in force, for every request from now on.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::AlgorithmChanged`] when `config` gives a policy
    /// name in force another algorithm, [`ConfigErrorKind::Rule`] when it
    /// keys a policy in force by another header (a new header needs a new
    /// policy name), and
    /// [`ConfigErrorKind::RulesDropped`] when it would drop rules or
    /// policies in force (see
    /// [reloads that would lift limits](ReloadableRules#reloads-that-would-lift-limits));
    /// the configuration in force stays.
    pub fn reload(&self, config: Config) -> Result<(), ConfigError> {
        let _guard = self.lock();
        counted(self.swap(config))
    }

    /// Reads `text` and puts it in force.
    ///
    /// # Errors
    ///
    /// As [`Config::parse`] and [`reload`](ReloadableRules::reload); the
    /// configuration in force stays.
    pub fn reload_from_str(&self, text: &str, format: Format) -> Result<(), ConfigError> {
        let _guard = self.lock();
        counted(Config::parse(text, format).and_then(|config| self.swap(config)))
    }

    /// Reads the file at `path` and puts it in force.
    ///
    /// # Errors
    ///
    /// As [`Config::from_file`] and [`reload`](ReloadableRules::reload), and
    /// [`ConfigErrorKind::Changing`] when the file's modification time, size,
    /// inode or content changed while it was read; the configuration in
    /// force stays.
    pub fn reload_from_file(&self, path: impl AsRef<Path>) -> Result<(), ConfigError> {
        counted(self.load_file(path.as_ref()))
    }

    fn load_file(&self, path: &Path) -> Result<(), ConfigError> {
        let mut loaded = self.lock();
        // Taken before reading: a change made while reading is seen next time.
        let version = stamp(path);
        let config = Config::from_file(path);
        if stamp(path) != version {
            return Err(changing(path));
        }
        self.swap(config?).map_err(|e| e.in_file(path))?;
        *loaded = Some((path.to_owned(), version));
        Ok(())
    }

    /// Watches the file at `path`: every `every` (at least 1 ms), compares
    /// its modification time, size, inode and content with those of the
    /// version last loaded, and when they differ, reloads it
    /// ([`reload_from_file`](ReloadableRules::reload_from_file)) once it is
    /// stable.
    ///
    /// Stable means the file's modification time, size, inode and content
    /// were the same at two checks `every` apart, and stayed the same while
    /// it was read. A file written in place is so read only after its writer has
    /// stopped for a whole interval; a file that arrives by a rename (as
    /// editors, `mv` of a finished file and Kubernetes config maps do) is
    /// complete from the start, and is loaded one interval after it arrives.
    /// What a writer that died halfway left is read like any stable file,
    /// and refused if it drops rules (see
    /// [reloads that would lift limits](ReloadableRules#reloads-that-would-lift-limits)).
    /// Writing the new file beside the old one and renaming it over it is the
    /// safe way to change a watched file.
    ///
    /// A reload that fails is logged with `tracing` at `warn` level, once per
    /// version of the file, and the configuration in force stays; a
    /// successful one is logged at `info`. Both are counted in
    /// `ratelimit_config_reloads_total` (feature `metrics`, see
    /// [`metrics`](crate::metrics)). If the rules were not loaded from `path`, the first
    /// stable version is loaded.
    ///
    /// The task runs until it is aborted through the returned handle (dropping
    /// the handle leaves it running). It reads the file on the runtime's
    /// thread at each check, which is quick for a local configuration file. It keeps time with
    /// Tokio's clock.
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    pub fn watch_file(
        &self,
        path: impl Into<PathBuf>,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let rules = self.clone();
        let path = path.into();
        let every = every.max(Duration::from_millis(1));
        let mut tried = match &*self.lock() {
            Some((loaded, version)) if *loaded == path => Some(*version),
            _ => None,
        };
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // A version not yet tried, seen at the previous check.
            let mut pending: Option<Option<Stamp>> = None;
            loop {
                ticks.tick().await;
                let version = stamp(&path);
                if tried == Some(version) {
                    pending = None;
                    continue;
                }
                if pending != Some(version) {
                    // New, or changed since the last check: not settled yet.
                    pending = Some(version);
                    continue;
                }
                match rules.reload_from_file(&path) {
                    Ok(()) => {
                        tried = Some(version);
                        pending = None;
                        tracing::info!(file = %path.display(), "rate-limit configuration reloaded");
                    }
                    // Still being written: wait until it settles again.
                    Err(error) if error.kind() == ConfigErrorKind::Changing => {
                        pending = Some(stamp(&path));
                        tracing::debug!(file = %path.display(), %error, "rate-limit configuration changing");
                    }
                    Err(error) => {
                        tried = Some(version);
                        pending = None;
                        tracing::warn!(
                            file = %path.display(),
                            %error,
                            "rate-limit configuration not reloaded; the one in force stays"
                        );
                    }
                }
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(PathBuf, Option<Stamp>)>> {
        self.shared
            .reload
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks `config` against the one in force and swaps it in. The caller
    /// holds the reload lock.
    fn swap(&self, config: Config) -> Result<(), ConfigError> {
        let current = self.shared.current.load();
        if !self.shared.allow_dropping.load(Ordering::Relaxed) {
            refuse_dropped(&current, &config)?;
        }
        let mut seen = self
            .shared
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        refuse_rekeyed(&seen.keys, &config)?;
        for policy in config.policies() {
            let now = policy.algorithm().kind();
            let before = seen
                .algorithms
                .iter()
                .find(|(name, was)| name == policy.name() && *was != now);
            if let Some(&(_, was)) = before {
                return Err(ConfigError::new(
                    ConfigErrorKind::AlgorithmChanged,
                    format!("policies.{}.algorithm", policy.name()),
                    format!(
                        "policy {:?} was {was} in a configuration in force, not {now}: \
                         stores keep state per policy name, so give the new algorithm a new \
                         name (such as \"{}-{now}\")",
                        policy.name(),
                        policy.name()
                    ),
                ));
            }
        }
        seen.add(&config);
        self.shared.current.store(Arc::new(config));
        Ok(())
    }
}

/// `config`, refused when it has no rules: a reloader started from an
/// empty or cut file would limit nothing.
fn with_rules(config: Config) -> Result<Config, ConfigError> {
    if config.rule_count() == 0 {
        return Err(ConfigError::new(
            ConfigErrorKind::RulesDropped,
            "rules",
            "the configuration defines no rules: an empty or truncated file would limit \
             nothing; start from ReloadableRules::new(config) if that is meant",
        ));
    }
    Ok(config)
}

/// The error of a file that changed while it was read.
fn changing(path: &Path) -> ConfigError {
    ConfigError::new(
        ConfigErrorKind::Changing,
        "",
        "the file changed while it was read; it is read again once it stops changing",
    )
    .in_file(path)
}

/// Refuses `config` when it keys a policy by another header than a
/// configuration put in force before did (`keyed`, since the reloader
/// started: over two reloads, through a configuration where the policy has
/// no rule, too). A value is one budget whichever header brings it, so
/// while the instances sharing a store reload one after the other (or a
/// rolling deploy runs), both headers would key the policy: a client could
/// send another's value (a tenant's id, no secret) in the new header and
/// spend that budget where the old one is still read, as
/// [`Config::from_toml`] refuses within one configuration.
fn refuse_rekeyed(keyed: &[(String, Box<[KeyPart]>)], config: &Config) -> Result<(), ConfigError> {
    for (index, rule) in config.inner.rules.iter().enumerate() {
        let before = keyed.iter().find(|(policy, key)| {
            policy == rule.policy.name() && headers_apart(key, &rule.written_key)
        });
        if let Some((_, key)) = before {
            return Err(ConfigError::new(
                ConfigErrorKind::Rule,
                format!("rules[{index}].key"),
                format!(
                    "policy {:?} was keyed by {} in a configuration in force and is by {} \
                     here: while the instances that share its store reload one after the \
                     other, a value sent in either header would be one budget, so a client \
                     could spend another's budget by sending its value in the new header; give \
                     the new key a new policy name",
                    rule.policy.name(),
                    describe(key),
                    describe(&rule.written_key),
                ),
            ));
        }
    }
    Ok(())
}

/// The allowing hint that ends every [`ConfigErrorKind::RulesDropped`] message.
const ALLOW_HINT: &str = "a reload that drops rules is refused, as an empty or truncated file \
     would lift limits; if it is meant, build the reloader with allow_dropping_rules(true)";

/// Refuses `config` when it has no rules, or fewer rules or policies than
/// `current` (see [`ReloadableRules`]).
fn refuse_dropped(current: &Config, config: &Config) -> Result<(), ConfigError> {
    let dropped = |path: &str, what: String| {
        Err(ConfigError::new(
            ConfigErrorKind::RulesDropped,
            path,
            format!("{what}: {ALLOW_HINT}"),
        ))
    };
    let (rules, in_force) = (config.rule_count(), current.rule_count());
    if rules == 0 {
        return dropped(
            "rules",
            String::from("the new configuration defines no rules"),
        );
    }
    if rules < in_force {
        return dropped(
            "rules",
            format!("the new configuration defines {rules} rules where {in_force} are in force"),
        );
    }
    let (policies, in_force) = (config.policies().len(), current.policies().len());
    if policies < in_force {
        let missing: Vec<&str> = current
            .policies()
            .map(|p| p.name())
            .filter(|name| config.policy(name).is_none())
            .collect();
        return dropped(
            "policies",
            format!(
                "the new configuration defines {policies} policies where {in_force} are in \
                 force (missing: {})",
                missing.join(", ")
            ),
        );
    }
    Ok(())
}

/// Counts a reload's outcome in `ratelimit_config_reloads_total`.
fn counted(result: Result<(), ConfigError>) -> Result<(), ConfigError> {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        crate::metrics::CONFIG_RELOADS,
        "outcome" => if result.is_ok() { "loaded" } else { "failed" }
    )
    .increment(1);
    result
}

impl<B> RuleProvider<Request<B>> for ReloadableRules {
    type Future = Ready<Limits>;

    fn limits(&self, req: &Request<B>) -> Ready<Limits> {
        ready(self.shared.current.load().limits(req))
    }

    fn limits_at_once(&self, req: &Request<B>) -> Option<Limits> {
        Some(self.shared.current.load().limits(req))
    }
}

#[cfg(test)]
mod tests {
    use super::{ConfigErrorKind, Format, ReloadableRules};

    /// A process (re)started while its configuration file is empty (being
    /// rewritten in place, or left so by a writer that died) would serve with
    /// no limit at all: `from_file` refuses a configuration without rules, as
    /// a reload does.
    #[test]
    fn a_reloader_started_from_an_empty_file_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("ratelimit-empty-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("ratelimit.toml");
        std::fs::write(&path, "").expect("write");
        let started = ReloadableRules::from_file(&path);
        let _ = std::fs::remove_dir_all(&dir);
        match started {
            Err(error) => assert_eq!(error.kind(), ConfigErrorKind::RulesDropped),
            Ok(rules) => panic!(
                "an empty file starts the reloader with {} rules: every request passes",
                rules.current().rule_count()
            ),
        }
    }

    /// A policy is never keyed by another header, even over two reloads: first
    /// its rule moves to another policy (the policy stays defined, its state
    /// stays in the store), then the policy is keyed by the new header. An
    /// instance that goes straight from the first file to the last refuses it
    /// and keeps `api` keyed by `x-tenant`; one that saw the middle file must
    /// refuse it too, or both headers would key one budget on one store.
    #[test]
    fn a_policy_rekeyed_in_two_reloads_is_refused() {
        let file = |rules: &str| {
            format!(
                "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1m\"\n\n\
                 [policies.other]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1m\"\n\n{rules}"
            )
        };
        let rule = |policy: &str, header: &str| {
            format!("[[rules]]\npolicy = \"{policy}\"\nkey = \"header:{header}\"\n\n")
        };
        let first = file(&rule("api", "x-tenant"));
        let middle = file(&rule("other", "x-tenant"));
        let last = file(&format!(
            "{}{}",
            rule("api", "x-api-key"),
            rule("other", "x-tenant")
        ));

        // Straight from the first file to the last: refused, as documented.
        let straight = ReloadableRules::from_str(&first, Format::Toml).expect("valid");
        assert!(straight.reload_from_str(&last, Format::Toml).is_err());

        let stepwise = ReloadableRules::from_str(&first, Format::Toml).expect("valid");
        stepwise
            .reload_from_str(&middle, Format::Toml)
            .expect("the middle file only moves a rule");
        assert!(
            stepwise.reload_from_str(&last, Format::Toml).is_err(),
            "policy \"api\", keyed by x-tenant two reloads ago (and still so on an instance \
             that skipped the middle file), is now keyed by x-api-key"
        );
    }

    /// A policy's algorithm never changes under its name, even over two
    /// reloads: renamed away (a rename is not a drop), then renamed back
    /// with another algorithm, as an instance that skipped the middle file
    /// still runs it with the first on the shared store.
    #[test]
    fn a_policy_algorithm_changed_in_two_reloads_is_refused() {
        let file = |name: &str, algorithm: &str| {
            format!(
                "[policies.{name}]\nalgorithm = \"{algorithm}\"\nlimit = 5\nwindow = \"1m\"\n\n\
                 [[rules]]\npolicy = \"{name}\"\nkey = \"ip\"\n"
            )
        };
        let rules =
            ReloadableRules::from_str(&file("api", "fixed-window"), Format::Toml).expect("valid");
        rules
            .reload_from_str(&file("api-old", "fixed-window"), Format::Toml)
            .expect("a rename loads");
        let error = rules
            .reload_from_str(&file("api", "sliding-log"), Format::Toml)
            .expect_err("fixed-window two reloads ago");
        assert_eq!(error.kind(), ConfigErrorKind::AlgorithmChanged);
        rules
            .reload_from_str(&file("api", "fixed-window"), Format::Toml)
            .expect("the same algorithm again");
    }
}

//! The [`Config`] type: reading a file or a text, and what it holds.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use ratelimit_core::Policy;

use super::matching::ConfiguredRule;
use super::routes::Routes;
use super::{ConfigError, ConfigErrorKind, compile, parse};

/// The syntax of a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// TOML (files ending in `.toml`).
    Toml,
    /// JSON (files ending in `.json`).
    Json,
}

impl Format {
    /// The format a file's extension names (`.toml` or `.json`, in any case).
    ///
    /// ```
    /// use ratelimit_tower::config::Format;
    ///
    /// assert_eq!(Format::from_path("limits/ratelimit.TOML".as_ref()), Some(Format::Toml));
    /// assert_eq!(Format::from_path("ratelimit.yaml".as_ref()), None);
    /// ```
    pub fn from_path(path: &Path) -> Option<Format> {
        let extension = path.extension()?.to_str()?;
        if extension.eq_ignore_ascii_case("toml") {
            Some(Format::Toml)
        } else if extension.eq_ignore_ascii_case("json") {
            Some(Format::Json)
        } else {
            None
        }
    }
}

/// Named policies and the rules that apply them, read from TOML or JSON and
/// checked field by field (see the [module docs](super) for the schema).
///
/// A `Config` is a [`RuleProvider`](crate::RuleProvider) for `http::Request`s: give it to
/// [`RateLimitLayer::with_rules`](crate::RateLimitLayer::with_rules) as it is,
/// or wrap it in [`ReloadableRules`](super::ReloadableRules) to replace it at run time. Cheap to clone.
#[derive(Clone, Default)]
pub struct Config {
    pub(super) inner: Arc<Inner>,
}

/// What a [`Config`] holds: the policies sorted by name, the rules in order.
#[derive(Debug, Default)]
pub(super) struct Inner {
    pub(super) policies: Vec<Policy>,
    pub(super) rules: Vec<ConfiguredRule>,
    /// The route prefixes of every rule with `routes`, read once per
    /// request for all of them.
    pub(super) routes: Routes,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("policies", &self.inner.policies)
            .field("rules", &self.inner.rules)
            .finish()
    }
}

impl Config {
    /// Reads a configuration in `format`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault.
    pub fn parse(text: &str, format: Format) -> Result<Config, ConfigError> {
        let spec = match format {
            Format::Toml => parse::toml(text)?,
            Format::Json => parse::json(text)?,
        };
        compile::compile(spec)
    }

    /// Reads a TOML configuration.
    ///
    /// ```
    /// use ratelimit_tower::config::Config;
    ///
    /// let config = Config::from_toml(r#"
    ///     [policies.login]
    ///     algorithm = "sliding-log"
    ///     limit = 5
    ///     window = "1m"
    /// "#)?;
    /// assert_eq!(config.policy("login").unwrap().limit(), 5);
    ///
    /// let error = Config::from_toml(r#"
    ///     [policies.login]
    ///     algorithm = "sliding-log"
    ///     limit = 5
    ///     window = "a minute"
    /// "#).unwrap_err();
    /// assert_eq!(error.path(), "policies.login.window");
    /// # Ok::<(), ratelimit_tower::config::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Format::Toml)
    }

    /// Reads a JSON configuration.
    ///
    /// ```
    /// use ratelimit_tower::config::Config;
    ///
    /// let error = Config::from_json(r#"{
    ///     "policies": { "api": { "algorithm": "gcra", "limit": 10, "rate": "5/s" } },
    ///     "rules": [ { "policy": "apii", "key": "ip" } ]
    /// }"#).unwrap_err();
    /// assert_eq!(error.to_string(), r#"rules[0].policy: unknown policy "apii" (defined: api)"#);
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field at fault.
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Format::Json)
    }

    /// Reads a configuration file, TOML or JSON by its extension
    /// ([`Format::from_path`]).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the file and the field at fault; when the
    /// file cannot be read, [`ConfigErrorKind::Io`] with the I/O error as its
    /// source.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let format = Format::from_path(path).ok_or_else(|| {
            ConfigError::new(
                ConfigErrorKind::UnknownFormat,
                "",
                "unknown configuration format: name the file *.toml or *.json",
            )
            .in_file(path)
        })?;
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                ConfigErrorKind::Io,
                "",
                format!("cannot read the file: {e}"),
            )
            .with_source(e)
            .in_file(path)
        })?;
        Config::parse(&text, format).map_err(|e| e.in_file(path))
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        let policies = &self.inner.policies;
        let index = policies.binary_search_by(|p| p.name().cmp(name)).ok()?;
        policies.get(index)
    }

    /// Every policy, by name.
    pub fn policies(&self) -> std::slice::Iter<'_, Policy> {
        self.inner.policies.iter()
    }

    /// How many rules there are.
    pub fn rule_count(&self) -> usize {
        self.inner.rules.len()
    }
}

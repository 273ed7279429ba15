//! [`ConfigError`]: what is wrong with a configuration, and where.

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};

/// What kind of problem a [`ConfigError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The file could not be read (its [`io::Error`](std::io::Error) is the source).
    Io,
    /// The file's extension is neither `.toml` nor `.json`.
    UnknownFormat,
    /// The document does not fit the schema: not TOML or JSON, an unknown or
    /// missing field, a value of the wrong type, or a malformed value (a
    /// duration, a rate, a key, a header name, a CIDR block, a method, a route).
    Parse,
    /// A policy's parameters were refused when it was built (its
    /// [`PolicyError`](ratelimit_core::PolicyError) is the source), or an
    /// algorithm lacks the parameter it needs.
    Policy,
    /// A rule does not fit the policies: it names a policy that does not
    /// exist, asks a cost the policy can never admit, settles the cost of a
    /// concurrency policy (or gives a `cost` beside its `settle`), needs
    /// settings that are missing, or keys one policy by two headers (within
    /// the configuration, or, on a reload, against the one in force).
    Rule,
    /// A reload would give an existing policy name another algorithm; state is
    /// stored per policy name, so the new algorithm needs a new name.
    AlgorithmChanged,
    /// A reload would lift limits in force: the new document defines no
    /// rules, fewer rules than are in force, or fewer policies. An empty or
    /// truncated file looks like this, so it is refused unless the reloader
    /// allows it ([`ReloadableRules::allow_dropping_rules`](super::ReloadableRules::allow_dropping_rules)).
    RulesDropped,
    /// The file changed while it was being read (a writer was still at
    /// work): what was read may be half of it, so it was not loaded.
    Changing,
}

/// A configuration that could not be loaded: what is wrong and where.
///
/// The message names the field, as a path into the document:
///
/// ```text
/// policies.api.limit: must be at least 1
/// rules[2].policy: unknown policy "apii" (defined: api, login)
/// ratelimit.toml: policies.api.rate: invalid rate "10/x": ... (line 4, column 8)
/// ```
///
/// [`path`](ConfigError::path) gives the path alone, for programs.
#[derive(Debug)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    file: Option<PathBuf>,
    path: String,
    location: Option<(usize, usize)>,
    message: String,
    source: Option<Box<dyn Error + Send + Sync + 'static>>,
}

impl ConfigError {
    pub(super) fn new(
        kind: ConfigErrorKind,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            kind,
            file: None,
            path: path.into(),
            location: None,
            message: message.into(),
            source: None,
        }
    }

    pub(super) fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub(super) fn at(mut self, location: Option<(usize, usize)>) -> Self {
        self.location = location;
        self
    }

    pub(super) fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_owned());
        self
    }

    /// What kind of problem this is.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The field at fault, as a path into the document: `policies.api.limit`,
    /// `rules[2].policy`, `client_ip.trusted_proxies[0]`. Empty when the
    /// problem is the document as a whole (a syntax error, an unreadable file).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file, for configurations read from one.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The line and column (from 1) where the problem was found, when the
    /// parser knows it.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        self.location
    }

    /// What is wrong, without the file, path or position.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let Some((line, column)) = self.location {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}

impl Error for ConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

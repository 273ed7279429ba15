//! Parsing: TOML or JSON text into the [schema](super::schema), with the path
//! and position of the first error.

use super::schema::ConfigSpec;
use super::{ConfigError, ConfigErrorKind};

/// A TOML configuration, unchecked beyond its schema.
pub(super) fn toml(text: &str) -> Result<ConfigSpec, ConfigError> {
    let parse_error = |path: String, error: toml::de::Error| {
        let location = error.span().and_then(|span| line_column(text, span.start));
        ConfigError::new(ConfigErrorKind::Parse, path, error.message().trim_end())
            .at(location)
            .with_source(error)
    };
    let deserializer =
        toml::Deserializer::parse(text).map_err(|e| parse_error(String::new(), e))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = path_text(e.path());
        parse_error(path, e.into_inner())
    })
}

/// A JSON configuration, unchecked beyond its schema.
pub(super) fn json(text: &str) -> Result<ConfigSpec, ConfigError> {
    let parse_error = |path: String, error: serde_json::Error| {
        let location = (error.line() > 0).then(|| (error.line(), error.column()));
        // serde_json appends the position to its message; it is shown apart.
        let mut message = error.to_string();
        let suffix = format!(" at line {} column {}", error.line(), error.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
        ConfigError::new(ConfigErrorKind::Parse, path, message)
            .at(location)
            .with_source(error)
    };
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let spec = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = path_text(e.path());
        parse_error(path, e.into_inner())
    })?;
    deserializer
        .end()
        .map_err(|e| parse_error(String::new(), e))?;
    Ok(spec)
}

/// `policies.api.limit`, `rules[2].policy`; empty for the document itself.
fn path_text(path: &serde_path_to_error::Path) -> String {
    if path.iter().next().is_none() {
        String::new()
    } else {
        path.to_string()
    }
}

/// The line and column (from 1, in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> Option<(usize, usize)> {
    let before = text.get(..offset)?;
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    Some((line, column))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        assert_eq!(line_column("a\nbc\nd", 3), Some((2, 2)));
        assert_eq!(line_column("é\nx", 0), Some((1, 1)));
        assert_eq!(line_column("ab", 9), None);
    }
}

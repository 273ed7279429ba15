//! Drops from an assembled script the helpers it never calls.
//!
//! A script (`EVALSHA`) creates every top-level `local function` and table
//! of its source again on every call: each costs Redis about 1,000
//! instructions (callgrind), however seldom it runs. The helper files are
//! shared by many scripts (see scripts.rs), so each script holds helpers
//! only others call; pruning removes them, and the comments, once per
//! process. The Functions library, which defines its helpers once per load,
//! is sent as it is.
//!
//! The Lua files keep to a layout this relies on: a top-level helper starts
//! with `local function <name>(` at the start of a line and ends at the
//! first line that is exactly `end`; a top-level table constant is
//! `local <name> = {` and ends at the first line that is exactly `}` (or on
//! its own line). Any other line is kept as it is.

/// One top-level piece of a script: a definition that may be dropped
/// (`name` set) or lines that are always kept.
struct Item<'a> {
    name: Option<&'a str>,
    lines: Vec<&'a str>,
}

/// `source` without its comment lines and without the top-level helpers and
/// table constants that nothing kept refers to.
pub(super) fn prune(source: &str) -> String {
    let items = items(source);
    let mut kept: Vec<bool> = items.iter().map(|item| item.name.is_none()).collect();
    // Keep every definition that kept code names, until nothing changes (a
    // helper's own name in its body does not keep it).
    loop {
        let mut changed = false;
        for (i, item) in items.iter().enumerate() {
            let Some(name) = item.name else { continue };
            if kept[i] {
                continue;
            }
            let used = items.iter().enumerate().any(|(j, other)| {
                j != i && kept[j] && other.lines.iter().any(|line| mentions(line, name))
            });
            if used {
                kept[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut out = String::with_capacity(source.len());
    for (item, keep) in items.iter().zip(kept) {
        if keep {
            for line in &item.lines {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The top-level pieces of `source`, comment lines left out.
fn items(source: &str) -> Vec<Item<'_>> {
    let mut items: Vec<Item<'_>> = Vec::new();
    let mut lines = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"));
    while let Some(line) = lines.next() {
        let (name, last) = match definition(line) {
            Some(found) => found,
            None => {
                match items.last_mut() {
                    Some(Item { name: None, lines }) => lines.push(line),
                    _ => items.push(Item {
                        name: None,
                        lines: vec![line],
                    }),
                }
                continue;
            }
        };
        let mut body = vec![line];
        if let Some(last) = last {
            for next in lines.by_ref() {
                body.push(next);
                if next == last {
                    break;
                }
            }
        }
        items.push(Item {
            name: Some(name),
            lines: body,
        });
    }
    items
}

/// The name a top-level definition starting at `line` defines, and the line
/// that ends it (`None`: the definition is this one line, a helper whose
/// line ends with ` end` or a table closed on it).
fn definition(line: &str) -> Option<(&str, Option<&'static str>)> {
    if let Some(rest) = line.strip_prefix("local function ") {
        let name = rest.split('(').next()?;
        let last = if line.trim_end().ends_with(" end") {
            None
        } else {
            Some("end")
        };
        return is_identifier(name).then_some((name, last));
    }
    let rest = line.strip_prefix("local ")?;
    let (name, value) = rest.split_once(" = ")?;
    if !is_identifier(name) || !value.starts_with('{') {
        return None;
    }
    if value.trim_end().ends_with('}') {
        Some((name, None))
    } else {
        Some((name, Some("}")))
    }
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty() && name.chars().all(is_identifier_char)
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `line` without its trailing comment: up to the first `--` outside a
/// quoted string.
fn code(line: &str) -> &str {
    let mut quote = None;
    let mut previous = None;
    for (at, c) in line.char_indices() {
        match quote {
            Some(q) if c == q && previous != Some('\\') => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '-' && previous == Some('-') => return &line[..at - 1],
            None => {}
        }
        previous = Some(c);
    }
    line
}

/// Whether `line`, its trailing comment aside, holds `name` as a whole
/// identifier.
fn mentions(line: &str, name: &str) -> bool {
    let line = code(line);
    line.match_indices(name).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + name.len()..].chars().next();
        !before.is_some_and(is_identifier_char) && !after.is_some_and(is_identifier_char)
    })
}

#[cfg(test)]
mod tests {
    use super::{code, prune};

    #[test]
    fn a_trailing_comment_is_no_code_but_a_string_is() {
        assert_eq!(code("local n = 1 -- x"), "local n = 1 ");
        assert_eq!(code("local s = '-- x' -- y"), "local s = '-- x' ");
        assert_eq!(code("local s = \"it's --\""), "local s = \"it's --\"");
    }

    #[test]
    fn drops_what_nothing_kept_calls_and_the_comments() {
        let source = "\
-- a comment naming unused
local function used(a)
  return helper(a)
end
local function helper(a)
  -- helper
  return a
end
local function unused(a)
  return used_not(a) + unused(a)
end
local function only_unused_calls_me()
end
local TABLE = {
  x = 1,
}
local ONE_LINE = {}
local KEPT = {}
local n = 1 -- not ONE_LINE
return used(KEPT)
";
        let pruned = prune(source);
        assert_eq!(
            pruned,
            "\
local function used(a)
  return helper(a)
end
local function helper(a)
  return a
end
local KEPT = {}
local n = 1 -- not ONE_LINE
return used(KEPT)
"
        );
    }

    #[test]
    fn a_helper_that_only_a_dropped_helper_calls_is_dropped() {
        let source = "\
local function a()
  return b()
end
local function b() return 1 end
local function c() return 3 end
return c()
";
        assert_eq!(
            prune(source),
            "local function c() return 3 end\nreturn c()\n"
        );
    }
}

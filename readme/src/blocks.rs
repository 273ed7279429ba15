//! Finds the `rust` code blocks of a Markdown file. Shared by the build
//! script (which compiles them) and the tests (which check the README still
//! has them), so both read the README the same way.

/// One fenced code block whose info string starts with `rust`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RustBlock {
    /// The heading (`## ...`) the block is under, without the hashes.
    pub section: String,
    /// The info string after the fence (`rust,no_run`).
    pub info: String,
    /// The code, one line per line of the block, with a final newline.
    pub code: String,
}

impl RustBlock {
    /// Whether the info string has `attribute` (`no_run`, `ignore`).
    pub fn has(&self, attribute: &str) -> bool {
        self.info.split(',').any(|a| a.trim() == attribute)
    }
}

/// Every `rust` block of `markdown`, in order. Blocks fenced with backticks
/// only (the README uses no tildes); an unterminated block is an error.
pub fn rust_blocks(markdown: &str) -> Result<Vec<RustBlock>, String> {
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut open: Option<(String, String, usize)> = None;
    for (number, line) in markdown.lines().enumerate() {
        match &mut open {
            Some((info, code, _)) => {
                if line.trim_start().starts_with("```") {
                    if info.split(',').next().map(str::trim) == Some("rust") {
                        blocks.push(RustBlock {
                            section: section.clone(),
                            info: info.clone(),
                            code: std::mem::take(code),
                        });
                    }
                    open = None;
                } else {
                    code.push_str(line);
                    code.push('\n');
                }
            }
            None => {
                if let Some(info) = line.trim_start().strip_prefix("```") {
                    open = Some((info.trim().to_owned(), String::new(), number + 1));
                } else if let Some(heading) = line.strip_prefix('#') {
                    section = heading.trim_start_matches('#').trim().to_owned();
                }
            }
        }
    }
    match open {
        Some((_, _, line)) => Err(format!(
            "the code block opened on line {line} is never closed"
        )),
        None => Ok(blocks),
    }
}

/// The listen address the Usage block binds, which the test replaces.
pub const USAGE_ADDRESS: &str = "\"127.0.0.1:3000\"";

/// The first `rust` block under `## Usage`: the code a new user pastes.
pub fn usage_block(markdown: &str) -> Result<RustBlock, String> {
    rust_blocks(markdown)?
        .into_iter()
        .find(|b| b.section == "Usage")
        .ok_or_else(|| String::from("README.md has no ```rust block under `## Usage`"))
}

/// The Usage block as the `usage` binary runs it: the same code, with the
/// listen address read from `README_LISTEN` (default `127.0.0.1:3000`), so a
/// test can serve it on a free port. The address literal must appear once.
pub fn usage_program(block: &RustBlock) -> Result<String, String> {
    if block.code.matches(USAGE_ADDRESS).count() != 1 {
        return Err(format!(
            "the Usage block must bind {USAGE_ADDRESS} exactly once (the test serves it on another port)"
        ));
    }
    Ok(block.code.replace(
        USAGE_ADDRESS,
        "&*std::env::var(\"README_LISTEN\").unwrap_or_else(|_| String::from(\"127.0.0.1:3000\"))",
    ))
}

//! Reads README.md at build time: the Usage block becomes the `usage`
//! binary, and every `rust` block becomes a doctest of this crate, so what
//! the README says is what compiles and runs.

use std::fmt::Write as _;
use std::path::PathBuf;

// Public in the library (the tests use it), private here.
#[allow(unreachable_pub)]
#[path = "src/blocks.rs"]
mod blocks;

/// A block that names one of these needs the feature of this package.
const NEEDS_FEATURE: &[(&str, &str)] = &[
    ("cluster_builder", "redis-cluster"),
    ("sentinel_builder", "sentinel"),
    ("RedisStore", "redis"),
];

fn main() {
    if let Err(message) = run() {
        // A README that lost its Usage block, or a block that cannot be
        // compiled, fails the build with the reason.
        eprintln!("error: README.md: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let readme = manifest.join("../README.md");
    println!("cargo:rerun-if-changed={}", readme.display());
    println!("cargo:rerun-if-changed=src/blocks.rs");
    let markdown =
        std::fs::read_to_string(&readme).map_err(|e| format!("{}: {e}", readme.display()))?;

    let usage = blocks::usage_block(&markdown)?;
    write(&out.join("usage.rs"), &blocks::usage_program(&usage)?)?;

    let mut doctests = String::new();
    for (index, block) in blocks::rust_blocks(&markdown)?.iter().enumerate() {
        if block.has("ignore") {
            return Err(format!(
                "the rust block {} under `{}` is `ignore`: every README block must compile (use `no_run`)",
                index + 1,
                block.section
            ));
        }
        let file = format!("block_{}.md", index + 1);
        write(
            &out.join(&file),
            &format!("```{}\n{}```\n", block.info, block.code),
        )?;
        let feature = NEEDS_FEATURE
            .iter()
            .find(|(name, _)| block.code.contains(name))
            .map(|(_, feature)| *feature);
        if let Some(feature) = feature {
            let _ = writeln!(doctests, "#[cfg(feature = {feature:?})]");
        }
        let _ = writeln!(
            doctests,
            "#[doc = include_str!(concat!(env!(\"OUT_DIR\"), \"/{file}\"))]\npub mod block_{} {{}}",
            index + 1
        );
    }
    write(&out.join("doctests.rs"), &doctests)
}

fn write(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

//! A check that the Lua the store sends keeps no state between calls.
//!
//! The Functions library is loaded once per Redis and shared by every
//! client of it: a chunk-level local that a function assigns at call time
//! (or a chunk-level table it writes into) outlives the call, hidden global
//! mutable state. Chunk-level names must be constants or functions, set
//! while the chunk runs; what a call needs goes in a table of its own,
//! passed to the helpers (`new_call`, prelude.lua). A script's chunk runs on
//! every call, but the scripts share their helpers with the library, so they
//! are held to the same rule.
//!
//! The check reads the assembled sources with a small Lua scanner: comments
//! and strings are skipped, blocks and local scopes tracked, and every
//! assignment inside a function whose target is a chunk-level local (or one
//! of its fields), or a global, is reported, as is a chunk-level table handed
//! to `table.insert`, `table.remove`, `table.sort` or `rawset` there. A table
//! written through another name (a parameter it was passed as) is not seen.

/// One token: its text, whether it is a name (not a keyword), and its line.
#[derive(Debug)]
struct Token<'a> {
    text: &'a str,
    name: bool,
    line: usize,
}

const KEYWORDS: [&str; 21] = [
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// The level of the long bracket `[=*[` at `at`, if one starts there.
fn long_bracket(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    let mut level = 0;
    while bytes.get(at + 1 + level) == Some(&b'=') {
        level += 1;
    }
    (bytes.get(at + 1 + level) == Some(&b'[')).then_some(level)
}

/// The index just past the long bracket of `level` opened before `from`.
fn long_end(source: &str, from: usize, level: usize) -> usize {
    let close = format!("]{}]", "=".repeat(level));
    source[from..]
        .find(&close)
        .map_or(source.len(), |at| from + at + close.len())
}

/// The tokens of `source`, comments and strings left out (a string is one
/// token `"` so that it still separates what is around it).
fn tokens(source: &str) -> Vec<Token<'_>> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines =
        |from: usize, to: usize| bytes[from..to].iter().filter(|&&b| b == b'\n').count();
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if bytes[i..].starts_with(b"--") {
            i = match long_bracket(bytes, i + 2) {
                Some(level) => long_end(source, i + 4 + level, level),
                None => source[i..].find('\n').map_or(source.len(), |at| i + at),
            };
            line += count_lines(start, i);
        } else if let Some(level) = long_bracket(bytes, i) {
            i = long_end(source, i + 2 + level, level);
            line += count_lines(start, i);
            out.push(Token {
                text: "\"",
                name: false,
                line,
            });
        } else if c == b'\'' || c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
            line += count_lines(start, i);
            out.push(Token {
                text: "\"",
                name: false,
                line,
            });
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let text = &source[start..i];
            out.push(Token {
                text,
                name: !KEYWORDS.contains(&text),
                line,
            });
        } else if c.is_ascii_digit()
            || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                let exponent = matches!(bytes[i], b'e' | b'E');
                i += 1;
                if exponent && matches!(bytes.get(i), Some(b'+' | b'-')) {
                    i += 1;
                }
            }
            out.push(Token {
                text: "0",
                name: false,
                line,
            });
        } else {
            let len = ["...", "..", "==", "~=", "<=", ">="]
                .iter()
                .find(|s| bytes[i..].starts_with(s.as_bytes()))
                .map_or(1, |s| s.len());
            i += len;
            out.push(Token {
                text: &source[start..i],
                name: false,
                line,
            });
        }
    }
    out
}

/// What a `(`, `[`, `{` or a block keyword opened.
#[derive(Debug, PartialEq)]
enum Frame {
    Bracket(u8),
    Function,
    Block,
}

/// The locals of one block, and whether they are chunk-level (declared
/// outside every function).
struct Scope<'a> {
    names: Vec<&'a str>,
    chunk: bool,
}

struct Scanner<'a> {
    tokens: Vec<Token<'a>>,
    frames: Vec<Frame>,
    scopes: Vec<Scope<'a>>,
    functions: usize,
    /// The variables of a `for` loop, until its `do`.
    looping: Vec<&'a str>,
    found: Vec<String>,
}

impl<'a> Scanner<'a> {
    fn text(&self, i: usize) -> &'a str {
        self.tokens.get(i).map_or("", |t| t.text)
    }

    fn is_name(&self, i: usize) -> bool {
        self.tokens.get(i).is_some_and(|t| t.name)
    }

    fn declare(&mut self, name: &'a str) {
        let chunk = self.functions == 0;
        match self.scopes.last_mut() {
            Some(scope) => scope.names.push(name),
            None => self.scopes.push(Scope {
                names: vec![name],
                chunk,
            }),
        }
    }

    fn open(&mut self, frame: Frame) {
        if frame == Frame::Function {
            self.functions += 1;
        }
        let chunk = self.functions == 0;
        self.frames.push(frame);
        self.scopes.push(Scope {
            names: Vec::new(),
            chunk,
        });
    }

    /// Closes the innermost block (`end`, `until`), and any bracket left
    /// open inside it.
    fn close(&mut self, line: usize) {
        if !self
            .frames
            .iter()
            .any(|frame| !matches!(frame, Frame::Bracket(_)))
        {
            self.found
                .push(format!("line {line}: an `end` or `until` closes nothing"));
            return;
        }
        while let Some(frame) = self.frames.pop() {
            match frame {
                Frame::Bracket(_) => {}
                Frame::Function => {
                    self.functions -= 1;
                    self.scopes.pop();
                    return;
                }
                Frame::Block => {
                    self.scopes.pop();
                    return;
                }
            }
        }
    }

    /// Whether `name` is a chunk-level local (`Some(true)`), a local of a
    /// function (`Some(false)`) or a global (`None`) where it is used.
    fn resolve(&self, name: &str) -> Option<bool> {
        self.scopes
            .iter()
            .rev()
            .find(|scope| scope.names.contains(&name))
            .map(|scope| scope.chunk)
    }

    /// Reports a write at token `at` to the root name there, inside a
    /// function, when that name is chunk-level or global.
    fn write(&mut self, at: usize, what: &str) {
        if self.functions == 0 {
            return;
        }
        let name = self.text(at);
        let whose = match self.resolve(name) {
            Some(false) => return,
            Some(true) => "chunk-level",
            None => "global",
        };
        let line = self.tokens[at].line;
        self.found
            .push(format!("line {line}: a function {what} {whose} `{name}`"));
    }

    /// The assignment targets that end just before `=` at `eq`: the token
    /// of each one's root name, and whether it is indexed (a field).
    fn targets(&self, eq: usize) -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        let mut j = eq;
        'targets: loop {
            let mut field = false;
            loop {
                let Some(k) = j.checked_sub(1) else {
                    break 'targets;
                };
                match self.text(k) {
                    "]" => {
                        // Back to the matching `[`.
                        let mut depth = 0usize;
                        let mut m = k;
                        loop {
                            match self.text(m) {
                                "]" => depth += 1,
                                "[" => depth -= 1,
                                _ => {}
                            }
                            if depth == 0 || m == 0 {
                                break;
                            }
                            m -= 1;
                        }
                        j = m;
                        field = true;
                    }
                    _ if self.is_name(k) => {
                        if k > 0 && self.text(k - 1) == "." {
                            j = k - 1;
                            field = true;
                        } else {
                            out.push((k, field));
                            j = k;
                            break;
                        }
                    }
                    _ => break 'targets,
                }
            }
            if j > 0 && self.text(j - 1) == "," {
                j -= 1;
            } else {
                break;
            }
        }
        out.reverse();
        out
    }

    fn scan(mut self) -> Vec<String> {
        let mut i = 0;
        while i < self.tokens.len() {
            let text = self.text(i);
            match text {
                "local" if self.text(i + 1) == "function" => {
                    let name = self.text(i + 2);
                    self.declare(name);
                    i += 1;
                    continue;
                }
                "local" => {
                    i += 1;
                    while self.is_name(i) {
                        let name = self.text(i);
                        self.declare(name);
                        i += if self.text(i + 1) == "," { 2 } else { 1 };
                    }
                    if self.text(i) == "=" {
                        i += 1;
                    }
                    continue;
                }
                "function" => {
                    let declared = self.text(i.wrapping_sub(1)) == "local";
                    let mut k = i + 1;
                    if self.is_name(k) && !declared {
                        // `function name()` assigns `name` (or a field of it).
                        let field = matches!(self.text(k + 1), "." | ":");
                        let what = if field {
                            "writes a field of"
                        } else {
                            "assigns"
                        };
                        self.write(k, what);
                    }
                    let method = (k..)
                        .take_while(|&m| self.is_name(m) || matches!(self.text(m), "." | ":"))
                        .any(|m| self.text(m) == ":");
                    while self.is_name(k) || matches!(self.text(k), "." | ":") {
                        k += 1;
                    }
                    self.open(Frame::Function);
                    if method {
                        self.declare("self");
                    }
                    // The parameters.
                    k += 1;
                    while self.text(k) != ")" && k < self.tokens.len() {
                        if self.is_name(k) {
                            let name = self.text(k);
                            self.declare(name);
                        }
                        k += 1;
                    }
                    i = k + 1;
                    continue;
                }
                "for" => {
                    // The loop's variables belong to its `do` block.
                    i += 1;
                    while self.is_name(i) || self.text(i) == "," {
                        if self.is_name(i) {
                            let name = self.text(i);
                            self.looping.push(name);
                        }
                        i += 1;
                    }
                }
                "do" => {
                    self.open(Frame::Block);
                    for name in std::mem::take(&mut self.looping) {
                        self.declare(name);
                    }
                }
                "if" | "repeat" => self.open(Frame::Block),
                "else" | "elseif" => {
                    // A new branch: the locals of the one before end.
                    if let Some(scope) = self.scopes.last_mut() {
                        scope.names.clear();
                    }
                }
                "end" | "until" => self.close(self.tokens[i].line),
                "(" | "[" | "{" => self.frames.push(Frame::Bracket(text.as_bytes()[0])),
                ")" | "]" | "}" => {
                    if matches!(self.frames.last(), Some(Frame::Bracket(_))) {
                        self.frames.pop();
                    }
                }
                "=" if self.frames.last() != Some(&Frame::Bracket(b'{')) => {
                    for (at, field) in self.targets(i) {
                        let what = if field {
                            "writes a field of"
                        } else {
                            "assigns"
                        };
                        self.write(at, what);
                    }
                }
                "insert" | "remove" | "sort"
                    if self.text(i.wrapping_sub(1)) == "."
                        && self.text(i.wrapping_sub(2)) == "table" =>
                {
                    self.table_argument(i + 1);
                }
                "rawset" => self.table_argument(i + 1),
                _ => {}
            }
            i += 1;
        }
        // A scan that lost its way (a block it misread) could miss a write.
        if !self.frames.is_empty() {
            let open = self.frames.len();
            self.found.push(format!(
                "the end of the source leaves {open} blocks or brackets open"
            ));
        }
        self.found
    }

    /// Reports the table passed first to the call whose `(` is at `paren`.
    fn table_argument(&mut self, paren: usize) {
        if self.text(paren) == "("
            && self.is_name(paren + 1)
            && matches!(self.text(paren + 2), "," | ")")
        {
            self.write(paren + 1, "writes into");
        }
    }
}

/// The writes inside functions to chunk-level locals, their fields, or
/// globals, in `source`: one line each, empty when there is none.
pub(super) fn call_time_writes(source: &str) -> Vec<String> {
    let scanner = Scanner {
        tokens: tokens(source),
        frames: Vec::new(),
        scopes: vec![Scope {
            names: Vec::new(),
            chunk: true,
        }],
        functions: 0,
        looping: Vec::new(),
        found: Vec::new(),
    };
    scanner.scan()
}

#[cfg(test)]
mod tests {
    use super::call_time_writes;
    use crate::redis::scripts;

    /// The prelude's former time of the call, set by each entry point.
    const FIXED_NOW: &str = r"
local FIXED_NOW = 0
local function server_now()
  if FIXED_NOW > 0 then return FIXED_NOW end
  return 1
end
local function run_single(keys, args)
  FIXED_NOW = tonumber(args[4]) or 0
  return server_now()
end
";

    /// The fixed window's former memo, kept across calls.
    const MEMO: &str = r"
local FW_START, FW_PREFIX = -1, '\0'
local COUNT_TEXT = {}
local function fixed_window_text(start, count)
  if start ~= FW_START then
    FW_START, FW_PREFIX = start, 'f' .. start .. ' '
  end
  local text = COUNT_TEXT[count]
  if not text then
    text = tostring(count)
    COUNT_TEXT[count] = text
  end
  return FW_PREFIX .. text
end
";

    #[test]
    fn finds_the_call_time_writes_of_chunk_level_state() {
        let found = call_time_writes(FIXED_NOW);
        assert_eq!(
            found,
            ["line 8: a function assigns chunk-level `FIXED_NOW`"]
        );
        let found = call_time_writes(MEMO);
        assert_eq!(
            found,
            [
                "line 6: a function assigns chunk-level `FW_START`",
                "line 6: a function assigns chunk-level `FW_PREFIX`",
                "line 11: a function writes a field of chunk-level `COUNT_TEXT`",
            ]
        );
        let source = "local T = {}\nlocal function f(x)\n  table.insert(T, x)\n  rawset(T, 1, x)\n  g = x\n  T.n, T[2] = 1, 2\nend\n";
        assert_eq!(
            call_time_writes(source),
            [
                "line 3: a function writes into chunk-level `T`",
                "line 4: a function writes into chunk-level `T`",
                "line 5: a function assigns global `g`",
                "line 6: a function writes a field of chunk-level `T`",
                "line 6: a function writes a field of chunk-level `T`",
            ]
        );
        let nested = "local N = 0\nlocal t = {f = function() N = 1 end}\nfor i = 1, 2 do\n  local h = function()\n    if i then N = i end\n  end\nend\n";
        assert_eq!(
            call_time_writes(nested),
            [
                "line 2: a function assigns chunk-level `N`",
                "line 5: a function assigns chunk-level `N`",
            ]
        );
    }

    #[test]
    fn a_source_it_cannot_follow_fails() {
        assert_eq!(
            call_time_writes("local function f()\nend\nend\n"),
            ["line 3: an `end` or `until` closes nothing"]
        );
        assert_eq!(
            call_time_writes("local function f()\n  if x then\nend\n"),
            ["the end of the source leaves 1 blocks or brackets open"]
        );
    }

    #[test]
    fn leaves_alone_what_a_call_owns() {
        // Chunk-level writes at load, a parameter or local that shadows a
        // chunk-level name, a per-call table's fields, table constructors,
        // comparisons, and names inside comments and strings.
        let source = r#"
local ALGORITHMS = {}
local number
number = tonumber
ALGORITHMS['x'] = function(call, key)
  local out = {fixed = 1, one_key = true}
  call.block_end = 0
  if call.fixed == 0 then out.n = 1 end
  for k, v in ipairs(out) do k = v end
  local number = 2
  number = 3
  -- ALGORITHMS = nil
  local s = "ALGORITHMS = nil" .. [[
  ALGORITHMS = nil]]
  --[==[ ALGORITHMS = nil ]==]
  return out
end
local function g(ALGORITHMS)
  ALGORITHMS = 1
  repeat local r = 1; r = 2 until r
end
"#;
        assert_eq!(call_time_writes(source), Vec::<String>::new());
    }

    #[test]
    fn no_lua_keeps_state_between_calls() {
        let mut sources = scripts::every_source();
        sources.extend(multi_region_sources());
        let mut failures = Vec::new();
        for (name, source) in sources {
            for found in call_time_writes(&source) {
                failures.push(format!("{name}, {found}"));
            }
        }
        assert!(
            failures.is_empty(),
            "state kept between calls:\n{}",
            failures.join("\n")
        );
    }

    /// The multi-region scripts, each after the helpers it is sent with
    /// (multi_region::peer::script).
    fn multi_region_sources() -> Vec<(&'static str, String)> {
        let helpers = concat!(
            include_str!("lua/numbers.lua"),
            "\n",
            include_str!("../multi_region/lua/fields.lua"),
            "\n"
        );
        [
            ("cursor.lua", include_str!("../multi_region/lua/cursor.lua")),
            ("decide.lua", include_str!("../multi_region/lua/decide.lua")),
            ("heard.lua", include_str!("../multi_region/lua/heard.lua")),
            ("mark.lua", include_str!("../multi_region/lua/mark.lua")),
            ("merge.lua", include_str!("../multi_region/lua/merge.lua")),
            ("outbox.lua", include_str!("../multi_region/lua/outbox.lua")),
        ]
        .into_iter()
        .map(|(name, body)| (name, format!("{helpers}{body}")))
        .collect()
    }
}

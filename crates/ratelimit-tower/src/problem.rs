//! `application/problem+json` bodies (RFC 9457) for refusals.

use std::fmt::Write as _;

use crate::rejection::{Rejection, retry_after_seconds};

/// The problem type of a request over its quota, registered by
/// draft-ietf-httpapi-ratelimit-headers.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The media type of the body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The problem details of a refusal, as a JSON object:
///
/// ```json
/// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
///  "title":"Request cannot be satisfied as assigned quota has been exceeded",
///  "status":429,
///  "detail":"Quota exceeded for policy per-ip (5 per 10 s); retry in 7 s.",
///  "violated-policies":["per-ip"],
///  "retry-after":7}
/// ```
///
/// Only enforced policies are violated: a shadow policy that denied too is
/// not named.
///
/// Refusals that are not a quota (a cost that can never pass, a missing key,
/// an unavailable limiter) use `about:blank` with their status.
pub fn problem_json(rejection: &Rejection) -> String {
    let mut out = String::with_capacity(320);
    match rejection {
        Rejection::Limited(decisions) => {
            let violated: Vec<_> = decisions.iter().filter(|e| e.refuses()).collect();
            let retry = retry_after_seconds(rejection.retry_after_micros().unwrap_or(0));
            let mut detail = String::from("Quota exceeded for policy ");
            for (i, e) in violated.iter().enumerate() {
                if i > 0 {
                    detail.push_str(", ");
                }
                let p = e.policy();
                let _ = write!(
                    detail,
                    "{} ({} per {} s)",
                    p.name(),
                    p.limit(),
                    p.window().as_micros().div_ceil(1_000_000)
                );
            }
            let _ = write!(detail, "; retry in {retry} s.");
            out.push_str("{\"type\":");
            string(&mut out, QUOTA_EXCEEDED);
            out.push_str(",\"title\":");
            string(
                &mut out,
                "Request cannot be satisfied as assigned quota has been exceeded",
            );
            out.push_str(",\"status\":429,\"detail\":");
            string(&mut out, &detail);
            out.push_str(",\"violated-policies\":[");
            for (i, e) in violated.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(&mut out, e.policy().name());
            }
            let _ = write!(out, "],\"retry-after\":{retry}}}");
        }
        other => {
            let (status, title) = match other {
                Rejection::Unavailable(_) => (503, "Service Unavailable"),
                Rejection::Internal(_) => (500, "Internal Server Error"),
                Rejection::NoPeerAddress => (500, "Internal Server Error"),
                _ => (429, "Too Many Requests"),
            };
            out.push_str("{\"type\":\"about:blank\",\"title\":");
            string(&mut out, title);
            let _ = write!(out, ",\"status\":{status},\"detail\":");
            string(&mut out, &other.public_detail());
            out.push('}');
        }
    }
    out
}

/// Appends `text` as a JSON string.
fn string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::string;

    #[test]
    fn escapes_json_strings() {
        let mut out = String::new();
        string(&mut out, "a\"b\\c\nd");
        assert_eq!(out, r#""a\"b\\c\u000ad""#);
    }
}

//! `application/problem+json` bodies (RFC 9457) for refusals.

use serde::Serialize;

use crate::responses::headers::window_seconds;
use crate::responses::rejection::{Rejection, retry_after_seconds};

/// The problem type of a request over its quota, registered by
/// draft-ietf-httpapi-ratelimit-headers.
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The media type of the body.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

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
pub(crate) fn problem_json(rejection: &Rejection) -> String {
    let problem = match rejection {
        Rejection::Limited(decisions) => {
            let violated: Vec<_> = decisions.iter().filter(|e| e.refuses()).collect();
            let retry = retry_after_seconds(rejection.retry_after_micros().unwrap_or(0));
            let named: Vec<String> = violated
                .iter()
                .map(|e| {
                    let p = e.policy();
                    format!("{} ({} per {} s)", p.name(), p.limit(), window_seconds(p))
                })
                .collect();
            let detail = format!(
                "Quota exceeded for policy {}; retry in {retry} s.",
                named.join(", ")
            );
            Problem {
                kind: QUOTA_EXCEEDED,
                title: "Request cannot be satisfied as assigned quota has been exceeded",
                status: 429,
                detail,
                violated_policies: Some(violated.iter().map(|e| e.policy().name()).collect()),
                retry_after: Some(retry),
            }
        }
        other => {
            let (status, title) = match other {
                Rejection::Unavailable(_) => (503, "Service Unavailable"),
                Rejection::Internal(_) => (500, "Internal Server Error"),
                Rejection::NoPeerAddress => (500, "Internal Server Error"),
                _ => (429, "Too Many Requests"),
            };
            Problem {
                kind: "about:blank",
                title,
                status,
                detail: other.public_detail(),
                violated_policies: None,
                retry_after: None,
            }
        }
    };
    // Serializing strings, numbers and a list of strings to a String cannot
    // fail; an empty object would still be valid problem+json.
    serde_json::to_string(&problem).unwrap_or_else(|_| String::from("{}"))
}

/// The members of a problem+json object, in the order RFC 9457 shows them.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none")]
    violated_policies: Option<Vec<&'a str>>,
    #[serde(rename = "retry-after", skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_names_each_violated_policy_with_its_window() {
        use crate::decisions::{Decisions, PolicyDecision};
        use ratelimit_core::{Decision, Policy};
        use std::time::Duration;

        let policy = |name: &str, limit, secs| {
            Policy::fixed_window(limit, Duration::from_secs(secs))
                .and_then(|p| p.with_name(name))
                .expect("a valid policy")
        };
        let rejection = Rejection::Limited(Decisions::new(vec![
            PolicyDecision::new(
                policy("per-ip", 5, 10),
                Decision::deny(5, 0, 7_000_000, 6_500_000),
            ),
            PolicyDecision::new(policy("calm", 9, 60), Decision::allow(9, 3, 1_000_000)),
            PolicyDecision::new(
                policy("daily", 100, 86_400),
                Decision::deny(100, 0, 9, 2_000_000),
            ),
        ]));
        let body: serde_json::Value =
            serde_json::from_str(&problem_json(&rejection)).expect("JSON");
        assert_eq!(
            body["detail"],
            "Quota exceeded for policy per-ip (5 per 10 s), daily (100 per 86400 s); retry in 7 s."
        );
        assert_eq!(
            body["violated-policies"],
            serde_json::json!(["per-ip", "daily"])
        );
        assert_eq!(body["retry-after"], 7);
    }

    #[test]
    fn other_refusals_are_about_blank_with_the_detail_escaped() {
        let rejection = Rejection::CostTooHigh {
            policy: String::from("a\"b\\c\nd"),
            cost: 9,
            max: 5,
        };
        assert_eq!(
            problem_json(&rejection),
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"request cost 9 exceeds what policy a\"b\\c\nd can ever admit (5)"}"#
        );
    }
}

//! Requests to the examples' servers over loopback, with `reqwest`.

use std::time::Duration;

/// How long one request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The header the examples key requests by.
pub const API_KEY_HEADER: &str = "x-api-key";

/// An HTTP client whose requests time out after [`REQUEST_TIMEOUT`].
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("an HTTP client")
}

/// One answer: status, `Retry-After` in seconds (when present), body.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// `Retry-After`, which must be in delay-seconds when present.
    pub retry_after: Option<u64>,
    /// The body, or empty when it could not be read.
    pub body: String,
}

/// `GET url` with `x-api-key: api_key`.
pub async fn get(client: &reqwest::Client, url: &str, api_key: &str) -> Answer {
    send(client.get(url).header(API_KEY_HEADER, api_key), url).await
}

/// The statuses of `n` `GET url` with `x-api-key: api_key`, one after the
/// other.
pub async fn statuses(client: &reqwest::Client, url: &str, api_key: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(get(client, url, api_key).await.status);
    }
    statuses
}

/// `GET url` without `x-api-key`: keyed by the client IP, `127.0.0.1`.
pub async fn get_by_ip(client: &reqwest::Client, url: &str) -> Answer {
    send(client.get(url), url).await
}

/// Sends `request` (to `url`, named when it fails) and reads its answer.
pub async fn send(request: reqwest::RequestBuilder, url: &str) -> Answer {
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| {
        v.to_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("Retry-After in delay-seconds, not {v:?}"))
    });
    let body = response.text().await.unwrap_or_default();
    Answer {
        status,
        retry_after,
        body,
    }
}

/// A response read whole: status, headers and body, for tests that check
/// headers byte for byte.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Every header field as sent.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub body: String,
}

impl Reply {
    /// Sends `request` and reads its response whole.
    pub async fn read(request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("request");
        Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.expect("body"),
        }
    }

    /// The single value of the header `name`, if any; a field sent twice
    /// fails the test.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut values = self.headers.get_all(name).iter();
        let value = values.next()?;
        assert!(values.next().is_none(), "{name} sent twice: {self:?}");
        Some(value.to_str().expect("visible ASCII header"))
    }
}

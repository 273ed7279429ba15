//! Redis Sentinel (feature `sentinel`): the store decides on the master the
//! sentinels name, through redis-rs's `SentinelClient`, and asks them again
//! whenever that master may have changed.
//!
//! A [`Master`] holds the master last named and an epoch that changes each
//! time the sentinels name another node. Connections remember the epoch they
//! were opened in (see `connections`), so once the master changes, every
//! connection to the old one is dropped before its next use. The master
//! becomes *suspect* after anything that may mean a failover: a connection
//! that broke or timed out, a write refused by a read-only replica
//! (`READONLY`: a master demoted under the store), a connection that could
//! not be opened. The next call then asks the sentinels first (one lookup
//! at a time, shared by the calls that wait for it, run in a task of its
//! own so that it completes for the calls that follow one that timed out;
//! a lookup asks every sentinel at once). While no sentinel names a master
//! that answers as one, calls fail as an outage and the failure policy
//! decides. The sentinels' failover events (`events`) make the master
//! suspect too, and stop every decision while a failover is under way.

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::StoreError;

mod events;
mod master;

pub(super) use events::{keep_watching, watch};
pub(super) use master::Master;

/// The port of a sentinel whose address gives none.
pub(crate) const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// What [`RedisStore::sentinel_builder`](super::RedisStore::sentinel_builder)
/// was given.
#[derive(Clone, Default)]
pub(super) struct Settings {
    /// The sentinels' addresses, as given.
    pub(super) sentinels: Vec<String>,
    /// The name the sentinels monitor the master under.
    pub(super) master_name: String,
}

/// How to reach the master: the builder's `master_*` options.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct MasterOptions {
    /// Log-in to the master: user name and password.
    pub(super) credentials: Option<(String, String)>,
    /// The master's database.
    pub(super) db: i64,
    /// TLS to the master (feature `tls`).
    pub(super) tls: bool,
}

impl std::fmt::Debug for MasterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterOptions")
            .field("user", &self.credentials.as_ref().map(|(user, _)| user))
            .field("db", &self.db)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The sentinels' addresses as `redis://` or `rediss://` URLs, each with
    /// a port (26379 where it gave none), or an error
    /// naming the first that is not an address.
    pub(super) fn urls(&self, master: &MasterOptions) -> Result<Vec<String>, StoreError> {
        if self.sentinels.is_empty() {
            return Err(config_error(
                "sentinel_builder needs the address of at least one sentinel".into(),
            ));
        }
        if self.master_name.trim().is_empty() {
            return Err(config_error(
                "sentinel_builder needs the master's name, as the sentinels monitor it \
                 (`sentinel monitor <name> ...`)"
                    .into(),
            ));
        }
        if master.db < 0 {
            return Err(config_error(format!(
                "master_db({}): a database is a number from 0",
                master.db
            )));
        }
        self.sentinels
            .iter()
            .map(|text| sentinel_url(text))
            .collect()
    }

    /// A `SentinelClient` of each sentinel at `urls` (as [`urls`](Self::urls)
    /// gave them) for the master named `master_name`, logging in to the
    /// sentinels as their URLs say and to the master as the `master_*`
    /// options say; over TLS, trusting `root_cert` (PEM) when given. One
    /// client per sentinel: the store asks them all at once (see
    /// [`Master`]), where one client of them all asks them in turn, and
    /// waits for a sentinel that hangs before it asks the next.
    pub(super) fn clients(
        &self,
        master: &MasterOptions,
        urls: &[String],
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] root_cert: Option<&[u8]>,
    ) -> Result<Vec<SentinelClient>, StoreError> {
        let mut addresses = Vec::with_capacity(urls.len());
        let mut login: Option<(Option<String>, Option<String>)> = None;
        for url in urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| config_error(format!("sentinel {}: {e}", redacted(url))))?;
            let settings = info.redis_settings();
            if settings.db() != 0 {
                return Err(config_error(format!(
                    "sentinel {}: a sentinel has no database; give the master's with master_db()",
                    redacted(url)
                )));
            }
            let this = (
                settings.username().map(str::to_owned),
                settings.password().map(str::to_owned),
            );
            match &login {
                None => login = Some(this),
                Some(first) if *first != this => {
                    return Err(config_error(
                        "the sentinels' URLs give different credentials; every sentinel is \
                         logged in to with the same user and password"
                            .into(),
                    ));
                }
                Some(_) => {}
            }
            addresses.push(info.addr().clone());
        }
        let tls_sentinels = addresses
            .iter()
            .filter(|a| matches!(a, ConnectionAddr::TcpTls { .. }))
            .count();
        #[cfg(feature = "tls")]
        if root_cert.is_some() && tls_sentinels > 0 && tls_sentinels < addresses.len() {
            return Err(config_error(
                "some sentinels are rediss:// URLs and some are not: with tls_root_cert, \
                 give every sentinel over TLS, or none"
                    .into(),
            ));
        }
        #[cfg(not(feature = "tls"))]
        if master.tls || tls_sentinels > 0 {
            return Err(config_error(
                "TLS to the sentinels or the master needs the `tls` feature".into(),
            ));
        }
        let login = login.unwrap_or_default();
        addresses
            .into_iter()
            .map(|address| {
                let tls = matches!(address, ConnectionAddr::TcpTls { .. });
                let mut builder = SentinelClientBuilder::new(
                    [address],
                    &self.master_name,
                    SentinelServerType::Master,
                )
                .map_err(super::backend_error)?;
                if let Some(username) = &login.0 {
                    builder = builder.set_client_to_sentinel_username(username);
                }
                if let Some(password) = &login.1 {
                    builder = builder.set_client_to_sentinel_password(password);
                }
                if let Some((username, password)) = &master.credentials {
                    builder = builder
                        .set_client_to_redis_username(username)
                        .set_client_to_redis_password(password);
                }
                if master.db != 0 {
                    builder = builder.set_client_to_redis_db(master.db);
                }
                #[cfg(feature = "tls")]
                {
                    if master.tls {
                        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
                        if let Some(pem) = root_cert {
                            builder = builder.set_client_to_redis_certificates(
                                super::builder::trusting(pem.to_vec()),
                            );
                        }
                    }
                    if let Some(pem) = root_cert.filter(|_| tls) {
                        builder = builder.set_client_to_sentinel_certificates(
                            super::builder::trusting(pem.to_vec()),
                        );
                    }
                }
                #[cfg(not(feature = "tls"))]
                let _ = tls;
                builder.build().map_err(super::backend_error)
            })
            .collect()
    }
}

impl Settings {
    /// A client of each sentinel at `urls` (as [`urls`](Self::urls) gave
    /// them), for its events; over TLS trusting `root_cert` when given.
    pub(super) fn sentinel_clients(
        urls: &[String],
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))] root_cert: Option<&[u8]>,
    ) -> Result<Vec<redis::Client>, StoreError> {
        urls.iter()
            .map(|url| {
                #[cfg(feature = "tls")]
                if let Some(pem) = root_cert.filter(|_| url.starts_with("rediss://")) {
                    return super::builder::client_trusting(url.as_str(), Some(pem.to_vec()));
                }
                redis::Client::open(url.as_str())
            })
            .collect::<Result<_, _>>()
            .map_err(|e| config_error(format!("a sentinel's address: {e}")))
    }
}

/// `text` (`host:port`, `host`, or a `redis://`/`rediss://` URL) as a URL
/// with a port.
fn sentinel_url(text: &str) -> Result<String, StoreError> {
    let text = text.trim();
    let url = if text.contains("://") {
        text.to_owned()
    } else {
        format!("redis://{text}")
    };
    let not_an_address = || {
        config_error(format!(
            "sentinel {:?} is not an address: give host:port or a redis:// or rediss:// URL",
            redacted(text)
        ))
    };
    let mut parsed = redis::parse_redis_url(&url).ok_or_else(not_an_address)?;
    if matches!(parsed.scheme(), "redis" | "rediss") {
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(not_an_address());
        }
        if parsed.port().is_none() {
            parsed
                .set_port(Some(DEFAULT_SENTINEL_PORT))
                .map_err(|()| not_an_address())?;
        }
    }
    Ok(parsed.as_str().to_owned())
}

/// `text` without the password a URL may hold, for an error message.
fn redacted(text: &str) -> String {
    match (text.find("://"), text.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &text[..scheme], &text[at + 1..])
        }
        _ => text.to_owned(),
    }
}

fn config_error(message: String) -> StoreError {
    StoreError::Backend(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_the_sentinel_port_when_it_gives_none() {
        assert_eq!(sentinel_url("10.0.0.1").unwrap(), "redis://10.0.0.1:26379");
        assert_eq!(
            sentinel_url("10.0.0.1:5000").unwrap(),
            "redis://10.0.0.1:5000"
        );
        assert_eq!(
            sentinel_url("redis://u:p@sentinel-a").unwrap(),
            "redis://u:p@sentinel-a:26379"
        );
        assert_eq!(
            sentinel_url("rediss://sentinel-a:26380").unwrap(),
            "rediss://sentinel-a:26380"
        );
        for bad in ["", "http://x:1", "redis://", ":26379", "a b:1"] {
            assert!(sentinel_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_error_never_shows_a_password() {
        assert_eq!(redacted("redis://user:secret@host:1"), "redis://***@host:1");
        assert_eq!(redacted("host:1"), "host:1");
        let settings = Settings {
            sentinels: vec!["redis://u:secret@a:1".into(), "redis://u:other@b:1".into()],
            master_name: "m".into(),
        };
        let master = MasterOptions::default();
        let urls = settings.urls(&master).unwrap();
        let Err(e) = settings.clients(&master, &urls, None) else {
            panic!("two passwords accepted");
        };
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn settings_are_checked_before_anything_connects() {
        let settings = |sentinels: &[&str], name: &str| Settings {
            sentinels: sentinels.iter().map(|s| (*s).to_owned()).collect(),
            master_name: name.to_owned(),
        };
        let default = MasterOptions::default();
        let message = |s: Settings, m: &MasterOptions| s.urls(m).unwrap_err().to_string();
        assert!(message(settings(&[], "m"), &default).contains("at least one sentinel"));
        assert!(message(settings(&["a:1"], " "), &default).contains("master's name"));
        let negative = MasterOptions {
            db: -1,
            ..MasterOptions::default()
        };
        assert!(message(settings(&["a:1"], "m"), &negative).contains("master_db"));
        let db = settings(&["redis://a:1/2"], "m");
        let urls = db.urls(&default).unwrap();
        let Err(e) = db.clients(&default, &urls, None) else {
            panic!("a sentinel URL with a database accepted");
        };
        assert!(e.to_string().contains("no database"), "{e}");
    }
}

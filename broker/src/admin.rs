//! RabbitMQ's HTTP API, for the one kind of account gleaner makes itself:
//! each job's launcher account, which may consume the job's task queue,
//! publish through the job's exchange and keep launcher queues of the job,
//! and nothing else. It is made when the job starts and deleted when it
//! ends (which closes its connections).

use std::time::Duration;

use base64::Engine;
use gleaner_manifest::JobId;
use gleaner_protocol::Credentials;
use rand::RngExt;

use crate::{BrokerError, connection::redact, topology::JobQueues};

/// How the services reach the management API: the first broker address's
/// host and account, on the management port unless `management_url` says.
#[derive(Clone)]
pub struct Admin {
    /// `http://host:15672/api`, or `https://host:15671/api` for `amqps`.
    base: String,
    /// `Basic …` of the services' account.
    auth: String,
    vhost: String,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("base", &self.base)
            .field("vhost", &self.vhost)
            .finish()
    }
}

/// The management UI and API of the broker at `url`, where RabbitMQ serves
/// them by default: HTTPS on 15671 beside `amqps`, HTTP on 15672 beside
/// plain AMQP.
pub fn management_base(url: &str) -> Result<String, BrokerError> {
    let uri = url
        .parse::<lapin::uri::AMQPUri>()
        .map_err(|e| BrokerError::Url(format!("{}: {e}", redact(url))))?;
    let host = &uri.authority.host;
    Ok(match uri.scheme {
        lapin::uri::AMQPScheme::AMQPS => format!("https://{host}:15671"),
        lapin::uri::AMQPScheme::AMQP => format!("http://{host}:15672"),
    })
}

/// An HTTP client for the management API: HTTPS verified against the
/// system's trust store, as the AMQP connections are; answers of any status
/// are returned, not raised.
pub fn http_agent(timeout: Duration) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout.min(Duration::from_secs(3))))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

/// The broker user of a job's launchers.
pub fn launcher_user(job: &JobId) -> String {
    format!("gleaner-launcher-{job}")
}

/// `(configure, write, read)` of a job's launcher account.
pub fn launcher_permissions(job: &JobId) -> (String, String, String) {
    let queues = JobQueues::new(job);
    let escaped = |name: &str| name.replace('.', "\\.");
    let own = format!("gleaner\\.launcher\\.{}:.*", escaped(job.as_str()));
    (
        format!("^{own}$"),
        format!("^{}$", escaped(&queues.exchange)),
        format!("^({}|{own})$", escaped(&queues.tasks)),
    )
}

impl Admin {
    /// From the services' broker URL; `management` overrides where the API
    /// is (`http://host:15672`).
    pub fn new(url: &str, management: Option<&str>) -> Result<Self, BrokerError> {
        let uri = url
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|e| BrokerError::Url(format!("{}: {e}", redact(url))))?;
        let base = match management {
            Some(m) => format!("{}/api", m.trim_end_matches('/')),
            None => format!("{}/api", management_base(url)?),
        };
        let userinfo = &uri.authority.userinfo;
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", userinfo.username, userinfo.password));
        Ok(Self {
            base,
            auth: format!("Basic {token}"),
            vhost: uri.vhost,
        })
    }

    /// Makes (or renews the password of) `job`'s launcher account.
    pub async fn launcher_account(&self, job: &JobId) -> Result<Credentials, BrokerError> {
        let user = launcher_user(job);
        let password: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(24)
            .map(char::from)
            .collect();
        let (configure, write, read) = launcher_permissions(job);
        self.call(
            "PUT",
            &format!("/users/{}", encode(&user)),
            Some(serde_json::json!({ "password": password, "tags": "" })),
        )
        .await?;
        self.call(
            "PUT",
            &format!("/permissions/{}/{}", encode(&self.vhost), encode(&user)),
            Some(serde_json::json!({ "configure": configure, "write": write, "read": read })),
        )
        .await?;
        Ok(Credentials { user, password })
    }

    /// Bounds every queue a user can make under their own prefix
    /// (`gleaner.watch.<user>.*`, where a `--wait` client keeps its events):
    /// a policy of the vhost, which RabbitMQ applies over whatever arguments
    /// the user declared (the lower bound wins), so that nobody can fill the
    /// broker's memory or disk, and raise its alarms for everyone, through
    /// queues of their own. Applied by the services at each start.
    pub async fn bound_users_queues(&self) -> Result<(), BrokerError> {
        let (name, body) = users_queue_policy();
        self.call(
            "PUT",
            &format!("/policies/{}/{}", encode(&self.vhost), name),
            Some(body),
        )
        .await
    }

    /// Deletes `job`'s launcher account; one already gone is fine.
    pub async fn forget_launcher_account(&self, job: &JobId) -> Result<(), BrokerError> {
        let path = format!("/users/{}", encode(&launcher_user(job)));
        match self.call("DELETE", &path, None).await {
            Err(BrokerError::NoQueue(_)) => Ok(()),
            other => other,
        }
    }

    async fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(), BrokerError> {
        let url = format!("{}{path}", self.base);
        let auth = self.auth.clone();
        tokio::task::spawn_blocking(move || {
            let agent = http_agent(Duration::from_secs(10));
            let sent = match (method, body) {
                ("DELETE", _) => agent.delete(&url).header("Authorization", &auth).call(),
                (_, body) => agent
                    .put(&url)
                    .header("Authorization", &auth)
                    .header("content-type", "application/json")
                    .send(body.unwrap_or_default().to_string()),
            };
            let mut response =
                sent.map_err(|e| BrokerError::Connect(format!("{method} {url}: {e}")))?;
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap_or_default();
            match status {
                404 => Err(BrokerError::NoQueue(url)),
                s if s >= 400 => Err(BrokerError::Connect(format!(
                    "{method} {url}: {s} {text} (the services' broker account must be an administrator)"
                ))),
                _ => Ok(()),
            }
        })
        .await
        .map_err(|e| BrokerError::Connect(e.to_string()))?
    }
}

/// The most messages one of a user's own queues holds; a new one pushes
/// the oldest out. A job's watch queue holds its events while its `--wait`
/// client is away: far fewer.
pub const USER_QUEUE_MESSAGES: u64 = 10_000;
/// The most bytes one of a user's own queues holds, likewise.
pub const USER_QUEUE_BYTES: u64 = 8 << 20;

/// The policy's name and body ([`Admin::bound_users_queues`]).
pub fn users_queue_policy() -> (&'static str, serde_json::Value) {
    (
        "gleaner-users-queues",
        serde_json::json!({
            "pattern": r"^gleaner\.watch\.",
            "apply-to": "queues",
            "priority": 10,
            "definition": {
                "max-length": USER_QUEUE_MESSAGES,
                "max-length-bytes": USER_QUEUE_BYTES,
            },
        }),
    )
}

/// Percent-encodes a path segment (`/` as a vhost is `%2F`).
fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launcher_account_reaches_its_own_job_only() {
        let job: JobId = "sweep.v2-3fa9c2d41e07b5a8".parse().unwrap();
        let (configure, write, read) = launcher_permissions(&job);
        assert_eq!(
            configure,
            r"^gleaner\.launcher\.sweep\.v2-3fa9c2d41e07b5a8:.*$"
        );
        assert_eq!(write, r"^gleaner\.job\.sweep\.v2-3fa9c2d41e07b5a8$");
        assert_eq!(
            read,
            r"^(gleaner\.job\.sweep\.v2-3fa9c2d41e07b5a8\.tasks|gleaner\.launcher\.sweep\.v2-3fa9c2d41e07b5a8:.*)$"
        );
        assert_eq!(
            launcher_user(&job),
            "gleaner-launcher-sweep.v2-3fa9c2d41e07b5a8"
        );
    }

    #[test]
    fn the_management_api_is_found_from_the_broker_url() {
        let admin = Admin::new("amqp://svc:pw@10.0.0.1:5672/prod?heartbeat=10", None).unwrap();
        assert_eq!(admin.base, "http://10.0.0.1:15672/api");
        assert_eq!(admin.vhost, "prod");
        assert_eq!(encode("/"), "%2F");
        let admin = Admin::new("amqps://svc:pw@broker.example/prod", None).unwrap();
        assert_eq!(admin.base, "https://broker.example:15671/api");
        let admin = Admin::new("amqps://svc:pw@b/p", Some("https://ui.example/")).unwrap();
        assert_eq!(admin.base, "https://ui.example/api");
    }
}

//! The RabbitMQ a test uses, through its management API: the broker
//! (development or replicated), and a vhost of the test's own that is
//! deleted with everything in it when the test ends.

use std::time::Duration;

use gleaner_broker::admin::{http_agent, management_base};
use serde_json::Value;

/// A RabbitMQ broker the tests use: the development broker on this machine,
/// or the replicated cluster of `deploy/rabbitmq/cluster.sh` on the test
/// hosts.
#[derive(Debug, Clone)]
pub struct BrokerAccess {
    /// `amqp[s]://user:password@host:port`, one per node.
    amqp: Vec<String>,
    /// The management API of each node.
    api: Vec<String>,
    user: String,
    auth: String,
}

impl BrokerAccess {
    /// From one `scheme://user:password@host:port` per node.
    fn new(bases: Vec<String>) -> Self {
        use base64::Engine;
        let first: lapin::uri::AMQPUri = bases[0].parse().expect("a broker URL");
        let userinfo = first.authority.userinfo;
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", userinfo.username, userinfo.password));
        Self {
            api: bases
                .iter()
                .map(|b| format!("{}/api", management_base(b).expect("a broker URL")))
                .collect(),
            amqp: bases,
            user: userinfo.username,
            auth: format!("Basic {token}"),
        }
    }

    /// The development broker: 127.0.0.1, guest.
    pub fn local() -> Self {
        Self::new(vec!["amqp://guest:guest@127.0.0.1:5672".into()])
    }

    /// The replicated broker (TLS only), from the URLs
    /// `deploy/rabbitmq/cluster.sh up` keeps.
    pub fn cluster() -> Self {
        const URLS: &str = "/etc/gleaner-broker/urls";
        let text = std::fs::read_to_string(URLS).unwrap_or_else(|e| {
            panic!("no replicated broker ({URLS}: {e}); run deploy/rabbitmq/cluster.sh up")
        });
        Self::new(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// The same broker, as `user`.
    pub fn as_user(&self, user: &str, password: &str) -> Self {
        let bases = self
            .amqp
            .iter()
            .map(|url| {
                let (scheme, rest) = url.split_once("://").unwrap_or(("amqp", url));
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!("{scheme}://{user}:{password}@{host}")
            })
            .collect();
        Self::new(bases)
    }

    /// One URL per node, with the credentials.
    pub fn amqp_urls(&self) -> &[String] {
        &self.amqp
    }

    /// `GET /api/whoami` on each node: what each answered.
    pub fn whoami_each(&self) -> Vec<Result<String, String>> {
        self.api
            .iter()
            .map(
                |base| match api(&self.auth, &format!("{base}/whoami"), "GET", None) {
                    Ok(answer) => answer,
                    Err(Unanswered(e)) => Err(e),
                },
            )
            .collect()
    }

    /// Calls the management API of the first node that answers.
    fn api(&self, method: &str, path: &str, body: Option<&str>) -> Result<String, String> {
        let mut errors = Vec::new();
        for base in &self.api {
            match api(&self.auth, &format!("{base}{path}"), method, body) {
                Err(Unanswered(e)) => errors.push(e),
                Ok(answer) => return answer,
            }
        }
        Err(errors.join("; "))
    }
}

/// A vhost of its own, deleted at the end of the test.
pub struct Vhost {
    pub name: String,
    pub broker: BrokerAccess,
}

impl Vhost {
    pub fn new(test: &str) -> Self {
        Self::on(BrokerAccess::local(), test)
    }

    pub fn on(broker: BrokerAccess, test: &str) -> Self {
        let name = format!("gleaner-test-{test}-{}", std::process::id());
        let _ = broker.api("DELETE", &format!("/vhosts/{name}"), None);
        broker
            .api("PUT", &format!("/vhosts/{name}"), Some("{}"))
            .expect("create vhost");
        let vhost = Self { name, broker };
        vhost.grant_all(&vhost.broker.user);
        vhost
    }

    /// Every permission on this vhost to the broker account `user`.
    pub fn grant_all(&self, user: &str) {
        self.api(
            "PUT",
            &format!("/permissions/{}/{user}", self.name),
            Some(r#"{"configure":".*","write":".*","read":".*"}"#),
        )
        .expect("grant permissions");
    }

    /// The vhost's URL on the broker's first node.
    pub fn url(&self) -> String {
        self.urls().swap_remove(0)
    }

    /// The vhost's URL on each of the broker's nodes.
    pub fn urls(&self) -> Vec<String> {
        self.broker
            .amqp
            .iter()
            .map(|base| format!("{base}/{}?heartbeat=10", self.name))
            .collect()
    }

    pub(crate) fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<String, String> {
        self.broker.api(method, path, body)
    }

    /// Publishes a raw message through the management API, as a user would by hand.
    pub fn publish_raw(&self, queue: &str, payload: &str, content_type: Option<&str>) {
        let mut properties = serde_json::Map::new();
        if let Some(ct) = content_type {
            properties.insert("content_type".into(), ct.into());
        }
        self.publish_raw_with(queue, payload, properties);
    }

    /// [`Vhost::publish_raw`] with the message's properties as given
    /// (`content_type`, `message_id`, …).
    pub fn publish_raw_with(
        &self,
        queue: &str,
        payload: &str,
        properties: serde_json::Map<String, Value>,
    ) {
        let body = serde_json::json!({
            "properties": properties,
            "routing_key": queue,
            "payload": payload,
            "payload_encoding": "string",
        });
        let answer = self
            .api(
                "POST",
                &format!("/exchanges/{}/amq.default/publish", self.name),
                Some(&body.to_string()),
            )
            .expect("publish");
        assert!(answer.contains("\"routed\":true"), "not routed: {answer}");
    }

    /// Messages in a queue (ready + unacked), as the management API reports them.
    pub fn queue(&self, queue: &str) -> Option<Value> {
        let text = self
            .api("GET", &format!("/queues/{}/{queue}", self.name), None)
            .ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Declares a durable queue with `arguments` (JSON), as another
    /// program (an older gleaner) might have.
    pub fn declare_queue(&self, queue: &str, arguments: &str) {
        let body = format!(r#"{{"durable": true, "arguments": {arguments}}}"#);
        self.api(
            "PUT",
            &format!("/queues/{}/{queue}", self.name),
            Some(&body),
        )
        .expect("declare a queue");
    }

    /// The consumers of the vhost's queues, as the management API lists them.
    pub fn consumers(&self) -> Vec<Value> {
        self.api("GET", &format!("/consumers/{}", self.name), None)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    /// Takes (and removes) up to `count` messages from a queue.
    pub fn get(&self, queue: &str, count: u32) -> Vec<Value> {
        self.get_as(queue, count, "ack_requeue_false")
    }

    /// Takes up to `count` messages from a queue and returns them to it,
    /// as a consumer that gives them back would: a quorum queue counts
    /// each return against its delivery limit.
    pub fn get_and_return(&self, queue: &str, count: u32) -> Vec<Value> {
        self.get_as(queue, count, "ack_requeue_true")
    }

    fn get_as(&self, queue: &str, count: u32, ackmode: &str) -> Vec<Value> {
        let body = serde_json::json!({
            "count": count, "ackmode": ackmode, "encoding": "auto"
        });
        let text = self
            .api(
                "POST",
                &format!("/queues/{}/{queue}/get", self.name),
                Some(&body.to_string()),
            )
            .unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_default()
    }

    /// Closes every client connection of the vhost, as a broker restart would.
    pub fn close_connections(&self) -> usize {
        let text = self
            .api("GET", &format!("/vhosts/{}/connections", self.name), None)
            .unwrap_or_default();
        let connections: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
        for connection in &connections {
            if let Some(name) = connection["name"].as_str() {
                let encoded: String = name
                    .bytes()
                    .map(|b| match b {
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                            (b as char).to_string()
                        }
                        _ => format!("%{b:02X}"),
                    })
                    .collect();
                let _ = self.api("DELETE", &format!("/connections/{encoded}"), None);
            }
        }
        connections.len()
    }

    /// Whether the broker has a user of that name.
    pub fn has_user(&self, name: &str) -> bool {
        self.api("GET", &format!("/users/{name}"), None).is_ok()
    }

    /// The limits the broker sets a user (`max-connections`, …), as JSON.
    pub fn user_limits(&self, name: &str) -> Value {
        self.api("GET", &format!("/user-limits/{name}"), None)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    }

    pub fn queue_names(&self) -> Vec<String> {
        let text = self
            .api("GET", &format!("/queues/{}", self.name), None)
            .unwrap_or_default();
        let queues: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
        queues
            .iter()
            .filter_map(|q| q["name"].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Vhost {
    /// The vhost goes, and the launcher accounts of jobs that did not end
    /// (users are the broker's, not the vhost's).
    fn drop(&mut self) {
        let text = self
            .api("GET", &format!("/vhosts/{}/permissions", self.name), None)
            .unwrap_or_default();
        let permissions: Vec<Value> = serde_json::from_str(&text).unwrap_or_default();
        for user in permissions.iter().filter_map(|p| p["user"].as_str()) {
            if user.starts_with("gleaner-launcher-") {
                let _ = self.api("DELETE", &format!("/users/{user}"), None);
            }
        }
        let _ = self.api("DELETE", &format!("/vhosts/{}", self.name), None);
    }
}

/// No HTTP answer at all (the node is down): try another.
struct Unanswered(String);

/// One call of a management API: its answer (an error for an HTTP error
/// status), or [`Unanswered`].
fn api(
    auth: &str,
    url: &str,
    method: &str,
    body: Option<&str>,
) -> Result<Result<String, String>, Unanswered> {
    let agent = http_agent(Duration::from_secs(30));
    let response = match (method, body) {
        ("GET", _) => agent.get(url).header("Authorization", auth).call(),
        ("DELETE", _) => agent.delete(url).header("Authorization", auth).call(),
        ("PUT", b) => agent
            .put(url)
            .header("Authorization", auth)
            .header("content-type", "application/json")
            .send(b.unwrap_or("{}")),
        (_, b) => agent
            .post(url)
            .header("Authorization", auth)
            .header("content-type", "application/json")
            .send(b.unwrap_or("{}")),
    };
    let mut response = response.map_err(|e| Unanswered(format!("{method} {url}: {e}")))?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| Unanswered(e.to_string()))?;
    if status >= 400 {
        return Ok(Err(format!("{method} {url}: {status} {text}")));
    }
    Ok(Ok(text))
}

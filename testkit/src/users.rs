//! Users of a gleaner of many users: broker accounts made by
//! `deploy/rabbitmq/user.sh` on a test's vhost, and raw AMQP as them, to
//! see what the broker itself lets them do.

use std::{path::Path, process::Command};

use futures_util::StreamExt;
pub use lapin::{
    BasicProperties,
    types::{AMQPValue, FieldTable},
};
use lapin::{
    Connection, ConnectionProperties,
    options::{
        BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
};

use crate::{Gleaner, Vhost};

/// A broker account on a test's vhost, removed at the end of the test.
pub struct BrokerUser {
    /// `<role>-<pid>`: unique on the broker, whose users are not per vhost.
    pub name: String,
    password: String,
    vhost: String,
}

impl BrokerUser {
    /// `deploy/rabbitmq/user.sh add` for `role` (`alice`) on `vhost`.
    pub fn add(vhost: &Vhost, role: &str) -> Self {
        let name = format!("{role}-{}", std::process::id());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rabbitmq/user.sh");
        let file = tempfile::NamedTempFile::new().expect("password file");
        let status = Command::new(script)
            .args(["add", &name, "--vhost", &vhost.name, "--password-file"])
            .arg(file.path())
            .status()
            .expect("run deploy/rabbitmq/user.sh");
        assert!(
            status.success(),
            "deploy/rabbitmq/user.sh add {name} failed"
        );
        let password = std::fs::read_to_string(file.path())
            .expect("password")
            .trim()
            .to_owned();
        Self {
            name,
            password,
            vhost: vhost.name.clone(),
        }
    }

    /// An account with every permission on `vhost` and no tag: a user's
    /// own gleaner (`gleaner up` as them) on a vhost an admin gave them.
    pub fn owner_of(vhost: &Vhost, role: &str) -> Self {
        let name = format!("{role}-{}", std::process::id());
        let password = format!("{:032x}", rand::random::<u128>());
        vhost
            .api(
                "PUT",
                &format!("/users/{name}"),
                Some(&serde_json::json!({ "password": password, "tags": "" }).to_string()),
            )
            .expect("make the broker account");
        vhost.grant_all(&name);
        Self {
            name,
            password,
            vhost: vhost.name.clone(),
        }
    }

    pub fn url(&self) -> String {
        format!(
            "amqp://{}:{}@127.0.0.1:5672/{}?heartbeat=10",
            self.name, self.password, self.vhost
        )
    }

    /// Raw AMQP as this user.
    pub fn amqp(&self) -> Amqp {
        Amqp(self.url())
    }
}

/// A broker account to try things with, by its URL.
pub struct Amqp(pub String);

impl Amqp {
    /// Runs `work` on a connection of its own. A failure that does not
    /// carry the broker's reply code (the client saw the channel close
    /// before the reason came) is tried again, a few times: what the
    /// broker refused is told by its reply code.
    fn run<T>(
        &self,
        work: impl AsyncFn(&Connection) -> Result<T, lapin::Error>,
    ) -> Result<T, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let mut last = String::new();
        for _ in 0..3 {
            let outcome = runtime.block_on(async {
                let connection = Connection::connect(&self.0, ConnectionProperties::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let outcome = work(&connection).await.map_err(|e| e.to_string());
                let _ = connection.close(200, "bye".into()).await;
                outcome
            });
            match outcome {
                Err(e)
                    if !["_REFUSED", "_FAILED", "NOT_FOUND"]
                        .iter()
                        .any(|code| e.contains(code)) =>
                {
                    last = e;
                }
                outcome => return outcome,
            }
        }
        Err(last)
    }

    /// Starts consuming `queue`; the broker's refusal, if it refuses.
    pub fn consume(&self, queue: &str) -> Result<(), String> {
        self.run(async |connection| {
            let channel = connection.create_channel().await?;
            let mut consumer = channel
                .basic_consume(
                    queue.into(),
                    "probe".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            // A delivery, if any came, goes back with the connection.
            let _ =
                tokio::time::timeout(std::time::Duration::from_millis(200), consumer.next()).await;
            Ok(())
        })
    }

    /// Publishes `body` through `exchange` with `key` and waits for the
    /// confirm, claiming to be `user_id` if given.
    pub fn publish(
        &self,
        route: (&str, &str),
        body: &[u8],
        user_id: Option<&str>,
    ) -> Result<(), String> {
        let mut properties = BasicProperties::default();
        if let Some(user) = user_id {
            properties = properties.with_user_id(user.into());
        }
        self.publish_with(route, body, properties)
    }

    /// [`Amqp::publish`] with the message's properties as given.
    pub fn publish_with(
        &self,
        route: (&str, &str),
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), String> {
        self.publish_copies(route, body, properties, 1)
    }

    /// Publishes `count` copies of `body` through `exchange` with `key`,
    /// pipelined on one channel, and waits for their confirms.
    pub fn publish_many(
        &self,
        route: (&str, &str),
        body: &[u8],
        count: usize,
    ) -> Result<(), String> {
        self.publish_copies(route, body, BasicProperties::default(), count)
    }

    fn publish_copies(
        &self,
        (exchange, key): (&str, &str),
        body: &[u8],
        properties: BasicProperties,
        count: usize,
    ) -> Result<(), String> {
        self.run(async |connection| {
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            let mut confirms = Vec::with_capacity(count);
            for _ in 0..count {
                confirms.push(
                    channel
                        .basic_publish(
                            exchange.into(),
                            key.into(),
                            BasicPublishOptions::default(),
                            body,
                            properties.clone(),
                        )
                        .await?,
                );
            }
            for confirm in confirms {
                confirm.await?;
            }
            // A refusal closes the channel after the publish went out.
            channel.basic_qos(1, Default::default()).await?;
            Ok(())
        })
    }

    /// The broker user of the URL.
    fn user(&self) -> &str {
        self.0
            .split("://")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .unwrap_or_default()
    }

    /// Fills a queue of this user's own (`gleaner.watch.<user>.flood`,
    /// declared asking to hold a terabyte) through an exchange of their own:
    /// `count` copies of `body`.
    pub fn flood_own_queue(&self, body: &[u8], count: usize) -> Result<String, String> {
        let user = self.user();
        let name = format!("gleaner.watch.{user}.flood");
        self.run(async |connection| {
            let channel = connection.create_channel().await?;
            let mut args = FieldTable::default();
            args.insert("x-max-length-bytes".into(), AMQPValue::LongLongInt(1 << 40));
            let durable = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(name.as_str().into(), durable, args)
                .await?;
            channel
                .exchange_declare(
                    name.as_str().into(),
                    lapin::ExchangeKind::Fanout,
                    lapin::options::ExchangeDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            channel
                .queue_bind(
                    name.as_str().into(),
                    name.as_str().into(),
                    "".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok(())
        })?;
        self.publish_copies((&name, ""), body, BasicProperties::default(), count)?;
        Ok(name)
    }

    /// Declares a watch queue of this user's and binds it to
    /// `gleaner.events` with `pattern`.
    pub fn watch(&self, pattern: &str) -> Result<(), String> {
        let user = self.user();
        let queue = format!("gleaner.watch.{user}.probe");
        self.run(async |connection| {
            let channel = connection.create_channel().await?;
            let options = QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(queue.as_str().into(), options, FieldTable::default())
                .await?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    "gleaner.events".into(),
                    pattern.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok(())
        })
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rabbitmq/user.sh");
        let _ = Command::new(script)
            .args(["remove", &self.name])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A gleaner of many users for `test`, its services not started yet:
/// `alice-<pid>` and `bob-<pid>`, broker accounts made by `user.sh`, are
/// the Unix accounts alice and bob (`deploy/accounts.sh`); `clusters`
/// (configuration) comes before `[users]`; the test's directory is open
/// to every account, and holds the binary the services run. With the
/// environment its services need.
pub fn many_users(
    test: &str,
    exe: &str,
    clusters: &str,
) -> (Gleaner, BrokerUser, BrokerUser, [(&'static str, String); 2]) {
    for account in ["alice", "bob"] {
        assert!(
            nix::unistd::User::from_name(account)
                .ok()
                .flatten()
                .is_some(),
            "no Unix account {account}: run deploy/accounts.sh alice bob"
        );
    }
    let mut g = Gleaner::new(test, exe);
    g.open_to_every_account();
    let alice = BrokerUser::add(&g.vhost, "alice");
    let bob = BrokerUser::add(&g.vhost, "bob");
    let config = g.write(
        "gleaner.toml",
        &format!(
            "{clusters}[users]\nsingle = false\naccounts = {{ \"{}\" = \"alice\", \"{}\" = \"bob\" }}\n",
            alice.name, bob.name
        ),
    );
    let config = config.to_str().expect("path").to_owned();
    let env = [
        ("GLEANER_CONFIG", config),
        ("GLEANER_USERS__SINGLE", "false".to_owned()),
    ];
    (g, alice, bob, env)
}

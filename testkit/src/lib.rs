//! Test and benchmark harness: every test gets its own RabbitMQ vhost, its
//! own directory and its own gleaner processes, all removed when it ends.

use std::{
    collections::BTreeMap,
    io::Read,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use gleaner_broker::admin::{http_agent, management_base};
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use serde_json::Value;

pub mod chaos;
pub mod terminal;
pub mod users;

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
        broker
            .api(
                "PUT",
                &format!("/permissions/{name}/{}", broker.user),
                Some(r#"{"configure":".*","write":".*","read":".*"}"#),
            )
            .expect("grant permissions");
        Self { name, broker }
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

    fn api(&self, method: &str, path: &str, body: Option<&str>) -> Result<String, String> {
        self.broker.api(method, path, body)
    }

    /// Publishes a raw message through the management API, as a user would by hand.
    pub fn publish_raw(&self, queue: &str, payload: &str, content_type: Option<&str>) {
        let mut properties = serde_json::Map::new();
        if let Some(ct) = content_type {
            properties.insert("content_type".into(), ct.into());
        }
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
        let body = serde_json::json!({
            "count": count, "ackmode": "ack_requeue_false", "encoding": "auto"
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

/// One test's gleaner: a directory, a vhost, and the processes started in it.
pub struct Gleaner {
    pub vhost: Vhost,
    pub dir: tempfile::TempDir,
    exe: PathBuf,
    services: Vec<Child>,
}

impl Gleaner {
    /// `exe` is the `gleaner` binary under test.
    pub fn new(test: &str, exe: impl Into<PathBuf>) -> Self {
        Self::on(BrokerAccess::local(), test, exe)
    }

    /// A gleaner on another broker (the replicated one).
    pub fn on(broker: BrokerAccess, test: &str, exe: impl Into<PathBuf>) -> Self {
        Self {
            vhost: Vhost::on(broker, test),
            dir: tempfile::tempdir().expect("tempdir"),
            exe: exe.into(),
            services: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Opens the test's directory to every account and runs the services
    /// from a binary in it: their launchers and components run as other
    /// accounts (alice, bob), which must reach both wherever the checkout
    /// is (under root's home, say).
    pub fn open_to_every_account(&mut self) {
        std::fs::set_permissions(
            self.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let reachable = self.path().join("gleaner");
        std::fs::hard_link(&self.exe, &reachable)
            .or_else(|_| std::fs::copy(&self.exe, &reachable).map(drop))
            .expect("the gleaner binary in the test's directory");
        self.exe = reachable;
    }

    /// A gleaner command for this test's vhost and directory.
    pub fn command(&self, args: &[&str]) -> Command {
        self.prepare(Command::new(&self.exe), args)
    }

    /// `command` (which runs gleaner) set up for this test.
    fn prepare(&self, mut command: Command, args: &[&str]) -> Command {
        command
            .args(args)
            .current_dir(self.path())
            .env("GLEANER_BROKER_URL", self.vhost.url())
            .env("GLEANER_BROKER_URLS", self.vhost.urls().join(","))
            .env("GLEANER_LAUNCHER__IDLE_TIMEOUT", "2s")
            .env("GLEANER_LAUNCHER__HEARTBEAT", "1s")
            .env("GLEANER_RUNNER__HEARTBEAT", "1s")
            .env("GLEANER_RUNNER__PREEMPT_GRACE", "3s")
            .env("GLEANER_USERS__SINGLE", "true")
            .env_remove("GLEANER_CONFIG")
            .env("RUST_LOG", "info");
        command
    }

    /// Starts a long-running service; its log goes to `<dir>/<name>.log`.
    pub fn start(&mut self, name: &str, args: &[&str]) -> u32 {
        self.start_with(name, args, &[])
    }

    /// [`Gleaner::start`] with extra environment variables.
    pub fn start_with(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) -> u32 {
        let mut command = self.command(args);
        command.envs(env.iter().copied());
        self.spawn(name, command)
    }

    /// [`Gleaner::start`] on a test host of its own.
    pub fn start_on(&mut self, island: &Island, name: &str, args: &[&str]) -> u32 {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &island.namespace()])
            .arg(&self.exe);
        let command = self.prepare(command, args);
        self.spawn(name, command)
    }

    fn spawn(&mut self, name: &str, mut command: Command) -> u32 {
        let log = std::fs::File::create(self.path().join(format!("{name}.log"))).expect("log");
        let child = command
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start gleaner");
        let pid = child.id();
        self.services.push(child);
        pid
    }

    pub fn up(&mut self, slots: u32) -> u32 {
        self.start("up", &["up", "--slots", &slots.to_string()])
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    }

    /// Runs a client command to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run gleaner")
    }

    /// Runs a client command to its end as `user` (their broker account).
    pub fn run_as(&self, user: &users::BrokerUser, args: &[&str]) -> Output {
        self.command(args)
            .env("GLEANER_BROKER_URL", user.url())
            .env("GLEANER_BROKER_URLS", user.url())
            .env("RUST_LOG", "warn")
            .output()
            .expect("run gleaner")
    }

    /// `gleaner submit` without waiting; returns the job id.
    pub fn submit(&self, manifest: &str) -> String {
        let path = self.write(&format!("job-{}.toml", rand_suffix()), manifest);
        let output = self.run(&["submit", path.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "submit failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// `gleaner submit --wait` as a child, to be waited for later.
    pub fn submit_waiting(&self, manifest: &str) -> Child {
        let path = self.write(&format!("job-{}.toml", rand_suffix()), manifest);
        self.client(&["submit", path.to_str().unwrap(), "--wait"])
    }

    /// A client command as a child with its output piped, to be waited for
    /// later ([`finish`]).
    pub fn client(&self, args: &[&str]) -> Child {
        self.command(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gleaner")
    }

    pub fn results_dir(&self, job: &str) -> PathBuf {
        self.path().join("results").join(job)
    }

    /// The results index of a job, one JSON value per line.
    /// Waits (3 minutes at most) for a sweep of `tasks` tasks to end, and
    /// asserts that every task succeeded at its first attempt.
    pub fn assert_all_done_once(&self, job: &str, tasks: usize) {
        assert_eq!(self.wait_for_end(job, Duration::from_secs(180)), "done");
        let index = by_task(&self.index(job));
        assert_eq!(index.len(), tasks);
        assert!(
            index
                .values()
                .all(|t| t["status"] == "succeeded" && t["attempts"] == 1),
            "every task once, none failed: {index:?}"
        );
    }

    pub fn index(&self, job: &str) -> Vec<Value> {
        std::fs::read_to_string(self.results_dir(job).join("index.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("index line is JSON"))
            .collect()
    }

    pub fn job_file(&self, job: &str) -> Option<Value> {
        let text = std::fs::read_to_string(self.results_dir(job).join("job.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn job_state(&self, job: &str) -> Option<String> {
        self.job_file(job)?["state"].as_str().map(str::to_owned)
    }

    /// Waits until the job has ended (per job.json), or panics after `timeout`.
    pub fn wait_for_end(&self, job: &str, timeout: Duration) -> String {
        let mut state = None;
        wait_for(&format!("job {job} to end"), timeout, || {
            state = self
                .job_state(job)
                .filter(|s| s == "done" || s == "cancelled");
            state.is_some()
        });
        state.unwrap_or_default()
    }

    /// `gleaner status --json`.
    pub fn status(&self) -> Option<Value> {
        let output = self.run(&["status", "--json"]);
        serde_json::from_slice(&output.stdout).ok()
    }

    /// Launcher processes of a job (their pids). A launcher's child between
    /// its fork and the exec of a task's shell still has the launcher's
    /// command line: it is not one.
    pub fn launchers(&self, job: &str) -> Vec<u32> {
        let output = Command::new("pgrep")
            .args(["-f", &format!("launcher --job {job} ")])
            .output()
            .expect("pgrep");
        let matched: Vec<u32> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        matched
            .iter()
            .copied()
            .filter(|pid| parent(*pid).is_none_or(|parent| !matched.contains(&parent)))
            .collect()
    }

    /// Waits until `busy` tasks of the job run on as many launchers, then
    /// sends `signal` to one of those launchers; returns its pid.
    pub fn signal_busy_launcher(&self, job: &str, busy: u64, signal: Signal) -> u32 {
        let mut victim = None;
        wait_for("busy launchers", Duration::from_secs(60), || {
            let launchers = self.launchers(job);
            victim = launchers.first().copied();
            launchers.len() as u64 >= busy
                && self
                    .job_file(job)
                    .is_some_and(|f| f["tasks"]["running"].as_u64() >= Some(busy))
        });
        let victim = victim.unwrap_or_default();
        nix::sys::signal::kill(Pid::from_raw(victim as i32), signal).expect("signal a launcher");
        victim
    }

    /// Stops a service started with [`Gleaner::start`] with `signal`.
    /// Signals a service; one killed or told to stop is waited for.
    pub fn signal(&mut self, pid: u32, signal: Signal) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), signal);
        if let Some(child) = self.services.iter_mut().find(|c| c.id() == pid)
            && matches!(signal, Signal::SIGKILL | Signal::SIGTERM)
        {
            let _ = child.wait();
        }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Gleaner {
    /// The last lines of every service's log, on stderr.
    pub fn print_logs(&self) {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
            .collect();
        logs.sort();
        for path in logs {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            let name = path.file_stem().unwrap_or_default().to_string_lossy();
            if !log.is_empty() {
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                eprintln!("---- {name}.log (last lines) ----");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// Asks every service still running to stop, as a service manager
    /// would (SIGTERM to the service alone, nothing else in its process
    /// group), and waits for them, `timeout` at most.
    pub fn stop_services(&mut self, timeout: Duration) {
        for child in &mut self.services {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + timeout;
        for child in &mut self.services {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Gleaner {
    fn drop(&mut self) {
        for child in &self.services {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for child in &mut self.services {
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        if std::thread::panicking() {
            self.print_logs();
        }
    }
}

/// A process's parent, from its `stat` (after the command name, which may
/// hold anything: state, then the parent).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub fn rand_suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Polls `condition` every 100 ms until it holds; panics after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for a `submit --wait` of `tasks` tasks and asserts that every one
/// succeeded; returns its output (the job id on stdout).
pub fn finish_all_succeeded(child: Child, tasks: u32, timeout: Duration) -> Output {
    let output = finish(child, timeout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "submit --wait failed: {stderr}");
    assert!(
        stderr.contains(&format!("{tasks} of {tasks} tasks succeeded")),
        "{stderr}"
    );
    output
}

/// Waits for a child with a timeout, returning its output.
pub fn finish(mut child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output");
            panic!(
                "command did not finish in time; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    Output {
        status: child.wait().expect("status"),
        stdout: stdout.into_bytes(),
        stderr: stderr.into_bytes(),
    }
}

/// Index lines by task number; panics on a duplicate.
pub fn by_task(index: &[Value]) -> BTreeMap<u64, Value> {
    let mut tasks = BTreeMap::new();
    for line in index {
        let task = line["task"].as_u64().expect("task number");
        assert!(
            tasks.insert(task, line.clone()).is_none(),
            "task {task} twice in the index"
        );
    }
    tasks
}

/// Cluster queues of a test's own on this host's Grid Engine cell, removed
/// (with their jobs) when the test ends. Needs `deploy/sge/setup.sh`.
pub struct SgeQueues {
    pub names: Vec<String>,
}

impl SgeQueues {
    pub fn new(count: usize, slots: u32) -> Self {
        Self::make(count, slots, None)
    }

    /// Queues spanning the multi-host grid's nodes (`deploy/sge/hosts.sh`),
    /// `slots` on each host.
    pub fn on_nodes(count: usize, slots: u32) -> Self {
        Self::make(count, slots, Some("@nodes"))
    }

    fn make(count: usize, slots: u32, hosts: Option<&str>) -> Self {
        let tag = rand_suffix();
        let names: Vec<String> = (1..=count).map(|i| format!("t{tag}c{i}.q")).collect();
        let mut args = vec!["add".to_owned()];
        if let Some(hosts) = hosts {
            args.extend(["--hosts".to_owned(), hosts.to_owned()]);
        }
        args.extend(names.iter().cloned());
        args.push(slots.to_string());
        let status = Command::new(queue_script())
            .args(&args)
            .stdout(Stdio::null())
            .status()
            .expect("deploy/sge/queue.sh (is Grid Engine set up? deploy/sge/setup.sh)");
        assert!(
            status.success(),
            "cannot create test queues (run deploy/sge/setup.sh, and deploy/sge/hosts.sh for the nodes)"
        );
        let queues = Self { names };
        wait_for(
            "the test queues to take jobs",
            Duration::from_secs(60),
            || {
                queues.names.iter().all(|q| {
                    let out = sge("qstat", &["-f", "-q", q]);
                    out.contains(&format!("{q}@")) && !queue_unusable(&out, q)
                })
            },
        );
        queues
    }

    /// Every job in a queue, as (number, name, state, task) from `qstat -xml`.
    pub fn jobs(&self, queue: &str) -> Vec<SgeJob> {
        let xml = sge("qstat", &["-xml", "-u", "*", "-q", queue]);
        xml.split("<job_list")
            .skip(1)
            .map(|entry| {
                let field = |name: &str| {
                    entry
                        .split_once(&format!("<{name}>"))
                        .and_then(|(_, rest)| rest.split_once(&format!("</{name}>")))
                        .map(|(value, _)| value.to_owned())
                        .unwrap_or_default()
                };
                SgeJob {
                    number: field("JB_job_number"),
                    name: field("JB_name"),
                    state: field("state"),
                    tasks: field("tasks"),
                    host: field("queue_name")
                        .split_once('@')
                        .map(|(_, host)| host.to_owned())
                        .unwrap_or_default(),
                    slots: field("slots").parse().unwrap_or(0),
                }
            })
            .collect()
    }
}

impl Drop for SgeQueues {
    fn drop(&mut self) {
        let mut args = vec!["delete".to_owned()];
        args.extend(self.names.iter().cloned());
        let _ = Command::new(queue_script()).args(&args).output();
    }
}

/// One line of `qstat` for a test.
#[derive(Debug, Clone)]
pub struct SgeJob {
    pub number: String,
    pub name: String,
    pub state: String,
    pub tasks: String,
    /// Where it runs (empty while it waits).
    pub host: String,
    pub slots: u32,
}

fn queue_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/sge/queue.sh")
}

fn queue_unusable(qstat: &str, queue: &str) -> bool {
    qstat
        .lines()
        .filter(|l| l.starts_with(&format!("{queue}@")))
        .any(|l| {
            l.split_whitespace()
                .nth(5)
                .is_some_and(|states| states.contains(['a', 'u', 'E', 'd']))
        })
}

/// Submits a job (output discarded); returns its number.
pub fn qsub(args: &[&str]) -> String {
    let answer = sge(
        "qsub",
        &[&["-terse", "-o", "/dev/null", "-e", "/dev/null"], args].concat(),
    );
    let number = answer.trim().split('.').next().unwrap_or("").to_owned();
    assert!(number.parse::<u64>().is_ok(), "qsub answered {answer:?}");
    number
}

/// Runs a Grid Engine command; returns its stdout (and panics if it cannot run).
pub fn sge(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .env(
            "SGE_ROOT",
            std::env::var("SGE_ROOT").unwrap_or_else(|_| "/var/lib/gridengine".into()),
        )
        .env(
            "SGE_CELL",
            std::env::var("SGE_CELL").unwrap_or_else(|_| "default".into()),
        )
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (is Grid Engine set up? deploy/sge/setup.sh)"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The dev grid's Slurm (`deploy/slurm/setup.sh`), one test at a time:
/// every test shares its nodes, so each holds a lock on them for as long
/// as it runs, and starts and ends with no job in the queue.
pub struct SlurmCluster {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// One line of `squeue` for a test.
#[derive(Debug, Clone)]
pub struct SlurmJob {
    /// `123`, or `123_4` for an array task.
    pub id: String,
    pub name: String,
    pub state: String,
    /// Where it runs (empty while it waits).
    pub node: String,
}

impl SlurmCluster {
    /// Partition of gleaner's placeholders.
    pub const PARTITION: &str = "gleaner";
    /// Partition of the cluster's own jobs, on the same nodes.
    pub const LOCAL: &str = "local";
    /// Partition of placeholders that the site's jobs preempt …
    pub const SCAVENGER: &str = "scavenger";
    /// … the site's jobs, in a higher PriorityTier, on the same nodes.
    pub const SITE: &str = "batch";

    pub fn lock() -> Self {
        let cluster = Self {
            _lock: exclusive("gleaner-slurm-tests.lock"),
        };
        cluster.clear();
        cluster
    }

    /// Every job in the queue.
    pub fn jobs(&self) -> Vec<SlurmJob> {
        slurm("squeue", &["-h", "-r", "-o", "%i|%j|%T|%N"])
            .lines()
            .filter_map(|line| {
                let mut f = line.split('|');
                Some(SlurmJob {
                    id: f.next()?.to_owned(),
                    name: f.next()?.to_owned(),
                    state: f.next()?.to_owned(),
                    node: f.next()?.to_owned(),
                })
            })
            .collect()
    }

    /// `scontrol show job ID`: how a job stands, or ended (for `MinJobAge`).
    pub fn state(&self, id: &str) -> String {
        slurm("scontrol", &["show", "job", id])
    }

    fn clear(&self) {
        slurm("scancel", &["--full", "-u", "root"]);
        wait_for("the Slurm queue to empty", Duration::from_secs(60), || {
            self.jobs().is_empty()
        });
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        slurm("scancel", &["--full", "-u", "root"]);
    }
}

/// `sbatch --parsable ARGS`; returns the job id.
pub fn sbatch(args: &[&str]) -> String {
    let answer = slurm(
        "sbatch",
        &[
            &["--parsable", "--output=/dev/null", "--error=/dev/null"],
            args,
        ]
        .concat(),
    );
    let id = answer.trim().split(';').next().unwrap_or("").to_owned();
    assert!(id.parse::<u64>().is_ok(), "sbatch answered {answer:?}");
    id
}

/// Runs a Slurm command; returns its stdout (and panics if it cannot run).
pub fn slurm(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (is Slurm set up? deploy/slurm/setup.sh)"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A sweep manifest: `command` once for each `n` in 1..=`tasks`.
pub fn sweep(name: &str, tasks: u32, command: &str) -> String {
    format!(
        "name = \"{name}\"\n[sweep]\ncommand = \"{command}\"\nparams = {{ n = {{ from = 1, to = {tasks} }} }}\n"
    )
}

/// An exclusive lock on a file in the temporary directory, held by one
/// test at a time of all the test processes sharing something.
fn exclusive(name: &str) -> nix::fcntl::Flock<std::fs::File> {
    let path = std::env::temp_dir().join(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("lock file");
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("lock {}: {e}", path.display()))
}

/// The replicated broker of `deploy/rabbitmq/cluster.sh`, one test at a
/// time: a test that takes a node down holds a lock on the cluster, and
/// every node is running again when it ends.
pub struct BrokerCluster {
    _lock: nix::fcntl::Flock<std::fs::File>,
    pub access: BrokerAccess,
}

impl BrokerCluster {
    pub const NODES: [&str; 3] = ["node1", "node2", "node3"];

    pub fn lock() -> Self {
        let cluster = Self {
            _lock: exclusive("gleaner-broker-cluster-tests.lock"),
            access: BrokerAccess::cluster(),
        };
        for node in Self::NODES {
            cluster.start(node);
        }
        cluster
    }

    /// Kills a node's broker, as a crash would.
    pub fn stop(&self, node: &str) {
        Self::script(&["stop", node]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts a node's broker again (nothing if it runs); it rejoins.
    pub fn start(&self, node: &str) {
        Self::script(&["start", node]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops every node, then starts the cluster again (its nodes boot
    /// together, each waiting for the others).
    pub fn restart(&self) {
        for node in Self::NODES {
            self.stop(node);
        }
        Self::script(&["up"]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The node (`node2`) a client's connection is on, by its connection
    /// name (`runner@vm`), in a vhost.
    pub fn node_of(&self, vhost: &Vhost, connection: &str) -> Option<String> {
        let text = vhost
            .api("GET", &format!("/vhosts/{}/connections", vhost.name), None)
            .ok()?;
        let connections: Vec<Value> = serde_json::from_str(&text).ok()?;
        connections
            .iter()
            .find(|c| c["client_properties"]["connection_name"] == connection)
            .and_then(|c| c["node"].as_str())
            .map(|node| node.trim_start_matches("rabbit@").to_owned())
    }

    fn script(args: &[&str]) -> Result<(), String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rabbitmq/cluster.sh");
        let output = Command::new(&script)
            .args(args)
            .output()
            .map_err(|e| format!("run {}: {e}", script.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "cluster.sh {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}

impl Drop for BrokerCluster {
    fn drop(&mut self) {
        for node in Self::NODES {
            if let Err(e) = Self::script(&["start", node]) {
                eprintln!("{e}");
            }
        }
    }
}

/// A test host of a test's own (`deploy/grid/hosts.sh island`): a network
/// namespace with loopback and the broker forwarders only, whose broker
/// traffic the test can cut (dropped, as by a network fault) and mend.
/// Removed, with everything still running in it, when the test ends.
pub struct Island {
    pub name: String,
}

impl Island {
    pub fn new(test: &str) -> Self {
        let island = Self {
            name: format!("{test}{}", std::process::id()),
        };
        island.hosts(&["island"]);
        island
    }

    /// The namespace (`ip netns exec NAMESPACE …` runs a command there).
    pub fn namespace(&self) -> String {
        format!("gleaner-{}", self.name)
    }

    pub fn cut(&self) {
        self.hosts(&["cut"]);
    }

    pub fn mend(&self) {
        self.hosts(&["mend"]);
    }

    /// The processes running in the island: pid, command (`comm`).
    pub fn processes(&self) -> Vec<(u32, String)> {
        let output = Command::new("ip")
            .args(["netns", "pids", &self.namespace()])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .filter_map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                Some((pid.parse().ok()?, comm.trim().to_owned()))
            })
            .collect()
    }

    fn hosts(&self, command: &[&str]) {
        let output = Command::new(grid_script())
            .args(command)
            .arg(&self.name)
            .output()
            .expect("deploy/grid/hosts.sh");
        assert!(
            output.status.success(),
            "hosts.sh {command:?} {}: {} (is the dev grid up? deploy/sge/hosts.sh)",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Island {
    fn drop(&mut self) {
        let _ = Command::new(grid_script())
            .args(["remove", &self.name])
            .output();
    }
}

fn grid_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grid/hosts.sh")
}

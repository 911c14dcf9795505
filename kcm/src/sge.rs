//! Sun/Son of Grid Engine: launchers as placeholder array jobs.
//!
//! `qsub` submits `m` launchers as one array job named `gl-<job>`, at the
//! lowest priority, with `-notify` (so a `qdel` warns the launcher with
//! SIGUSR2 before it kills it) and the configured `h_rt`. `qstat -xml` is
//! read on every poll; placeholders are recognised by their name alone, so a
//! restarted kcm adopts whatever its predecessor left running.

use std::{path::PathBuf, process::Stdio, time::Duration};

use gleaner_manifest::JobId;
use tokio::{io::AsyncWriteExt, process::Command};

use crate::{
    backend::{Backend, BackendError, ComponentFiles, LauncherCommand, quote},
    qstat,
    snapshot::Snapshot,
};
use gleaner_protocol::{
    ClusterName, ComponentSpec,
    naming::{LauncherArgs, SGE_TASK_ID, component_name, launcher_id_word, placeholder_name},
};

#[derive(Debug, Clone)]
pub struct SgeConfig {
    pub cluster: ClusterName,
    /// The cluster queue placeholders go to (`-q`).
    pub queue: String,
    /// Walltime of each placeholder (`-l h_rt`); launchers drain before it.
    pub h_rt: Option<Duration>,
    /// Where placeholders' stdout/stderr go; discarded when unset.
    pub log_dir: Option<PathBuf>,
    /// How long a batch-system command may take before it counts as failed.
    pub command_timeout: Duration,
    pub launcher: LauncherCommand,
}

pub struct SgeBackend {
    config: SgeConfig,
}

impl SgeBackend {
    pub fn new(config: SgeConfig) -> Self {
        Self { config }
    }

    /// Runs a batch-system command; its failure carries its own output.
    async fn run(
        &self,
        program: &str,
        args: &[String],
        stdin: Option<&str>,
    ) -> Result<String, BackendError> {
        let shown = format!("{program} {}", args.join(" "));
        let failed = |message: String| BackendError {
            command: shown.clone(),
            message,
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (key, default) in [("SGE_ROOT", "/var/lib/gridengine"), ("SGE_CELL", "default")] {
            if std::env::var_os(key).is_none() {
                command.env(key, default);
            }
        }
        let mut child = command.spawn().map_err(|e| failed(e.to_string()))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .await
                .map_err(|e| failed(format!("cannot write the job script: {e}")))?;
        }
        let output = tokio::time::timeout(self.config.command_timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                failed(format!(
                    "no answer within {:?}",
                    self.config.command_timeout
                ))
            })?
            .map_err(|e| failed(e.to_string()))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let said = format!("{} {}", stderr.trim(), stdout.trim());
            return Err(failed(format!("{}: {}", output.status, said.trim())));
        }
        Ok(stdout)
    }

    /// What every submission says: its name and queue, the script on stdin
    /// run by `/bin/sh`, and `-w e`, which refuses a job that could never
    /// run rather than leave it waiting.
    fn qsub_args(&self, name: String) -> Vec<String> {
        vec![
            "-terse".into(),
            "-N".into(),
            name,
            "-q".into(),
            self.config.queue.clone(),
            "-w".into(),
            "e".into(),
            "-S".into(),
            "/bin/sh".into(),
            "-wd".into(),
            std::env::temp_dir().display().to_string(),
        ]
    }

    /// The job script: the launcher, named after its array task.
    fn script(&self, job: &JobId) -> String {
        let c = &self.config;
        let mut script = String::from("#!/bin/sh\n# gleaner placeholder: one launcher\n");
        for (key, value) in &c.launcher.env {
            script.push_str(&format!("export {key}={}\n", quote(value)));
        }
        if let Ok(filter) = std::env::var("RUST_LOG") {
            script.push_str(&format!("export RUST_LOG={}\n", quote(&filter)));
        }
        let mut line = format!("exec {}", quote(&c.launcher.program.to_string_lossy()));
        for arg in &c.launcher.args {
            line.push(' ');
            line.push_str(&quote(arg));
        }
        // The array task's id is only known once it runs: the shell expands it.
        let task = format!("\"{SGE_TASK_ID}\"");
        let cluster = quote(c.cluster.as_str());
        let launcher = LauncherArgs {
            job: &quote(job.as_str()),
            cluster: &cluster,
            id: &launcher_id_word(&cluster, &task),
            slot: &task,
            slots: 1,
            walltime: c.h_rt,
        };
        for arg in launcher.to_vec() {
            line.push(' ');
            line.push_str(&arg);
        }
        script.push_str(&line);
        script.push('\n');
        script
    }
}

impl Backend for SgeBackend {
    fn kind(&self) -> &'static str {
        "sge"
    }

    async fn snapshot(&mut self) -> Result<Snapshot, BackendError> {
        let args: Vec<String> = ["-f", "-r", "-xml", "-q", &self.config.queue, "-u", "*"]
            .map(str::to_owned)
            .to_vec();
        let xml = self.run("qstat", &args, None).await.map_err(|mut e| {
            // qstat exits 1 without a word for a queue that does not exist.
            if e.message.trim_end().ends_with(':') {
                e.message = format!(
                    "{} (no output: is {} a queue of this cell? `qconf -sql` lists them)",
                    e.message.trim_end(),
                    self.config.queue
                );
            }
            e
        })?;
        qstat::snapshot(&xml, &self.config.queue).map_err(|message| BackendError {
            command: format!("qstat {}", args.join(" ")),
            message,
        })
    }

    async fn submit(&mut self, job: &JobId, slots: u32) -> Result<u32, BackendError> {
        if slots == 0 {
            return Ok(0);
        }
        let c = &self.config;
        let mut args = self.qsub_args(placeholder_name(job.as_str()));
        args.extend([
            "-t".into(),
            format!("1-{slots}"),
            "-p".into(),
            "-1023".into(),
            "-notify".into(),
        ]);
        if let Some(h_rt) = c.h_rt {
            args.extend(["-l".into(), format!("h_rt={}", h_rt.as_secs().max(1))]);
        }
        match &c.log_dir {
            Some(dir) => {
                let dir = dir.display();
                args.extend([
                    "-j".into(),
                    "y".into(),
                    "-o".into(),
                    format!("{dir}/$JOB_NAME.$JOB_ID.$TASK_ID.log"),
                ]);
            }
            None => args.extend([
                "-o".into(),
                "/dev/null".into(),
                "-e".into(),
                "/dev/null".into(),
            ]),
        }
        let script = self.script(job);
        let answer = self.run("qsub", &args, Some(&script)).await?;
        // `-terse` answers `4711.1-8:1` for an array job.
        let number = answer.trim().split('.').next().unwrap_or("");
        if number.parse::<u64>().is_err() {
            return Err(BackendError {
                command: format!("qsub {}", args.join(" ")),
                message: format!("unexpected answer {:?}", answer.trim()),
            });
        }
        Ok(slots)
    }

    async fn remove(&mut self, ids: &[String]) -> Result<(), BackendError> {
        for chunk in ids.chunks(100) {
            match self.run("qdel", chunk, None).await {
                Ok(_) => {}
                // Gone already (it ended meanwhile) is what we wanted.
                Err(e) if e.message.contains("does not exist") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn submit_component(
        &mut self,
        spec: &ComponentSpec,
        files: &ComponentFiles,
    ) -> Result<(), BackendError> {
        let mut args = self.qsub_args(component_name(&spec.job, spec.component));
        args.extend([
            "-o".into(),
            "/dev/null".into(),
            "-e".into(),
            "/dev/null".into(),
        ]);
        if spec.slots > 1 {
            args.extend(["-pe".into(), "make".into(), spec.slots.to_string()]);
        }
        if let Some(walltime) = spec.walltime_ms {
            args.extend([
                "-l".into(),
                format!("h_rt={}", walltime.div_ceil(1000).max(1)),
            ]);
        }
        self.run("qsub", &args, Some(&files.script(spec))).await?;
        Ok(())
    }

    /// Placeholders outlive the kcm: the next one adopts them.
    async fn shutdown(&mut self) {}
}

#[cfg(test)]
mod tests {
    use gleaner_protocol::naming::LAUNCHER_SUBCOMMAND;

    use super::*;

    fn backend() -> SgeBackend {
        SgeBackend::new(SgeConfig {
            cluster: "c1".into(),
            queue: "c1.q".into(),
            h_rt: Some(Duration::from_secs(3600)),
            log_dir: None,
            command_timeout: Duration::from_secs(10),
            launcher: LauncherCommand {
                program: "/opt/gleaner's bin/gleaner".into(),
                args: vec![LAUNCHER_SUBCOMMAND.into()],
                env: vec![(
                    "GLEANER_BROKER_URL".into(),
                    "amqp://u:p@h/v?heartbeat=10".into(),
                )],
            },
        })
    }

    #[test]
    fn the_job_script_names_the_launcher_after_its_array_task() {
        let script = backend().script(&"sweep-3fa9c2".parse().unwrap());
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains("export GLEANER_BROKER_URL='amqp://u:p@h/v?heartbeat=10'\n"));
        assert!(
            script
                .contains(r"exec '/opt/gleaner'\''s bin/gleaner' 'launcher' --job 'sweep-3fa9c2'")
        );
        assert!(
            script.contains(r#"--id 'c1'-"$JOB_ID.$SGE_TASK_ID" --slot "$JOB_ID.$SGE_TASK_ID""#)
        );
        assert!(script.trim_end().ends_with("--walltime 3600s"));
    }
}

//! A program in a real terminal: a tmux server of the test's own, gone with
//! it however the test ends.

use std::process::{Command, Output};

pub struct Terminal {
    socket: String,
}

impl Terminal {
    /// Starts `command` (its program, arguments and environment) in a
    /// `width` × `height` terminal.
    pub fn start(command: &Command, width: u16, height: u16) -> Self {
        let terminal = Self {
            socket: format!(
                "gleaner-test-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
        };
        let (width, height) = (width.to_string(), height.to_string());
        let mut args: Vec<String> = [
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            &width,
            "-y",
            &height,
            "env",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(
            command
                .get_envs()
                .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?))),
        );
        args.push(command.get_program().to_string_lossy().into_owned());
        args.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = terminal.tmux(&args);
        assert!(started.status.success(), "{started:?}");
        terminal
    }

    fn tmux(&self, args: &[&str]) -> Output {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket]).args(args);
        command.output().expect("tmux")
    }

    /// What the terminal shows now.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", "t"]).stdout).into_owned()
    }

    pub fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", "t", keys]);
    }

    /// The program has not ended.
    pub fn running(&self) -> bool {
        self.tmux(&["has-session", "-t", "t"]).status.success()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

//! A child process driven by a test: its standard output read line by line
//! on a thread (so no wait can block on a pipe), every wait bounded, and the
//! process killed and reaped when the handle drops (after SIGCONT: a stopped
//! child ignores nothing but SIGKILL, and a zombie would still look alive).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The default bound on a wait for a line: long enough for a crowded
/// 2-core machine, there only so that a broken child fails instead of
/// hanging.
pub const BOUND: Duration = Duration::from_secs(60);

/// This test binary run again on its test `entry` alone (`--exact`), with
/// its output not captured, so the child's role code (selected by
/// environment variables the caller adds) runs in a process of its own.
/// In a consolidated test binary `entry` carries its module path
/// (`"ring_processes::child_entry"`).
pub fn reentry(entry: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command.args([entry, "--exact", "--nocapture", "--test-threads", "1"]);
    command
}

/// A running child process; see the module's comment.
pub struct ChildProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Option<Arc<Mutex<String>>>,
    /// Only lines containing this marker count, and what follows it is the line.
    marker: Option<String>,
    bound: Duration,
    /// On drop, how long the child may take to exit by itself once its
    /// standard input is closed, before it is killed.
    exit_within: Option<Duration>,
}

impl ChildProcess {
    /// Starts `command` with piped standard input and output; standard
    /// error goes where `command` sends it (inherited unless set).
    pub fn spawn(command: &mut Command) -> ChildProcess {
        Self::start(command, false)
    }

    /// Like [`spawn`](Self::spawn), and standard error is collected for
    /// [`stderr`](Self::stderr) (and for the message of a failed wait).
    pub fn spawn_capturing(command: &mut Command) -> ChildProcess {
        Self::start(command, true)
    }

    /// `tierstack` (at `exe`, see [`exe!`](crate::exe)) running the
    /// subcommand and flags `args`, standard error captured.
    pub fn tierstack<S: AsRef<std::ffi::OsStr>>(exe: &std::path::Path, args: &[S]) -> ChildProcess {
        Self::spawn_capturing(Command::new(exe).args(args))
    }

    fn start(command: &mut Command, capture_stderr: bool) -> ChildProcess {
        command.stdin(Stdio::piped()).stdout(Stdio::piped());
        if capture_stderr {
            command.stderr(Stdio::piped());
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = child.stderr.take().map(|mut pipe| {
            let text = Arc::new(Mutex::new(String::new()));
            let sink = Arc::clone(&text);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    let mut text = sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    text.push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            });
            text
        });
        ChildProcess { stdin: child.stdin.take(), child, lines, stderr, marker: None, bound: BOUND, exit_within: None }
    }

    /// Only lines containing `marker` are the child's answers, and each is
    /// what follows the marker (a test binary re-run on one test prints
    /// libtest's own text around the role's).
    pub fn with_marker(mut self, marker: &str) -> ChildProcess {
        self.marker = Some(marker.to_string());
        self
    }

    /// The bound of [`line`](Self::line) (default [`BOUND`]).
    pub fn with_bound(mut self, bound: Duration) -> ChildProcess {
        self.bound = bound;
        self
    }

    /// On drop, close standard input and give the child `within` to exit by
    /// itself before killing it (for children that report on their way out).
    pub fn exit_on_drop_within(mut self, within: Duration) -> ChildProcess {
        self.exit_within = Some(within);
        self
    }

    /// The child's next answer (see [`with_marker`](Self::with_marker)),
    /// within the bound; panics, with the child's state, when none comes.
    pub fn line(&mut self) -> String {
        self.line_within(self.bound)
    }

    /// [`line`](Self::line) with a bound of its own.
    pub fn line_within(&mut self, bound: Duration) -> String {
        let until = tierstack_base::time::instant_now() + bound;
        loop {
            let line = self.next_raw(until, "a line");
            match &self.marker {
                None => return line,
                Some(marker) => {
                    if let Some(at) = line.find(marker.as_str()) {
                        return line[at + marker.len()..].to_string();
                    }
                }
            }
        }
    }

    /// What follows `prefix` on the next line that has it, trimmed (other
    /// lines are skipped), within the bound.
    pub fn line_after(&mut self, prefix: &str) -> String {
        let until = tierstack_base::time::instant_now() + self.bound;
        loop {
            let line = self.next_raw(until, prefix);
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_string();
            }
        }
    }

    /// Waits for the line `ready`, which every `tierstack` service prints
    /// once it serves, skipping other lines.
    pub fn wait_ready(&mut self) {
        let until = tierstack_base::time::instant_now() + self.bound;
        while self.next_raw(until, "ready").trim() != "ready" {}
    }

    fn next_raw(&mut self, until: Instant, awaited: &str) -> String {
        let left = until.saturating_duration_since(tierstack_base::time::instant_now());
        match self.lines.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => panic!(
                "the child did not answer {awaited:?} ({e}); its state: {:?}; its stderr: {}",
                self.child.try_wait(),
                self.stderr()
            ),
        }
    }

    /// Writes `line` to the child's standard input.
    pub fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("standard input still open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Closes the child's standard input (children here exit on that).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Closes its standard input and waits for it to exit.
    pub fn finish(&mut self) -> ExitStatus {
        self.close_stdin();
        self.child.wait().unwrap()
    }

    /// What the child wrote to standard error so far (empty unless captured).
    pub fn stderr(&self) -> String {
        match &self.stderr {
            Some(text) => text.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone(),
            None => String::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (reaping it if so).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Sends `signal`; panics if the child is gone (reaped).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid, which stays reserved for
        // it until it is reaped through `self.child`.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, signal) }, 0, "signal {signal}");
    }

    /// SIGSTOP, returning once every thread of the child is stopped: it
    /// stays alive and answers nothing.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        wait_stopped(self.pid(), self.bound);
    }

    /// SIGCONT after [`stop`](Self::stop).
    pub fn cont(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the child with SIGKILL and reaps it (a zombie would still look alive).
    pub fn kill(&mut self) {
        self.signal(libc::SIGCONT);
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, not yet reaped by us (only
        // `kill`, `finish` and `try_wait` reap, and then this fails harmlessly
        // with ESRCH or reaches the zombie).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
        if let Some(within) = self.exit_within {
            self.stdin.take();
            let until = tierstack_base::time::instant_now() + within;
            while tierstack_base::time::instant_now() < until {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Returns once every thread of process `pid` is stopped (state `T` in its
/// `/proc/<pid>/task/*/stat`); panics after `within`. kill(2) with SIGSTOP
/// only starts a group stop: the thread that takes the signal must run to
/// stop the others, and on a loaded host the rest may serve a request or
/// two meanwhile (CI saw one answered after kill returned).
pub fn wait_stopped(pid: u32, within: Duration) {
    let tasks = format!("/proc/{pid}/task");
    let until = tierstack_base::time::instant_now() + within;
    loop {
        let states: Vec<Option<char>> = std::fs::read_dir(&tasks)
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            // `tid (comm) S ...`: the state follows the last `)`.
            .map(|stat| stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
            .collect();
        if !states.is_empty() && states.iter().all(|state| *state == Some('T')) {
            return;
        }
        assert!(tierstack_base::time::instant_now() < until, "process {pid} never stopped: {states:?}");
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn lines_markers_and_stdin() {
        let mut child = ChildProcess::spawn(&mut sh("echo noise; echo 'x @@one'; read l; echo \"@@got $l\""))
            .with_marker("@@")
            .with_bound(Duration::from_secs(10));
        assert_eq!(child.line(), "one");
        child.tell("two");
        assert_eq!(child.line(), "got two");
        assert!(child.finish().success());
    }

    #[test]
    fn ready_after_other_lines_and_stderr_captured() {
        let mut child = ChildProcess::spawn_capturing(&mut sh("echo starting; echo oops >&2; echo ready; read l"));
        child.wait_ready();
        let until = tierstack_base::time::instant_now() + Duration::from_secs(10);
        while !child.stderr().contains("oops") {
            assert!(tierstack_base::time::instant_now() < until, "stderr not captured");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_stopped_child_is_continued_and_killed_on_drop() {
        let child = ChildProcess::spawn(&mut sh("echo ready; sleep 600"));
        let pid = child.pid() as libc::pid_t;
        child.stop();
        drop(child);
        // SAFETY: signal 0 probes the pid; it was our child, now reaped.
        assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "the child outlived its handle");
    }

    #[test]
    fn wait_stopped_waits_for_every_thread_and_fails_on_a_running_process() {
        let child = ChildProcess::spawn(&mut sh("echo ready; exec sleep 600"));
        let running = std::panic::catch_unwind(|| wait_stopped(child.pid(), Duration::from_millis(50)));
        assert!(running.is_err(), "a running process passed for stopped");
        child.stop();
        wait_stopped(child.pid(), Duration::from_millis(50));
    }
}

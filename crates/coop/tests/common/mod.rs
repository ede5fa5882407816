//! A child process of a multi-process coop test: the test binary re-run on
//! its `child_entry` test, driven over stdin with `run <seed> <n>` and
//! answering `ready` once and `done <served> <wrong> <remote>` per run.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};

pub(crate) struct Kid {
    pub child: Child,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Kid {
    /// Starts child `id` with `envs` and waits for its `ready` line.
    pub(crate) fn spawn(id: u32, envs: &[(&str, String)]) -> Kid {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // libtest may print "test child_entry ... " before the child's line.
        assert!(lines.by_ref().map(Result::unwrap).any(|l| l.ends_with("ready")), "child {id} never got ready");
        Kid { child, lines }
    }

    pub(crate) fn start_run(&mut self, seed: u64, n: u64) {
        writeln!(self.child.stdin.as_mut().unwrap(), "run {seed} {n}").unwrap();
    }

    /// (served, wrong, remote hits) of the run started last.
    pub(crate) fn finish_run(&mut self) -> (u64, u64, u64) {
        let line = self.lines.by_ref().map(Result::unwrap).find(|l| l.contains("done ")).expect("child died");
        let done = &line[line.find("done ").unwrap_or(0)..];
        let v: Vec<u64> = done.split_whitespace().skip(1).map(|w| w.parse().unwrap()).collect();
        (v[0], v[1], v[2])
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

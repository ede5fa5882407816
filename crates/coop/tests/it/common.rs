//! A child process of a multi-process coop test: the test binary re-run on
//! one of its `child_entry` tests, driven over stdin with `run <seed> <n>`
//! and answering `ready` once and `done <served> <wrong> <remote>` per run.

use std::time::Duration;
use tierstack_testkit::child::{self, ChildProcess};

/// A bound on a run's wait, only so that a hung child fails the test.
const RUN_BOUND: Duration = Duration::from_secs(600);

pub(crate) struct Kid {
    pub child: ChildProcess,
}

impl Kid {
    /// Starts a child on the test `entry` with `envs` and waits for its
    /// `ready` line.
    pub(crate) fn spawn(entry: &str, envs: &[(&str, String)]) -> Kid {
        let mut command = child::reentry(entry);
        command.envs(envs.iter().map(|(k, v)| (*k, v.as_str())));
        let mut child = ChildProcess::spawn(&mut command).with_bound(RUN_BOUND);
        // libtest may print "test child_entry ... " before the child's line.
        while !child.line().ends_with("ready") {}
        Kid { child }
    }

    pub(crate) fn start_run(&mut self, seed: u64, n: u64) {
        self.child.tell(&format!("run {seed} {n}"));
    }

    /// (served, wrong, remote hits) of the run started last.
    pub(crate) fn finish_run(&mut self) -> (u64, u64, u64) {
        let done = self.child.line_after("done ");
        let v: Vec<u64> = done.split_whitespace().map(|w| w.parse().unwrap()).collect();
        (v[0], v[1], v[2])
    }
}

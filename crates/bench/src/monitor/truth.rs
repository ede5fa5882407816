//! Fig. 8a's ground truth: an observer that shares no code or memory with
//! the monitoring schemes.
//!
//! The paper compares each scheme with "the actual number of threads
//! running on the remote node". Here that is the kernel's view of the back
//! end's threads: an [`Observer`] thread in the bench process scans
//! `/proc/<pid>/task/*/stat` as often as it can (a scan every
//! [`Observer::start`]'s `every`, back to back when a scan takes longer),
//! counts the tasks in state `R` (running or runnable) whose name is
//! `worker-*` or `compute-*` ([`counts_as_running`]), and records each scan
//! as a [`Scan`]: when it started, when it ended (`CLOCK_MONOTONIC`, the
//! clock the front end stamps its readings with) and the count. It uses
//! nothing of `tierstack_monitor` (not its `/proc` parsers, not its region,
//! not its counters): a bug there cannot hide here.
//!
//! The task name comes from `stat`'s second field, the same `comm` string
//! as `/proc/<pid>/task/<tid>/comm`, so one read per task gives both name
//! and state at one instant. `comm` may hold spaces and parentheses: the
//! state is the field after the **last** `)` ([`parse_task_stat`]).
//!
//! A scan is not an instant: it reads the tasks one after another, so its
//! count is the truth over [`Scan::start_ns`]..=[`Scan::end_ns`], and the
//! table reports that resolution ([`Resolution`]). The pure join
//! ([`Truth::at`], [`join`]) gives each reading the scan covering its time
//! of use, or the nearest one within a bound.

use std::collections::hash_map::{Entry, HashMap};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tierstack_base::host_monotonic_ns;

/// Why the observer or the join refused.
#[derive(Debug)]
pub enum TruthError {
    /// `/proc` could not be read (the process is gone, or no `/proc`).
    Proc { path: PathBuf, source: std::io::Error },
    /// Scan `index` ends before it starts, or starts before the previous one ended.
    Unordered { index: usize },
    /// The observer thread panicked.
    Panicked,
}

impl fmt::Display for TruthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TruthError::Proc { path, source } => write!(f, "reading {}: {source}", path.display()),
            TruthError::Unordered { index } => {
                write!(f, "scan {index} is not after the previous one or ends before it starts")
            }
            TruthError::Panicked => write!(f, "the observer thread panicked"),
        }
    }
}

impl std::error::Error for TruthError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TruthError::Proc { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// One scan of the back end's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Scan {
    /// Before the task list was read (`CLOCK_MONOTONIC`, ns).
    pub start_ns: u64,
    /// After the last task's `stat` was read.
    pub end_ns: u64,
    /// Tasks counted as running ([`counts_as_running`]).
    pub running: u32,
}

/// A task's name (`comm`) and state letter from the text of its
/// `/proc/<pid>/task/<tid>/stat`: `tid (comm) S ...`. The name is between
/// the first `(` and the **last** `)` (a name may hold either); the state is
/// the first field after it. `None` if the text does not have that shape.
pub fn parse_task_stat(text: &str) -> Option<(&str, char)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?;
    let state = text.get(close + 1..)?.split_ascii_whitespace().next()?;
    let mut letters = state.chars();
    let letter = letters.next()?;
    letters.next().is_none().then_some((name, letter))
}

/// The threads the paper counts: the back end's busy workers and compute
/// threads, those the kernel has running or runnable (`R`).
pub fn counts_as_running(name: &str, state: char) -> bool {
    state == 'R' && (name.starts_with("worker-") || name.starts_with("compute-"))
}

/// The tasks of one process, each `stat` kept open: a scan lists the task
/// directory (threads come and go) and re-reads each file at offset 0,
/// which makes the kernel render it afresh, so a scan costs one `pread`
/// per task instead of an open, a read and a close (a shorter scan is a
/// sharper truth).
struct TaskDir {
    path: PathBuf,
    open: HashMap<String, File>,
    text: Vec<u8>,
}

impl TaskDir {
    fn new(path: PathBuf) -> Self {
        TaskDir { path, open: HashMap::new(), text: vec![0; 1024] }
    }

    /// One scan: the tasks counted. A task that ends during the scan is
    /// skipped (and forgotten).
    fn scan(&mut self) -> Result<u32, TruthError> {
        let proc_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TruthError::Proc { path, source }
        };
        let mut listed = Vec::with_capacity(self.open.len());
        for entry in std::fs::read_dir(&self.path).map_err(proc_error(&self.path))? {
            let entry = entry.map_err(proc_error(&self.path))?;
            listed.push(entry.file_name().to_string_lossy().into_owned());
        }
        self.open.retain(|tid, _| listed.contains(tid));
        let mut running = 0;
        for tid in listed {
            let file = match self.open.entry(tid) {
                Entry::Occupied(file) => file.into_mut(),
                Entry::Vacant(slot) => match File::open(self.path.join(slot.key()).join("stat")) {
                    Ok(file) => slot.insert(file),
                    Err(_) => continue, // gone between the listing and the open
                },
            };
            let Ok(bytes) = file.read_at(&mut self.text, 0) else { continue };
            let text = self.text.get(..bytes).and_then(|t| std::str::from_utf8(t).ok());
            if text.and_then(parse_task_stat).is_some_and(|(name, state)| counts_as_running(name, state)) {
                running += 1;
            }
        }
        Ok(running)
    }
}

/// The observer: a thread scanning one process's tasks until stopped.
pub struct Observer {
    stop: Arc<AtomicBool>,
    scans: Arc<AtomicU64>,
    thread: JoinHandle<Result<Vec<Scan>, TruthError>>,
}

impl Observer {
    /// Starts scanning process `pid` every `every` (back to back when a scan
    /// takes longer). Fails at once if its task list cannot be read.
    pub fn start(pid: u32, every: Duration) -> Result<Observer, TruthError> {
        let mut tasks = TaskDir::new(PathBuf::from(format!("/proc/{pid}/task")));
        tasks.scan()?;
        let stop = Arc::new(AtomicBool::new(false));
        let scans = Arc::new(AtomicU64::new(0));
        let (stopping, counted) = (stop.clone(), scans.clone());
        let thread = std::thread::Builder::new()
            .name("truth-observer".into())
            .spawn(move || {
                let mut log = Vec::new();
                let mut next = tierstack_base::time::instant_now();
                while !stopping.load(Ordering::Relaxed) {
                    let start_ns = host_monotonic_ns();
                    let running = tasks.scan()?;
                    log.push(Scan { start_ns, end_ns: host_monotonic_ns(), running });
                    counted.fetch_add(1, Ordering::Release);
                    // The observer's own pacing (a sampling period, not a synchronization).
                    next += every;
                    let now = tierstack_base::time::instant_now();
                    match next.checked_duration_since(now) {
                        Some(wait) => std::thread::sleep(wait),
                        None => next = now,
                    }
                }
                Ok(log)
            })
            .map_err(|source| TruthError::Proc { path: PathBuf::from("(observer thread)"), source })?;
        Ok(Observer { stop, scans, thread })
    }

    /// Scans made so far.
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Acquire)
    }

    /// Stops the thread; its scans in order.
    pub fn stop(self) -> Result<Vec<Scan>, TruthError> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| TruthError::Panicked)?
    }
}

/// The truth over a run: scans in order, none overlapping the next.
#[derive(Clone, Debug)]
pub struct Truth {
    scans: Vec<Scan>,
}

/// How finely the truth is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Resolution {
    pub scans: usize,
    /// Duration of one scan, µs: the truth is the count over that window.
    pub scan_us_p50: f64,
    pub scan_us_p99: f64,
    /// From one scan's start to the next one's.
    pub period_us_p50: f64,
    /// Mean count.
    pub running_mean: f64,
}

impl Truth {
    /// Checks that every scan ends at or after its start and starts at or
    /// after the previous one ended (what one observer thread produces).
    pub fn new(scans: Vec<Scan>) -> Result<Truth, TruthError> {
        for (index, scan) in scans.iter().enumerate() {
            let after_previous = index == 0 || scans[index - 1].end_ns <= scan.start_ns;
            if scan.end_ns < scan.start_ns || !after_previous {
                return Err(TruthError::Unordered { index });
            }
        }
        Ok(Truth { scans })
    }

    pub fn scans(&self) -> &[Scan] {
        &self.scans
    }

    /// The scan that covers `t_ns` (start ≤ t ≤ end), or else the nearest
    /// one if it is within `max_gap_ns`; of equally near scans, the first.
    pub fn at(&self, t_ns: u64, max_gap_ns: u64) -> Option<&Scan> {
        let scans = &self.scans;
        // Ends are in order too: those before `first_not_before` end before t.
        let first_not_before = scans.partition_point(|s| s.end_ns < t_ns);
        let after = scans.get(first_not_before);
        if let Some(scan) = after.filter(|s| s.start_ns <= t_ns) {
            return Some(scan);
        }
        let before = first_not_before.checked_sub(1).map(|last| {
            // The first of the scans ending where the last one before t does.
            let end = scans[last].end_ns;
            &scans[scans.partition_point(|s| s.end_ns < end)]
        });
        let nearest = match (before, after) {
            (Some(b), Some(a)) if a.start_ns - t_ns < t_ns - b.end_ns => a,
            (Some(b), _) => b,
            (None, Some(a)) => a,
            (None, None) => return None,
        };
        let gap = if nearest.start_ns > t_ns { nearest.start_ns - t_ns } else { t_ns - nearest.end_ns };
        (gap <= max_gap_ns).then_some(nearest)
    }

    /// Scan durations, periods and the mean count.
    pub fn resolution(&self) -> Resolution {
        let scans = &self.scans;
        if scans.is_empty() {
            return Resolution::default();
        }
        let us = |mut ns: Vec<u64>, pct| {
            ns.sort_unstable();
            tierstack_stats::percentile(&ns, pct) as f64 / 1000.0
        };
        let durations: Vec<u64> = scans.iter().map(|s| s.end_ns - s.start_ns).collect();
        let periods: Vec<u64> = scans.windows(2).map(|w| w[1].start_ns - w[0].start_ns).collect();
        Resolution {
            scans: scans.len(),
            scan_us_p50: us(durations.clone(), 50.0),
            scan_us_p99: us(durations, 99.0),
            period_us_p50: us(periods, 50.0),
            running_mean: scans.iter().map(|s| f64::from(s.running)).sum::<f64>() / scans.len() as f64,
        }
    }
}

/// Reported − truth for each `(time of use, reported)`, as (time,
/// deviation); readings with no scan within `max_gap_ns` are left out.
pub fn join(truth: &Truth, readings: &[(u64, i64)], max_gap_ns: u64) -> Vec<(u64, i64)> {
    readings
        .iter()
        .filter_map(|&(t_ns, reported)| {
            truth.at(t_ns, max_gap_ns).map(|scan| (t_ns, reported - i64::from(scan.running)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan(start_ns: u64, end_ns: u64, running: u32) -> Scan {
        Scan { start_ns, end_ns, running }
    }

    #[test]
    fn the_state_follows_the_last_parenthesis_of_the_name() {
        let plain = "4242 (worker-3) R 4200 4200 4200 0 -1 4194368 0 0 0 0 12 3 0 0 20 0 70 0";
        assert_eq!(parse_task_stat(plain), Some(("worker-3", 'R')));
        // A name is any 15 bytes: spaces, and parentheses that look like the end.
        assert_eq!(parse_task_stat("7 (a) R (b) S 1 2 3"), Some(("a) R (b", 'S')));
        assert_eq!(parse_task_stat("8 (compute 1) R 1 1"), Some(("compute 1", 'R')));
        assert_eq!(parse_task_stat("9 ()) D 0"), Some((")", 'D')));
        assert_eq!(parse_task_stat("10 (tokio-rt) S"), Some(("tokio-rt", 'S')));
    }

    #[test]
    fn a_stat_without_its_shape_is_refused() {
        for text in ["", "12", "12 (worker-1", "12 worker-1) R", "12 (worker-1)", "12 (worker-1)   ", "12 (w) RS 1"] {
            assert_eq!(parse_task_stat(text), None, "{text:?}");
        }
    }

    #[test]
    fn only_running_workers_and_compute_threads_count() {
        assert!(counts_as_running("worker-0", 'R'));
        assert!(counts_as_running("compute-199", 'R'));
        assert!(!counts_as_running("worker-0", 'S'), "blocked on its condvar");
        assert!(!counts_as_running("compute-3", 'T'), "stopped");
        assert!(!counts_as_running("walk", 'R'));
        assert!(!counts_as_running("tierstack", 'R'), "the main thread");
        assert!(!counts_as_running("my worker-1", 'R'));
    }

    /// A scan counts over a task directory: fixed `stat` texts, one task
    /// without a `stat` (it ended between the listing and the read).
    #[test]
    fn a_scan_counts_the_running_workers_and_compute_threads_of_a_task_directory() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = [
            ("100", Some("100 (tierstack) S 1 100")),
            ("101", Some("101 (worker-0) R 1 100")),
            ("102", Some("102 (worker-1) S 1 100")),
            ("103", Some("103 (compute-0) R 1 100")),
            ("104", Some("104 (walk) R 1 100")),
            ("105", Some("105 (compute-1) R 1 100")),
            ("106", None),
        ];
        for (tid, stat) in tasks {
            std::fs::create_dir(dir.path().join(tid)).unwrap();
            if let Some(text) = stat {
                std::fs::write(dir.path().join(tid).join("stat"), text).unwrap();
            }
        }
        let mut tasks = TaskDir::new(dir.path().to_path_buf());
        assert_eq!(tasks.scan().unwrap(), 3);
        // Re-read in place: a task changed, another ended.
        std::fs::write(dir.path().join("102").join("stat"), "102 (worker-1) R 1 100").unwrap();
        std::fs::remove_dir_all(dir.path().join("105")).unwrap();
        assert_eq!(tasks.scan().unwrap(), 3);
        assert_eq!(tasks.open.len(), 5, "the ended task is forgotten");
        assert!(matches!(TaskDir::new(dir.path().join("nope")).scan(), Err(TruthError::Proc { .. })));
    }

    /// This thread's state letter, from /proc.
    fn own_state(tid: i32) -> Option<char> {
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        parse_task_stat(&text).map(|(_, state)| state)
    }

    /// The observer reads a real task list, this test process's own (nextest
    /// runs each test in a process of its own): one thread named
    /// `compute-t` spins (R), one named `worker-t` blocks (S). Once both
    /// have started and the blocked one is seen sleeping, every scan counts
    /// exactly one.
    #[test]
    fn the_observer_counts_a_spinning_thread_and_not_a_blocked_one() {
        let stop = Arc::new(AtomicBool::new(false));
        // One channel per thread: which one says its tid first is up to the
        // scheduler.
        let (started, running) = std::sync::mpsc::channel::<i32>();
        let (sleeping, asleep) = std::sync::mpsc::channel::<i32>();
        let spinning = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("compute-t".into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    started.send(unsafe { libc::gettid() }).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
                .unwrap()
        };
        let (hold, wait) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::Builder::new()
            .name("worker-t".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                sleeping.send(unsafe { libc::gettid() }).unwrap();
                let _ = wait.recv();
            })
            .unwrap();
        let _spinner = running.recv().unwrap();
        let sleeper = asleep.recv().unwrap();
        let deadline = tierstack_base::time::instant_now() + Duration::from_secs(20);
        // Poll /proc until the blocked thread is asleep in its recv.
        while own_state(sleeper) != Some('S') {
            assert!(tierstack_base::time::instant_now() < deadline, "worker-t never blocked");
            std::thread::yield_now();
        }
        let observer = Observer::start(std::process::id(), Duration::from_millis(1)).unwrap();
        while observer.scans() < 50 && tierstack_base::time::instant_now() < deadline {
            std::thread::yield_now();
        }
        let scans = observer.stop().unwrap();
        stop.store(true, Ordering::Relaxed);
        drop(hold);
        spinning.join().unwrap();
        blocked.join().unwrap();
        assert!(!scans.is_empty());
        assert!(scans.iter().all(|s| s.running == 1), "{:?}", &scans[..scans.len().min(20)]);
        Truth::new(scans).unwrap();
    }

    #[test]
    fn a_gone_process_is_a_typed_error() {
        // Pid 0 has no /proc entry.
        assert!(matches!(Observer::start(0, Duration::from_millis(1)), Err(TruthError::Proc { .. })));
    }

    #[test]
    fn overlapping_or_reversed_scans_are_refused() {
        assert!(matches!(Truth::new(vec![scan(5, 4, 0)]), Err(TruthError::Unordered { index: 0 })));
        assert!(matches!(Truth::new(vec![scan(0, 10, 0), scan(9, 12, 0)]), Err(TruthError::Unordered { index: 1 })));
        Truth::new(vec![scan(0, 10, 0), scan(10, 10, 0), scan(10, 12, 0)]).unwrap();
    }

    #[test]
    fn a_reading_takes_the_covering_scan_or_the_nearest_within_the_gap() {
        let truth = Truth::new(vec![scan(10, 20, 1), scan(30, 40, 2), scan(50, 60, 3)]).unwrap();
        let at = |t| truth.at(t, 5).map(|s| s.running);
        assert_eq!(at(10), Some(1), "a scan covers its start");
        assert_eq!(at(40), Some(2), "and its end");
        assert_eq!(at(22), Some(1), "nearer the end of the first");
        assert_eq!(at(25), Some(1), "equally near: the first");
        assert_eq!(at(27), Some(2));
        assert_eq!(at(5), Some(1));
        assert_eq!(at(4), None, "too far before the first scan");
        assert_eq!(at(66), None, "too far after the last");
        let readings = [(15, 4), (35, 0), (99, 7)];
        assert_eq!(join(&truth, &readings, 5), vec![(15, 3), (35, -2)]);
        let empty = Truth::new(Vec::new()).unwrap();
        assert_eq!(empty.at(3, u64::MAX), None);
        assert_eq!(empty.resolution(), Resolution::default());
    }

    #[test]
    fn the_resolution_is_the_scans_durations() {
        let truth = Truth::new(vec![scan(0, 1000, 1), scan(2000, 5000, 3), scan(6000, 7000, 2)]).unwrap();
        let r = truth.resolution();
        assert_eq!(r.scans, 3);
        assert_eq!((r.scan_us_p50, r.scan_us_p99), (1.0, 3.0));
        assert_eq!(r.period_us_p50, 2.0);
        assert_eq!(r.running_mean, 2.0);
    }

    /// Scans back to back with gaps, both possibly zero (ties everywhere).
    fn scans() -> impl Strategy<Value = Vec<Scan>> {
        proptest::collection::vec((0u64..6, 0u64..6, 0u32..5), 0..12).prop_map(|steps| {
            let mut t = 0;
            steps
                .into_iter()
                .map(|(gap, length, running)| {
                    t += gap;
                    let s = scan(t, t + length, running);
                    t += length;
                    s
                })
                .collect()
        })
    }

    proptest! {
        /// Against a brute force: the first scan at the least distance.
        #[test]
        fn the_join_agrees_with_a_brute_force(scans in scans(), t in 0u64..80, max_gap in 0u64..8) {
            let distance = |s: &Scan| if t < s.start_ns { s.start_ns - t } else { t.saturating_sub(s.end_ns) };
            let expected = scans
                .iter()
                .enumerate()
                .min_by_key(|(i, s)| (distance(s), *i))
                .filter(|(_, s)| distance(s) <= max_gap)
                .map(|(i, _)| i);
            let truth = Truth::new(scans.clone()).unwrap();
            let got = truth.at(t, max_gap).map(|s| {
                // Identify the scan by address: equal scans are different scans.
                truth.scans().iter().position(|x| std::ptr::eq(x, s)).unwrap()
            });
            prop_assert_eq!(got, expected);
        }
    }
}

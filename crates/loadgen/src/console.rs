//! A run as `tierstack load` shows it on a terminal: stopped by Ctrl-C (the
//! report still comes, of what ran), with a once-a-second progress line on
//! standard error when asked (req/s, hit rate, updates, errors, stale
//! responses of the last second, from [`LiveStats`]).

use crate::{run_with, LiveSnapshot, LiveStats, LoadConfig, LoadError, LoadReport};
use std::sync::Arc;
use std::time::Duration;

/// The progress line after `seconds` seconds, `now` against a second ago (`last`).
pub fn progress_line(seconds: u64, last: &LiveSnapshot, now: &LiveSnapshot) -> String {
    let (hits, misses) = (now.hits - last.hits, now.misses - last.misses);
    let hit =
        if hits + misses > 0 { format!("{:.1} %", 100.0 * hits as f64 / (hits + misses) as f64) } else { "n/a".into() };
    format!(
        "\r{seconds:>4} s  {:>8} req/s  hit {hit:>7}  updates {:>5}  errors {:>6}  stale {}   ",
        now.ok - last.ok,
        now.updates,
        now.errors,
        now.stale
    )
}

/// Runs `config` until it ends or Ctrl-C, printing [`progress_line`]s to
/// standard error every second if `progress`.
pub async fn run_until_interrupted(config: LoadConfig, progress: bool) -> Result<LoadReport, LoadError> {
    let live = Arc::new(LiveStats::default());
    let progress = progress.then(|| {
        let live = live.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let (mut last, mut seconds) = (live.snapshot(), 0u64);
            loop {
                tick.tick().await;
                seconds += 1;
                let now = live.snapshot();
                eprint!("{}", progress_line(seconds, &last, &now));
                last = now;
            }
        })
    });
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let report = run_with(config, live, shutdown).await;
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_shows_the_last_second_and_the_totals() {
        let last = LiveSnapshot { ok: 100, hits: 50, misses: 50, ..LiveSnapshot::default() };
        let now = LiveSnapshot { ok: 300, hits: 200, misses: 100, updates: 3, errors: 1, stale: 0, requests: 301 };
        let line = progress_line(2, &last, &now);
        assert_eq!(line, "\r   2 s       200 req/s  hit  75.0 %  updates     3  errors      1  stale 0   ");
        assert!(progress_line(1, &now, &now).contains("hit     n/a"), "no responses: no hit rate");
    }
}

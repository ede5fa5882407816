//! The kernel's view of the host's load, read from `/proc` by the async
//! schemes' monitor thread. Linux lets no user process register kernel
//! memory, so these fields reach a front end only through a sampler (seed-notes
//! b.8 #3); the parsers are pure and tested on fixed texts.

use crate::record::KernelSample;

/// CPU time counters of the `cpu` line of `/proc/stat`, in ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub total: u64,
    /// Idle plus iowait.
    pub idle: u64,
}

/// Parses `/proc/stat`: the aggregate `cpu` line and `procs_running`.
pub fn parse_stat(text: &str) -> (Option<CpuTicks>, Option<u32>) {
    let mut ticks = None;
    let mut running = None;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        match fields.next() {
            Some("cpu") => {
                let values: Vec<u64> = fields.map_while(|f| f.parse().ok()).collect();
                if values.len() >= 4 {
                    // user nice system idle iowait irq softirq steal [guest guest_nice]:
                    // guest time is already inside user and nice.
                    let counted = &values[..values.len().min(8)];
                    let idle = values[3] + values.get(4).copied().unwrap_or(0);
                    ticks = Some(CpuTicks { total: counted.iter().sum(), idle });
                }
            }
            Some("procs_running") => running = fields.next().and_then(|f| f.parse().ok()),
            _ => {}
        }
    }
    (ticks, running)
}

/// Busy share between two readings of the `cpu` line, in ‰; `None` if no
/// time passed or the counters went backwards.
pub fn busy_permille(before: CpuTicks, after: CpuTicks) -> Option<u32> {
    let total = after.total.checked_sub(before.total)?;
    let idle = after.idle.checked_sub(before.idle)?;
    if total == 0 || idle > total {
        return None;
    }
    u32::try_from((total - idle) * 1000 / total).ok()
}

/// `MemAvailable` of `/proc/meminfo`, in KiB.
pub fn parse_mem_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// `some avg10` of `/proc/pressure/cpu`, in hundredths of a percent.
pub fn parse_psi_some_avg10(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    let value = line.split_ascii_whitespace().find_map(|f| f.strip_prefix("avg10="))?;
    let (whole, fraction) = value.split_once('.').unwrap_or((value, "0"));
    let whole: u32 = whole.parse().ok()?;
    let mut fraction: String = fraction.chars().take(2).collect();
    while fraction.len() < 2 {
        fraction.push('0');
    }
    whole.checked_mul(100)?.checked_add(fraction.parse().ok()?)
}

/// Reads `/proc` and remembers the previous CPU ticks for the busy share.
#[derive(Debug, Default)]
pub struct KernelSampler {
    previous: Option<CpuTicks>,
}

impl KernelSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// One sample. Fields this host does not expose stay `None`; the first
    /// sample has no busy share (it needs two readings).
    pub fn sample(&mut self) -> KernelSample {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let (ticks, procs_running) = read("/proc/stat").map(|t| parse_stat(&t)).unwrap_or((None, None));
        let cpu_busy_permille = match (self.previous, ticks) {
            (Some(before), Some(after)) => busy_permille(before, after),
            _ => None,
        };
        if ticks.is_some() {
            self.previous = ticks;
        }
        KernelSample {
            procs_running,
            cpu_busy_permille,
            mem_available_kib: read("/proc/meminfo").and_then(|t| parse_mem_available(&t)),
            psi_cpu_some_centi: read("/proc/pressure/cpu").and_then(|t| parse_psi_some_avg10(&t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 40 1 2 3 7 0\ncpu0 50 2 25 400 20 0 1 1 0 0\n\
        intr 1 2 3\nctxt 99\nprocs_running 7\nprocs_blocked 1\n";

    #[test]
    fn stat_gives_ticks_without_guest_time_and_procs_running() {
        let (ticks, running) = parse_stat(STAT);
        assert_eq!(ticks, Some(CpuTicks { total: 100 + 5 + 50 + 800 + 40 + 1 + 2 + 3, idle: 840 }));
        assert_eq!(running, Some(7));
        assert_eq!(parse_stat("garbage\n"), (None, None));
        assert_eq!(parse_stat("cpu 1 2\nprocs_running x\n"), (None, None));
    }

    #[test]
    fn busy_share_is_the_non_idle_part_of_the_elapsed_ticks() {
        let before = CpuTicks { total: 1000, idle: 900 };
        assert_eq!(busy_permille(before, CpuTicks { total: 2000, idle: 1150 }), Some(750));
        assert_eq!(busy_permille(before, before), None, "no time passed");
        assert_eq!(busy_permille(before, CpuTicks { total: 999, idle: 900 }), None, "backwards");
    }

    #[test]
    fn meminfo_and_psi_parse() {
        assert_eq!(parse_mem_available("MemTotal: 10 kB\nMemAvailable:   123456 kB\n"), Some(123456));
        assert_eq!(parse_mem_available("MemTotal: 10 kB\n"), None);
        let psi = "some avg10=12.34 avg60=1.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi_some_avg10(psi), Some(1234));
        assert_eq!(parse_psi_some_avg10("some avg10=5.5 total=1\n"), Some(550));
        assert_eq!(parse_psi_some_avg10("some avg10=7 total=1\n"), Some(700));
        assert_eq!(parse_psi_some_avg10("full avg10=1.00\n"), None);
        assert_eq!(parse_psi_some_avg10("some avg10=x.1\n"), None);
    }

    #[test]
    fn this_host_gives_a_sample_with_a_busy_share_on_the_second_reading() {
        let mut sampler = KernelSampler::new();
        let first = sampler.sample();
        assert_eq!(first.cpu_busy_permille, None);
        if first.procs_running.is_some() {
            // Linux: /proc/stat exists; keep the CPU busy until the ticks move.
            let mut second = sampler.sample();
            let mut spins = 0u64;
            while second.cpu_busy_permille.is_none() && spins < 1_000_000_000 {
                spins = std::hint::black_box(spins + 1);
                if spins.is_multiple_of(1_000_000) {
                    second = sampler.sample();
                }
            }
            assert!(second.cpu_busy_permille.is_some_and(|p| p <= 1000));
        }
    }
}

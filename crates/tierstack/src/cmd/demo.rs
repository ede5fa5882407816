//! `tierstack demo`: the paper's 2-tier data-center on this machine, under
//! load, told as a comparison with a checked result. The orchestration is
//! `tierstack_bench::demo_run`; this file hands it the executable and the
//! command line.

use anyhow::Result;

pub(crate) use tierstack_bench::demo_run::DemoArgs;

pub(crate) fn run(args: DemoArgs) -> Result<()> {
    tierstack_bench::demo_run::run(&args, &std::env::current_exe()?, command_line())
}

/// How this run was started, as a person would type it again.
fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("$ tierstack {}", args.join(" "))
}

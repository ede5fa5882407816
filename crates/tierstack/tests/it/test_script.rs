//! `./scripts/test`, the README's second command, sets itself up on a
//! machine with a Rust toolchain and no cargo-nextest.
//!
//! Each test runs the script with cargo-nextest removed from what cargo can
//! find (every `PATH` directory holding it is replaced by a copy without it,
//! and so is `$CARGO_HOME/bin`), the real toolchain otherwise, and a stand-in
//! for `cargo install` only: installing nextest for real takes minutes and
//! the network. The stand-in either "installs" a recording nextest or fails.
//! The fallback's real `cargo test` runs in a one-crate scratch project with
//! its own target directory, so it never rebuilds binaries other tests run.

use std::ffi::OsString;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const NEXTEST: &str = "cargo-nextest";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test")
}

/// A copy of `dir` (symlinks to its entries) without `left_out`, inside `into`.
fn mirror_without(dir: &Path, left_out: &str, into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_name() != left_out {
            symlink(entry.path(), into.join(entry.file_name())).unwrap();
        }
    }
    into.to_path_buf()
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// An environment with the toolchain but without cargo-nextest, and a
/// `cargo` whose `install` is a stand-in; everything it does is logged.
struct Sandbox {
    _dir: tempfile::TempDir,
    /// First on PATH: the `cargo` stand-in, and where it "installs" nextest.
    shim: PathBuf,
    path: OsString,
    cargo_home: Option<PathBuf>,
    log: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let shim = dir.path().join("shim");
        std::fs::create_dir(&shim).unwrap();
        let mut entries = vec![shim.clone()];
        for (i, entry) in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).enumerate() {
            if entry.join(NEXTEST).exists() {
                entries.push(mirror_without(&entry, NEXTEST, &dir.path().join(format!("path{i}"))));
            } else {
                entries.push(entry);
            }
        }
        // cargo also looks for subcommands in $CARGO_HOME/bin.
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
        let cargo_home = home.filter(|h| h.join("bin").join(NEXTEST).exists()).map(|home| {
            let mirror = mirror_without(&home, "bin", &dir.path().join("cargo-home"));
            mirror_without(&home.join("bin"), NEXTEST, &mirror.join("bin"));
            mirror
        });
        let log = dir.path().join("log");
        std::fs::write(&log, "").unwrap();
        write_executable(
            &shim.join("cargo"),
            &format!(
                "#!/bin/sh\n\
                 # cargo, except that `cargo install` is a stand-in: it logs its arguments and then\n\
                 # either installs a cargo-nextest that logs its own, or fails.\n\
                 if [ \"$1\" = install ]; then\n\
                 \x20 echo \"cargo $*\" >> '{log}'\n\
                 \x20 if [ \"$STAND_IN_INSTALL\" = ok ]; then\n\
                 \x20   printf '#!/bin/sh\\necho \"cargo-nextest $*\" >> %s\\n' '{log}' > '{nextest}'\n\
                 \x20   chmod +x '{nextest}'\n\
                 \x20   exit 0\n\
                 \x20 fi\n\
                 \x20 echo 'error: failed to install cargo-nextest (stand-in)' >&2\n\
                 \x20 exit 101\n\
                 fi\n\
                 exec '{cargo}' \"$@\"\n",
                log = log.display(),
                nextest = shim.join(NEXTEST).display(),
                cargo = env!("CARGO"),
            ),
        );
        let path = std::env::join_paths(entries).unwrap();
        Sandbox { _dir: dir, shim, path, cargo_home, log }
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.env("PATH", &self.path);
        if let Some(home) = &self.cargo_home {
            command.env("CARGO_HOME", home);
        }
        command
    }

    /// Runs `./scripts/test args`, the install stand-in succeeding or not.
    fn run_script(&self, install_succeeds: bool, args: &[&str]) -> Output {
        let mut command = self.command(script());
        command.args(args).env("STAND_IN_INSTALL", if install_succeeds { "ok" } else { "fail" });
        command.output().unwrap()
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log).unwrap().lines().map(str::to_string).collect()
    }

    /// The real toolchain's view: is there a `cargo nextest`?
    fn nextest_found(&self) -> bool {
        self.command(env!("CARGO")).args(["nextest", "--version"]).output().unwrap().status.success()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn without_nextest_the_script_installs_it_and_runs_the_tests_through_it() {
    let sandbox = Sandbox::new();
    assert!(!sandbox.nextest_found(), "the sandbox hides cargo-nextest from cargo");
    let output = sandbox.run_script(true, &[]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("cargo-nextest is missing; installing it"), "{stderr}");
    assert!(!stderr.contains("notice"), "no fallback: {stderr}");
    assert!(sandbox.shim.join(NEXTEST).exists(), "the stand-in installed a nextest on PATH");
    assert_eq!(
        sandbox.log(),
        [
            "cargo install --locked cargo-nextest",
            "cargo-nextest nextest --version",
            "cargo-nextest nextest run --workspace --no-fail-fast",
        ],
        "installed, found, and the workspace's tests ran through it"
    );
    // Installed once: the next run goes straight to it, testing only the
    // package it names (cargo would ignore -p beside --workspace).
    let output = sandbox.run_script(true, &["-p", "tierstack-base", "--", "--exact", "x"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        sandbox.log()[3..],
        ["cargo-nextest nextest --version", "cargo-nextest nextest run --no-fail-fast -p tierstack-base -- --exact x",]
    );
}

/// A one-crate cargo project holding a copy of `scripts/test`, with its own
/// target directory: the fallback's real `cargo test` builds it in a second
/// and never rebuilds the workspace's binaries while other tests run them.
fn scratch_project(dir: &Path) -> PathBuf {
    let project = dir.join("project");
    std::fs::create_dir_all(project.join("scripts")).unwrap();
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::copy(script(), project.join("scripts/test")).unwrap();
    std::fs::write(
        project.join("Cargo.toml"),
        "[package]\nname = \"fallback-probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(project.join("src/lib.rs"), "#[test]\nfn the_fallback_ran_me() {}\n").unwrap();
    project
}

#[test]
fn when_nextest_cannot_be_installed_the_script_runs_cargo_test_and_says_so() {
    let sandbox = Sandbox::new();
    assert!(!sandbox.nextest_found(), "the sandbox hides cargo-nextest from cargo");
    let scratch = tempfile::tempdir().unwrap();
    let project = scratch_project(scratch.path());
    let mut command = sandbox.command(project.join("scripts/test"));
    command.env("STAND_IN_INSTALL", "fail").env("CARGO_TARGET_DIR", project.join("target"));
    let output = command.output().unwrap();
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(sandbox.log(), ["cargo install --locked cargo-nextest"], "one install attempt");
    assert!(
        stderr.contains("notice: cargo-nextest is unavailable; running the same tests with cargo test"),
        "{stderr}"
    );
    assert!(stdout.contains("test the_fallback_ran_me ... ok"), "the tests ran, for real: {stdout}");
}

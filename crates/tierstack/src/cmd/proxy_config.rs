//! `tierstack proxy --config proxy.toml`: a TOML file whose keys are the
//! proxy's flags (without `--`), e.g.
//!
//! ```toml
//! listen = "0.0.0.0:8080"
//! admin-listen = "127.0.0.1:9080"
//! upstream = ["http://10.0.0.2:8081", "http://10.0.0.3:8081"]
//! mode = "poll"
//! cache-bytes = 1073741824
//! header-read-timeout-ms = 10000
//! ```
//!
//! The file is turned into flags placed before the command line's, so a
//! flag given on the command line overrides the file's (a list flag such as
//! `upstream` given there replaces the file's whole list). An unknown key is
//! the error an unknown flag would be.

use std::ffi::OsString;

/// `args` (the process's arguments) with a `proxy` command's `--config`
/// file expanded; unchanged for any other command.
pub(crate) fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    if args.get(1).is_none_or(|command| command != "proxy") {
        return Ok(args);
    }
    let mut config = None;
    let mut given = Vec::new();
    let mut iter = args.iter().skip(2);
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        if let Some(path) = text.strip_prefix("--config=") {
            config = Some(path.to_string());
        } else if text == "--config" {
            config = iter.next().map(|p| p.to_string_lossy().into_owned());
            if config.is_none() {
                return Err("--config needs a file".into());
            }
        } else if let Some(flag) = text.strip_prefix("--") {
            given.push(flag.split('=').next().unwrap_or(flag).to_string());
        }
    }
    let Some(path) = config else { return Ok(args) };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("--config {path}: {e}"))?;
    let flags = flags_of(&text, &given).map_err(|e| format!("--config {path}: {e}"))?;
    let mut expanded = args[..2].to_vec();
    expanded.extend(flags.into_iter().map(OsString::from));
    expanded.extend(args[2..].iter().cloned());
    Ok(expanded)
}

/// The flags a config file stands for, leaving out list flags the command
/// line gives itself (`given`).
fn flags_of(text: &str, given: &[String]) -> Result<Vec<String>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut flags = Vec::new();
    for (key, value) in table {
        if key == "config" {
            return Err("a config file cannot name another".into());
        }
        let flag = format!("--{key}");
        let scalar = |value: &toml::Value| -> Result<String, String> {
            match value {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                other => Err(format!("{key}: expected a string or a number, found {}", other.type_str())),
            }
        };
        match &value {
            toml::Value::Boolean(true) => flags.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                if given.contains(&key) {
                    continue;
                }
                for item in items {
                    flags.push(flag.clone());
                    flags.push(scalar(item)?);
                }
            }
            other => {
                flags.push(flag);
                flags.push(scalar(other)?);
            }
        }
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_config_file_becomes_flags_before_the_command_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:8080\"\nupstream = [\"http://a:1\", \"http://b:2\"]\ncache-bytes = 4096\n",
        )
        .unwrap();
        let path = path.to_string_lossy().into_owned();
        let expanded = expand(args(&["tierstack", "proxy", "--config", &path, "--cache-bytes", "8"])).unwrap();
        let expected = [
            "tierstack",
            "proxy",
            "--cache-bytes",
            "4096",
            "--listen",
            "127.0.0.1:8080",
            "--upstream",
            "http://a:1",
            "--upstream",
            "http://b:2",
            "--config",
            &path,
            "--cache-bytes",
            "8",
        ];
        assert_eq!(expanded, args(&expected));
        // A list given on the command line replaces the file's.
        let expanded =
            expand(args(&["tierstack", "proxy", &format!("--config={path}"), "--upstream=http://c:3"])).unwrap();
        assert!(!expanded.iter().any(|a| a == "http://a:1"), "{expanded:?}");
        // Other commands, and a proxy without --config, are left alone.
        let other = args(&["tierstack", "origin", "--config", "x"]);
        assert_eq!(expand(other.clone()).unwrap(), other);
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let missing = expand(args(&["tierstack", "proxy", "--config", "/nonexistent/proxy.toml"])).unwrap_err();
        assert!(missing.contains("/nonexistent/proxy.toml"), "{missing}");
        assert!(flags_of("listen = ", &[]).is_err());
        assert!(flags_of("upstream = [{ a = 1 }]", &[]).unwrap_err().contains("upstream"));
        assert!(flags_of("config = \"x\"", &[]).is_err());
        assert!(expand(args(&["tierstack", "proxy", "--config"])).is_err());
    }
}

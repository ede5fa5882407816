//! Common Log Format replay.
//!
//! A line is `host ident authuser [date] "METHOD path[ protocol]" status bytes`,
//! optionally followed by more fields (the Combined format's referrer and user
//! agent), which are ignored. `bytes` is a decimal count or `-`.
//!
//! A replayed trace keeps the GET requests whose status is 2xx or 304 (a
//! successful access, possibly revalidated); other methods and statuses are
//! counted and skipped, malformed lines are counted and skipped, nothing
//! panics. Documents are the distinct paths in order of first appearance,
//! named `c<i>`; a document's size is the largest `bytes` any of its lines
//! reported (0 if none did), clamped to [`crate::DOC_BYTES_MAX`].

use crate::{Document, Source, Trace, WorkloadError};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::Path;

/// Longest line accepted; longer lines are malformed.
pub const CLF_LINE_BYTES_MAX: usize = 16 << 10;

/// One parsed log line (borrowing the line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClfEntry<'a> {
    pub host: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    /// `None` for `-`.
    pub bytes: Option<u64>,
}

/// Why a line was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClfLineError {
    MissingField,
    BadDate,
    BadRequest,
    BadStatus,
    BadBytes,
}

/// What a replay read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClfStats {
    /// Lines read (blank lines excluded).
    pub lines: u64,
    /// Lines kept as requests.
    pub requests: u64,
    /// Lines that did not parse (including non-UTF-8 and over-long lines).
    pub malformed: u64,
    /// Parsed lines skipped for their method (not GET).
    pub skipped_method: u64,
    /// Parsed GET lines skipped for their status (not 2xx or 304).
    pub skipped_status: u64,
    /// Documents whose size was clamped to `DOC_BYTES_MAX`.
    pub sizes_clamped: u64,
}

/// Parses one line.
pub fn parse_line(line: &str) -> Result<ClfEntry<'_>, ClfLineError> {
    let line = line.trim_end_matches(['\r', '\n']);
    let (host, rest) = split_token(line).ok_or(ClfLineError::MissingField)?;
    let (_ident, rest) = split_token(rest).ok_or(ClfLineError::MissingField)?;
    let (_user, rest) = split_token(rest).ok_or(ClfLineError::MissingField)?;
    let rest = rest.strip_prefix('[').ok_or(ClfLineError::BadDate)?;
    let close = rest.find(']').ok_or(ClfLineError::BadDate)?;
    if close == 0 {
        return Err(ClfLineError::BadDate);
    }
    let rest = rest[close + 1..].trim_start_matches(' ');
    let rest = rest.strip_prefix('"').ok_or(ClfLineError::BadRequest)?;
    let close = rest.find('"').ok_or(ClfLineError::BadRequest)?;
    let request = &rest[..close];
    let rest = rest[close + 1..].trim_start_matches(' ');
    let mut parts = request.split(' ').filter(|p| !p.is_empty());
    let method = parts.next().ok_or(ClfLineError::BadRequest)?;
    let path = parts.next().ok_or(ClfLineError::BadRequest)?;
    let _protocol = parts.next();
    if parts.next().is_some() || !method.bytes().all(|b| b.is_ascii_uppercase()) || !path.starts_with('/') {
        return Err(ClfLineError::BadRequest);
    }
    let (status, rest) = split_token(rest).ok_or(ClfLineError::BadStatus)?;
    if status.len() != 3 || !status.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ClfLineError::BadStatus);
    }
    let status: u16 = status.parse().map_err(|_| ClfLineError::BadStatus)?;
    let bytes_field = rest.split(' ').next().unwrap_or("");
    let bytes = match bytes_field {
        "" => return Err(ClfLineError::MissingField),
        "-" => None,
        digits if digits.bytes().all(|b| b.is_ascii_digit()) => {
            Some(digits.parse::<u64>().map_err(|_| ClfLineError::BadBytes)?)
        }
        _ => return Err(ClfLineError::BadBytes),
    };
    Ok(ClfEntry { host, method, path, status, bytes })
}

/// Splits off the next space-delimited, non-empty token.
fn split_token(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    match s.find(' ') {
        Some(i) => Some((&s[..i], &s[i + 1..])),
        None => Some((s, "")),
    }
}

/// Accumulates lines into a trace.
#[derive(Default)]
pub(crate) struct ClfBuilder {
    stats: ClfStats,
    index_of_path: HashMap<String, u32>,
    documents: Vec<Document>,
    replay: Vec<u32>,
}

impl ClfBuilder {
    pub(crate) fn push_line(&mut self, line: &str) -> Result<(), WorkloadError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        self.stats.lines += 1;
        let entry = match parse_line(line) {
            Ok(entry) => entry,
            Err(_) => {
                self.stats.malformed += 1;
                return Ok(());
            }
        };
        if entry.method != "GET" {
            self.stats.skipped_method += 1;
            return Ok(());
        }
        if !((200..300).contains(&entry.status) || entry.status == 304) {
            self.stats.skipped_status += 1;
            return Ok(());
        }
        if self.replay.len() >= crate::REPLAY_REQUESTS_MAX {
            return Err(WorkloadError::TooManyRequests { max: crate::REPLAY_REQUESTS_MAX });
        }
        let index = match self.index_of_path.get(entry.path) {
            Some(&i) => i,
            None => {
                if self.documents.len() >= crate::DOCS_MAX {
                    return Err(WorkloadError::InvalidDocumentCount {
                        docs: self.documents.len() + 1,
                        max: crate::DOCS_MAX,
                    });
                }
                let i = self.documents.len() as u32;
                self.index_of_path.insert(entry.path.to_string(), i);
                self.documents.push(Document {
                    name: format!("c{i}"),
                    size_bytes: 0,
                    source_path: Some(entry.path.to_string()),
                });
                i
            }
        };
        if let Some(bytes) = entry.bytes {
            let doc = &mut self.documents[index as usize];
            doc.size_bytes = doc.size_bytes.max(bytes);
        }
        self.replay.push(index);
        self.stats.requests += 1;
        Ok(())
    }

    /// Marks a line that could not even be read as text.
    pub(crate) fn push_unreadable(&mut self) {
        self.stats.lines += 1;
        self.stats.malformed += 1;
    }

    pub(crate) fn finish(mut self, label: String) -> Result<Trace, WorkloadError> {
        if self.replay.is_empty() {
            return Err(WorkloadError::EmptyLog { lines: self.stats.lines, malformed: self.stats.malformed });
        }
        for doc in &mut self.documents {
            if doc.size_bytes > crate::DOC_BYTES_MAX {
                doc.size_bytes = crate::DOC_BYTES_MAX;
                self.stats.sizes_clamped += 1;
            }
        }
        Ok(Trace::from_parts(label, self.documents, Source::Replay(self.replay), Some(self.stats)))
    }
}

/// Host written in exported logs.
const EXPORT_HOST: &str = "10.0.0.1";
/// Exported logs start at 1998-06-01 00:00:00 UTC (unix seconds) and advance
/// one second per request.
const EXPORT_START_UNIX_S: u64 = 896_659_200;

/// Writes the first `requests` requests of `trace` (worker 0 of 1's stream
/// for `seed`, [`Trace::sample`]) as Common Log Format, one
/// `host - - [date] "GET /doc/<name> HTTP/1.0" 200 <size>` line each, which
/// [`Trace::clf`] reads back as the same sequence of paths and sizes. Returns
/// the number of lines written. A log of more than
/// [`crate::REPLAY_REQUESTS_MAX`] lines is written but cannot be replayed.
pub fn write_clf<W: Write>(trace: &Trace, requests: usize, seed: u64, out: W) -> std::io::Result<u64> {
    let mut out = std::io::BufWriter::new(out);
    let documents = trace.documents();
    let mut written = 0u64;
    for (i, index) in trace.stream(seed, 0, 1).take(requests).enumerate() {
        let Some(doc) = documents.get(index) else { continue };
        writeln!(
            out,
            "{EXPORT_HOST} - - [{}] \"GET {} HTTP/1.0\" 200 {}",
            clf_date(EXPORT_START_UNIX_S + i as u64),
            doc.path(),
            doc.size_bytes
        )?;
        written += 1;
    }
    out.flush()?;
    Ok(written)
}

/// `dd/Mon/yyyy:hh:mm:ss +0000` for a UTC unix time.
fn clf_date(unix_s: u64) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (days, secs) = (unix_s / 86_400, unix_s % 86_400);
    // Civil date from days since 1970-01-01 (Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{day:02}/{}/{year}:{:02}:{:02}:{:02} +0000",
        MONTHS[(month - 1) as usize],
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Replays a log held in memory.
pub(crate) fn from_str(text: &str) -> Result<Trace, WorkloadError> {
    let mut builder = ClfBuilder::default();
    for line in text.lines() {
        builder.push_line(line)?;
    }
    builder.finish("clf(<memory>)".to_string())
}

/// Replays the log file at `path`, streaming it line by line.
pub(crate) fn from_path(path: &Path) -> Result<Trace, WorkloadError> {
    let io_err = |source| WorkloadError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io_err)?;
    let mut reader = std::io::BufReader::new(file);
    let mut builder = ClfBuilder::default();
    let mut buf = Vec::with_capacity(512);
    loop {
        buf.clear();
        let n = read_line_bounded(&mut reader, &mut buf).map_err(io_err)?;
        match n {
            LineRead::Eof => break,
            LineRead::TooLong => builder.push_unreadable(),
            LineRead::Line => match std::str::from_utf8(&buf) {
                Ok(line) => builder.push_line(line)?,
                Err(_) => builder.push_unreadable(),
            },
        }
    }
    builder.finish(format!("clf({})", path.display()))
}

enum LineRead {
    Eof,
    Line,
    TooLong,
}

/// Reads one line into `buf` (without its newline), never buffering more than
/// [`CLF_LINE_BYTES_MAX`] bytes of it; the rest of an over-long line is skipped.
fn read_line_bounded<R: BufRead>(reader: &mut R, buf: &mut Vec<u8>) -> std::io::Result<LineRead> {
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(match (read_any, too_long) {
                (false, _) => LineRead::Eof,
                (true, true) => LineRead::TooLong,
                (true, false) => LineRead::Line,
            });
        }
        read_any = true;
        let (chunk, consumed, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long {
            if buf.len() + chunk.len() > CLF_LINE_BYTES_MAX {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        reader.consume(consumed);
        if done {
            return Ok(if too_long { LineRead::TooLong } else { LineRead::Line });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_and_combined_lines() {
        let e =
            parse_line(r#"192.168.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326"#)
                .unwrap();
        assert_eq!(
            e,
            ClfEntry { host: "192.168.0.1", method: "GET", path: "/apache_pb.gif", status: 200, bytes: Some(2326) }
        );
        let e = parse_line(
            r#"h - - [01/Jul/1995:00:00:01 -0400] "GET /a/b.html HTTP/1.0" 304 - "http://ref/" "Mozilla/4.0 (X)""#,
        )
        .unwrap();
        assert_eq!((e.path, e.status, e.bytes), ("/a/b.html", 304, None));
        // HTTP/0.9: no protocol.
        let e = parse_line(r#"h - - [d] "GET /x" 200 5"#).unwrap();
        assert_eq!((e.path, e.bytes), ("/x", Some(5)));
    }

    #[test]
    fn rejects_malformed_lines_with_a_reason() {
        let cases: &[(&str, ClfLineError)] = &[
            ("", ClfLineError::MissingField),
            ("host only", ClfLineError::MissingField),
            (r#"h - - 10/Oct/2000 "GET / HTTP/1.0" 200 1"#, ClfLineError::BadDate),
            (r#"h - - [d "GET / HTTP/1.0" 200 1"#, ClfLineError::BadDate),
            (r#"h - - [d] GET / HTTP/1.0 200 1"#, ClfLineError::BadRequest),
            (r#"h - - [d] "GET / HTTP/1.0 200 1"#, ClfLineError::BadRequest),
            (r#"h - - [d] "" 200 1"#, ClfLineError::BadRequest),
            (r#"h - - [d] "GET noslash HTTP/1.0" 200 1"#, ClfLineError::BadRequest),
            (r#"h - - [d] "GET / HTTP/1.0" 2x0 1"#, ClfLineError::BadStatus),
            (r#"h - - [d] "GET / HTTP/1.0" 2000 1"#, ClfLineError::BadStatus),
            (r#"h - - [d] "GET / HTTP/1.0" 200"#, ClfLineError::MissingField),
            (r#"h - - [d] "GET / HTTP/1.0" 200 12k"#, ClfLineError::BadBytes),
            (r#"h - - [d] "GET / HTTP/1.0" 200 99999999999999999999999"#, ClfLineError::BadBytes),
        ];
        for (line, reason) in cases {
            assert_eq!(parse_line(line), Err(*reason), "line {line:?}");
        }
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(clf_date(0), "01/Jan/1970:00:00:00 +0000");
        assert_eq!(clf_date(EXPORT_START_UNIX_S), "01/Jun/1998:00:00:00 +0000");
        assert_eq!(clf_date(951_782_400 + 3_661), "29/Feb/2000:01:01:01 +0000");
        assert_eq!(clf_date(1_704_067_199), "31/Dec/2023:23:59:59 +0000");
    }

    #[test]
    fn over_long_lines_are_skipped_without_buffering_them() {
        let long = "x".repeat(CLF_LINE_BYTES_MAX + 10);
        let text = format!("{long}\nshort\n");
        let mut reader = std::io::BufReader::with_capacity(64, text.as_bytes());
        let mut buf = Vec::new();
        assert!(matches!(read_line_bounded(&mut reader, &mut buf).unwrap(), LineRead::TooLong));
        assert!(buf.len() <= CLF_LINE_BYTES_MAX);
        buf.clear();
        assert!(matches!(read_line_bounded(&mut reader, &mut buf).unwrap(), LineRead::Line));
        assert_eq!(buf, b"short");
        buf.clear();
        assert!(matches!(read_line_bounded(&mut reader, &mut buf).unwrap(), LineRead::Eof));
    }
}

//! A tier's flag struct parsed from words as the binary parses it when it
//! flattens the struct into a subcommand: the other half of the round-trip
//! tests that hold each struct's `to_args` to its clap definition.

use std::ffi::OsString;

/// Parses `words` (the program's name first, as in `std::env::args`) into `A`.
pub fn parse<A, I, T>(words: I) -> Result<A, clap::Error>
where
    A: clap::Args + clap::FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = A::augment_args(clap::Command::new("tierstack")).try_get_matches_from(words)?;
    A::from_arg_matches(&matches)
}

#[cfg(test)]
mod tests {
    #[derive(clap::Args, Debug, PartialEq)]
    struct Flags {
        #[arg(long, default_value_t = 3)]
        count: u32,
    }

    #[test]
    fn words_parse_as_a_flattened_struct_would() {
        assert_eq!(super::parse::<Flags, _, _>(["x", "--count", "7"]).unwrap(), Flags { count: 7 });
        assert_eq!(super::parse::<Flags, _, _>(["x"]).unwrap(), Flags { count: 3 });
        assert!(super::parse::<Flags, _, _>(["x", "--other"]).is_err());
    }
}

//! `vgpud::config::Config::parse` on arbitrary UTF-8: it returns a
//! configuration or an error naming a position inside the text, never
//! panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpud::config::{Config, ConfigError};

fuzz_target!(|text: &str| {
    match Config::parse(text, "fuzz.toml") {
        Ok(config) => {
            // What was accepted must survive being printed as understood
            // (what `vgpud check-config` does).
            let _ = format!("{config:?}");
        }
        Err(ConfigError::Parse { line, column, .. }) => {
            let lines = text.split('\n').count().max(1);
            assert!(line >= 1 && line <= lines, "line {line} of {lines}");
            assert!(column >= 1, "column {column}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});

//! Logging that a peer cannot turn into a flood. Whatever a guest, a VMM
//! or a partition host can make happen as often as it likes must reach
//! the host's logs through a budget: [`LogLimiter`] for one peer's lines
//! (the peer named in each), [`warn_limited!`](crate::warn_limited) and
//! [`error_limited!`](crate::error_limited) for one place in the code.
//! Plain `log::warn!`/`log::error!` are refused by clippy in the
//! data-path crates (their `clippy.toml`).

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::Level;

/// Lines allowed per window.
pub const PER_SECOND: u32 = 20;

const WINDOW: Duration = Duration::from_secs(1);

/// Limits how often one peer can make us log: at most [`PER_SECOND`]
/// lines a second; the number left out is logged when the next window
/// starts with a line.
#[derive(Debug)]
pub struct LogLimiter {
    window_start: Instant,
    in_window: u32,
    suppressed: u64,
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter {
            window_start: Instant::now(),
            in_window: 0,
            suppressed: 0,
        }
    }
}

/// What [`LogLimiter::admit`] decided for one line.
#[derive(Debug, PartialEq, Eq)]
struct Admit {
    /// Lines left out in the window that just ended, to report first.
    suppressed: Option<u64>,
    /// Whether this line is logged.
    log: bool,
}

impl LogLimiter {
    fn admit(&mut self, now: Instant) -> Admit {
        let mut suppressed = None;
        if now.duration_since(self.window_start) >= WINDOW {
            if self.suppressed > 0 {
                suppressed = Some(self.suppressed);
            }
            self.window_start = now;
            self.in_window = 0;
            self.suppressed = 0;
        }
        let log = self.in_window < PER_SECOND;
        if log {
            self.in_window += 1;
        } else {
            self.suppressed += 1;
        }
        Admit { suppressed, log }
    }

    /// Logs `who: msg` at warn level unless over the budget.
    #[allow(clippy::disallowed_macros)]
    pub fn warn(&mut self, who: &str, msg: fmt::Arguments<'_>) {
        let a = self.admit(Instant::now());
        if let Some(n) = a.suppressed {
            log::warn!("{who}: {n} similar messages suppressed");
        }
        if a.log {
            log::warn!("{who}: {msg}");
        }
    }
}

/// The budget of one place in the code, for [`warn_limited!`] and
/// [`error_limited!`](crate::error_limited).
///
/// [`warn_limited!`]: crate::warn_limited
#[derive(Debug)]
pub struct SiteLimiter(Mutex<Option<LogLimiter>>);

impl Default for SiteLimiter {
    fn default() -> Self {
        SiteLimiter::new()
    }
}

impl SiteLimiter {
    /// A fresh budget (usable in a `static`).
    pub const fn new() -> Self {
        SiteLimiter(Mutex::new(None))
    }

    /// Logs `msg` at `level` for `target` (the caller's module) unless
    /// over the budget.
    pub fn log(&self, level: Level, target: &str, msg: fmt::Arguments<'_>) {
        let a = crate::lock(&self.0)
            .get_or_insert_with(LogLimiter::default)
            .admit(Instant::now());
        if let Some(n) = a.suppressed {
            log::log!(target: target, level, "{n} similar messages suppressed");
        }
        if a.log {
            log::log!(target: target, level, "{msg}");
        }
    }
}

/// `log::warn!` with a budget of [`PER_SECOND`](crate::log::PER_SECOND)
/// lines a second for this call site; lines over it are counted, and the
/// count is logged with the next line after the second ends.
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {
        $crate::__log_limited!(Warn, $($arg)+)
    };
}

/// `log::error!` with a budget per call site, as
/// [`warn_limited!`](crate::warn_limited).
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)+) => {
        $crate::__log_limited!(Error, $($arg)+)
    };
}

/// `log::debug!` with a budget per call site, as
/// [`warn_limited!`](crate::warn_limited): for what a guest may cause
/// as often as it likes that only someone debugging it wants to read.
#[macro_export]
macro_rules! debug_limited {
    ($($arg:tt)+) => {
        $crate::__log_limited!(Debug, $($arg)+)
    };
}

/// The three macros above at `level`: a [`SiteLimiter`] of the call site's
/// own.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_limited {
    ($level:ident, $($arg:tt)+) => {{
        static SITE: $crate::log::SiteLimiter = $crate::log::SiteLimiter::new();
        SITE.log(
            $crate::__log::Level::$level,
            ::core::module_path!(),
            ::core::format_args!($($arg)+),
        )
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_budget_per_window_and_the_count_left_out() {
        let mut l = LogLimiter::default();
        let t0 = l.window_start;
        for _ in 0..PER_SECOND {
            assert_eq!(
                l.admit(t0),
                Admit {
                    suppressed: None,
                    log: true
                }
            );
        }
        for _ in 0..5 {
            assert!(!l.admit(t0 + Duration::from_millis(999)).log);
        }
        let next = l.admit(t0 + WINDOW);
        assert_eq!(
            next,
            Admit {
                suppressed: Some(5),
                log: true
            }
        );
        // A quiet window reports nothing.
        assert_eq!(l.admit(t0 + 3 * WINDOW).suppressed, None);
    }

    #[test]
    fn test_the_macros_expand_and_log() {
        for i in 0..(PER_SECOND + 3) {
            crate::warn_limited!("line {i}");
            crate::error_limited!("line {}", i);
        }
        let mut l = LogLimiter::default();
        l.warn("peer", format_args!("{}", 1));
    }
}

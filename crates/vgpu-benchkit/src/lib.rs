//! Measurement helpers shared by the benchmarks. The machines these run on
//! are shared and noisy, so every benchmark compares variants measured
//! side by side: [`measure_rounds`] alternates them in rounds and rotates
//! which goes first, and results are read as ratios of percentiles.
//!
//! Every benchmark binary starts with [`Bench::start`], which says how it
//! was asked to run ([`Mode`]: in full, briefly, or as a smoke test), and
//! ends with [`Bench::finish`], whose exit code fails when a ratio had no
//! baseline to compare with (see [`ratio`]) or a thread panicked: a
//! benchmark that measured nothing is an error, not a figure.

#![warn(missing_docs)]

use std::fmt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes in a KiB.
pub const KIB: usize = 1024;
/// Bytes in a MiB.
pub const MIB: usize = 1024 * KIB;

/// Nearest-rank percentile (`p` in 0..=1) of sorted samples; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted[idx]
}

/// Median and tail of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// 50th percentile.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Number of samples.
    pub n: usize,
}

/// Sorts `samples` and summarises them.
pub fn summarize(mut samples: Vec<u64>) -> Summary {
    samples.sort_unstable();
    Summary {
        p50: percentile(&samples, 0.50),
        p99: percentile(&samples, 0.99),
        n: samples.len(),
    }
}

/// How a figure compares with its target, as printed in result tables.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// What a ratio is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// The ratio passes at this or above (throughput against a baseline).
    AtLeast(f64),
    /// The ratio passes at this or below (latency against a baseline).
    AtMost(f64),
    /// Printed for reference only; still fails without a baseline.
    Reference,
}

/// How a ratio compares with its target.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Within its target.
    Pass,
    /// Measured, and outside its target.
    Miss,
    /// No target: a reference figure.
    Reference,
    /// Not a measurement: the reason (a baseline that is zero, missing
    /// or not finite, or a figure that is not finite).
    Fail(String),
}

impl Verdict {
    /// Whether the figure could not be judged.
    pub fn failed(&self) -> bool {
        matches!(self, Verdict::Fail(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Pass => f.write_str("PASS"),
            Verdict::Miss => f.write_str("MISS"),
            Verdict::Reference => Ok(()),
            Verdict::Fail(why) => write!(f, "FAIL ({why})"),
        }
    }
}

/// A figure divided by its baseline, and its verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratio {
    /// `figure / baseline`; not finite when the verdict is a failure.
    pub value: f64,
    /// How it compares with its target.
    pub verdict: Verdict,
}

impl Ratio {
    /// The ratio as a percentage, for tables.
    pub fn percent(&self) -> f64 {
        self.value * 100.0
    }
}

/// `figure / baseline` judged against `target`. A baseline that is zero
/// (or below), missing or not finite, or a figure that is not finite, is
/// no measurement: the verdict is [`Verdict::Fail`] with the reason, and
/// the value NaN, whatever the target.
pub fn ratio(figure: f64, baseline: Option<f64>, target: Target) -> Ratio {
    let why = match baseline {
        None => Some("no baseline".to_string()),
        Some(b) if !b.is_finite() => Some(format!("baseline is {b}")),
        Some(b) if b <= 0.0 => Some(format!("baseline is {b}")),
        Some(_) if !figure.is_finite() => Some(format!("figure is {figure}")),
        Some(_) => None,
    };
    if let Some(why) = why {
        return Ratio {
            value: f64::NAN,
            verdict: Verdict::Fail(why),
        };
    }
    let value = figure / baseline.unwrap_or(f64::NAN);
    let verdict = match target {
        Target::AtLeast(t) if value >= t => Verdict::Pass,
        Target::AtMost(t) if value <= t => Verdict::Pass,
        Target::AtLeast(_) | Target::AtMost(_) => Verdict::Miss,
        Target::Reference => Verdict::Reference,
    };
    Ratio { value, verdict }
}

/// How a benchmark binary was asked to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `cargo bench`: every part at full length.
    Full,
    /// `BENCH_QUICK=1 cargo bench`: every part briefly, figures
    /// indicative only.
    Quick,
    /// Every part for a fraction of a second, to show that each runs to
    /// the end and measures something: `cargo test --benches` (which runs
    /// a bench binary without `--bench`) or `cargo bench -- --test`.
    Smoke,
}

impl Mode {
    /// The mode that `args` (the binary's arguments, without its name)
    /// and `quick` (`BENCH_QUICK` set to anything but "" or "0") ask for.
    pub fn from_args<S: AsRef<str>>(args: &[S], quick: bool) -> Mode {
        let has = |flag: &str| args.iter().any(|a| a.as_ref() == flag);
        if has("--test") {
            Mode::Smoke
        } else if quick {
            Mode::Quick
        } else if has("--bench") {
            Mode::Full
        } else {
            Mode::Smoke
        }
    }

    /// One of three values, by mode.
    pub fn pick<T>(self, full: T, quick: T, smoke: T) -> T {
        match self {
            Mode::Full => full,
            Mode::Quick => quick,
            Mode::Smoke => smoke,
        }
    }

    /// "full", "quick" or "smoke", for headers.
    pub fn name(self) -> &'static str {
        self.pick("full", "quick", "smoke")
    }
}

/// How long a smoke run may take before it is taken for stuck.
pub const SMOKE_LIMIT: Duration = Duration::from_secs(120);

/// A benchmark binary's run: its mode, and whether everything it judged
/// could be judged.
pub struct Bench {
    mode: Mode,
    failures: Mutex<Vec<String>>,
    panicked: Arc<AtomicBool>,
}

impl Bench {
    /// Reads the mode from the arguments and `BENCH_QUICK`; notes any
    /// thread's panic for [`Bench::finish`] (a panic in a thread the
    /// benchmark does not join would otherwise pass unseen); in
    /// [`Mode::Smoke`] ends the process with a failure if it runs past
    /// [`SMOKE_LIMIT`] (a benchmark that waits forever).
    pub fn start() -> Bench {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let bench = Bench::new(Mode::from_args(&args, quick));
        let panicked = bench.panicked.clone();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            panicked.store(true, Ordering::SeqCst);
            previous(info);
        }));
        if bench.mode == Mode::Smoke {
            // Detached: it ends with the process.
            std::thread::Builder::new()
                .name("smoke-limit".into())
                .spawn(|| {
                    std::thread::sleep(SMOKE_LIMIT);
                    eprintln!("smoke run still going after {SMOKE_LIMIT:?}: stuck");
                    std::process::exit(1);
                })
                .expect("smoke limit thread");
        }
        bench
    }

    /// A run in `mode` that installs nothing (for tests).
    pub fn new(mode: Mode) -> Bench {
        Bench {
            mode,
            failures: Mutex::new(Vec::new()),
            panicked: Arc::new(AtomicBool::new(false)),
        }
    }

    /// How the binary was asked to run.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether this is a smoke run.
    pub fn smoke(&self) -> bool {
        self.mode == Mode::Smoke
    }

    /// [`ratio`], noting a failure under `what` for [`Bench::finish`].
    pub fn ratio(
        &self,
        what: &str,
        figure: f64,
        baseline: impl Into<Option<f64>>,
        target: Target,
    ) -> Ratio {
        let r = ratio(figure, baseline.into(), target);
        if let Verdict::Fail(why) = &r.verdict {
            self.fail(format!("{what}: {why}"));
        }
        r
    }

    /// Notes that something could not be measured.
    pub fn fail(&self, why: String) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(why);
    }

    /// What failed so far.
    pub fn failures(&self) -> Vec<String> {
        let mut out = self
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if self.panicked.load(Ordering::SeqCst) {
            out.push("a thread panicked".into());
        }
        out
    }

    /// Prints what failed, if anything; the exit code for `main`.
    pub fn finish(&self) -> ExitCode {
        let failures = self.failures();
        if failures.is_empty() {
            return ExitCode::SUCCESS;
        }
        println!("\nFAILED ({} run): nothing measured for", self.mode.name());
        for f in &failures {
            println!("  {f}");
        }
        ExitCode::FAILURE
    }
}

/// "4 KiB", "16 MiB": a transfer size for tables.
pub fn size_label(size: usize) -> String {
    if size >= MIB {
        format!("{} MiB", size / MIB)
    } else {
        format!("{} KiB", size / KIB)
    }
}

/// Runs the variants alternately, rotating which goes first each round;
/// each call of a variant returns one sample (ns, or any unit). Every
/// variant is warmed up with `warmup` unrecorded calls at the start of each
/// of its turns, so machine noise lands on all of them alike.
pub fn measure_rounds(
    rounds: usize,
    batch: usize,
    warmup: usize,
    variants: &mut [&mut dyn FnMut() -> u64],
) -> Vec<Vec<u64>> {
    let n = variants.len();
    let mut samples = vec![Vec::with_capacity(rounds.saturating_mul(batch)); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let v = &mut *variants[i];
            for _ in 0..warmup {
                v();
            }
            let out = &mut samples[i];
            for _ in 0..batch {
                out.push(v());
            }
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_percentiles_and_summary() {
        let s = summarize((1..=100).rev().collect());
        assert_eq!((s.p50, s.p99, s.n), (51, 99, 100));
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 2.0), 7);
    }

    #[test]
    fn test_rounds_rotate_and_count() {
        let log = std::cell::RefCell::new(String::new());
        let mut a = || {
            log.borrow_mut().push('a');
            1
        };
        let mut b = || {
            log.borrow_mut().push('b');
            2
        };
        let out = measure_rounds(2, 3, 1, &mut [&mut a, &mut b]);
        assert_eq!(out, vec![vec![1; 6], vec![2; 6]]);
        assert_eq!(log.into_inner(), "aaaabbbbbbbbaaaa");
    }

    #[test]
    fn test_ratio_without_a_baseline_fails() {
        for (baseline, why) in [
            (Some(0.0), "baseline is 0"),
            (Some(-1.0), "baseline is -1"),
            (None, "no baseline"),
            (Some(f64::NAN), "baseline is NaN"),
            (Some(f64::INFINITY), "baseline is inf"),
        ] {
            for target in [Target::AtLeast(0.9), Target::AtMost(1.5), Target::Reference] {
                let r = ratio(5.0, baseline, target);
                assert_eq!(r.verdict, Verdict::Fail(why.into()), "{baseline:?}");
                assert!(r.value.is_nan());
                assert_eq!(r.verdict.to_string(), format!("FAIL ({why})"));
            }
        }
        let r = ratio(f64::INFINITY, Some(1.0), Target::AtMost(2.0));
        assert_eq!(r.verdict, Verdict::Fail("figure is inf".into()));
    }

    #[test]
    fn test_ratio_against_targets() {
        let r = ratio(95.0, Some(100.0), Target::AtLeast(0.9));
        assert_eq!((r.value, r.verdict), (0.95, Verdict::Pass));
        assert_eq!(
            ratio(80.0, Some(100.0), Target::AtLeast(0.9)).verdict,
            Verdict::Miss
        );
        assert_eq!(
            ratio(3.0, Some(2.0), Target::AtMost(1.5)).verdict,
            Verdict::Pass
        );
        assert_eq!(
            ratio(4.0, Some(2.0), Target::AtMost(1.5)).verdict,
            Verdict::Miss
        );
        let r = ratio(0.0, Some(2.0), Target::Reference);
        assert_eq!((r.value, r.verdict.to_string()), (0.0, String::new()));
        assert_eq!(r.percent(), 0.0);
    }

    #[test]
    fn test_bench_notes_failures() {
        let b = Bench::new(Mode::Smoke);
        assert!(b.smoke());
        b.ratio("ok", 1.0, 1.0, Target::AtLeast(0.9));
        assert!(b.failures().is_empty());
        assert_eq!(b.finish(), ExitCode::SUCCESS);
        let r = b.ratio("overhead", 1.0, 0.0, Target::AtLeast(0.9));
        assert!(r.verdict.failed());
        b.ratio("latency", 1.0, None, Target::AtMost(1.5));
        assert_eq!(
            b.failures(),
            ["overhead: baseline is 0", "latency: no baseline"]
        );
        assert_eq!(b.finish(), ExitCode::FAILURE);
    }

    #[test]
    fn test_modes() {
        let m = |args: &[&str], quick| Mode::from_args(args, quick);
        assert_eq!(m(&["--bench"], false), Mode::Full);
        assert_eq!(m(&["--bench"], true), Mode::Quick);
        // `cargo test --benches` passes no --bench.
        assert_eq!(m(&[], false), Mode::Smoke);
        assert_eq!(m(&[], true), Mode::Quick);
        // `cargo bench -- --test`.
        assert_eq!(m(&["--test", "--bench"], true), Mode::Smoke);
        assert_eq!(Mode::Quick.pick(1, 2, 3), 2);
        assert_eq!(Mode::Smoke.name(), "smoke");
    }

    #[test]
    fn test_labels() {
        assert_eq!(size_label(4 * KIB), "4 KiB");
        assert_eq!(size_label(16 * MIB), "16 MiB");
        assert_eq!(verdict(true), "PASS");
    }
}

//! What kernels print (`printf` in device code), kept per module until
//! the guest takes it with CONSOLE: a bounded buffer each, as a GPU's
//! printf buffer is, so a kernel that prints without end costs a fixed
//! amount of memory and loses its newest lines, never the device.

use std::collections::BTreeMap;

use vgpu_abi as abi;

/// Printed output with what did not fit: what one CONSOLE takes of a
/// module's output, and what a launch or a partition host gathers on its
/// way there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleText {
    /// The oldest bytes printed.
    pub text: Vec<u8>,
    /// Bytes dropped because the buffer was full.
    pub dropped: u64,
}

impl ConsoleText {
    /// Appends `text`, as much as [`abi::CONSOLE_BYTES`] hold in all; the
    /// rest is counted as dropped.
    pub fn push(&mut self, text: &[u8]) {
        let room = (abi::CONSOLE_BYTES as usize).saturating_sub(self.text.len());
        let kept = text.len().min(room);
        self.text.extend_from_slice(&text[..kept]);
        self.dropped = self.dropped.saturating_add((text.len() - kept) as u64);
    }
}

/// The printed output of a partition's modules, by module handle.
#[derive(Debug, Default)]
pub struct Consoles {
    by_module: BTreeMap<u64, ConsoleText>,
}

impl Consoles {
    /// Keeps what `module`'s kernels printed, as much as its
    /// [`abi::CONSOLE_BYTES`] hold; the rest, and what was dropped
    /// before, is counted as dropped.
    pub fn push(&mut self, module: u64, printed: &ConsoleText) {
        if printed.text.is_empty() && printed.dropped == 0 {
            return;
        }
        let b = self.by_module.entry(module).or_default();
        b.push(&printed.text);
        b.dropped = b.dropped.saturating_add(printed.dropped);
    }

    /// Takes up to `max` bytes of `module`'s output, oldest first.
    pub fn take(&mut self, module: u64, max: usize) -> ConsoleText {
        let Some(b) = self.by_module.get_mut(&module) else {
            return ConsoleText::default();
        };
        let n = b.text.len().min(max);
        let out = ConsoleText {
            text: b.text.drain(..n).collect(),
            dropped: std::mem::take(&mut b.dropped),
        };
        if b.text.is_empty() && b.dropped == 0 {
            self.by_module.remove(&module);
        }
        out
    }

    /// Forgets an unloaded module's output.
    pub fn forget(&mut self, module: u64) {
        self.by_module.remove(&module);
    }

    /// Forgets everything (a reset).
    pub fn clear(&mut self) {
        self.by_module.clear();
    }
}

/// What a module calls to print: `printf`, and `assert()`, whose failure
/// a GPU reports in a printed line.
const PRINTING: [&str; 2] = ["vprintf", "__assertfail"];

/// Whether the kernels of a module image may print: it names `vprintf` or
/// `__assertfail`, in its bytes or, for a fatbinary of compressed
/// entries, in its PTX. Only images of up to 16 MiB are decompressed for
/// this (programs' own; libraries' large fatbinaries do not print).
pub fn module_prints(image: &[u8]) -> bool {
    if PRINTING
        .iter()
        .any(|name| image.windows(name.len()).any(|w| w == name.as_bytes()))
    {
        return true;
    }
    image.len() <= 16 << 20
        && vgpu_ptx::extract_ptx(image)
            .is_ok_and(|texts| texts.iter().any(|t| PRINTING.iter().any(|n| t.contains(n))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &[u8]) -> ConsoleText {
        ConsoleText {
            text: t.to_vec(),
            dropped: 0,
        }
    }

    #[test]
    fn test_dropped_bytes_carry_over_into_the_module_console() {
        let mut c = Consoles::default();
        c.push(
            3,
            &ConsoleText {
                text: Vec::new(),
                dropped: 9,
            },
        );
        c.push(3, &text(b"x"));
        assert_eq!(
            c.take(3, 10),
            ConsoleText {
                text: b"x".to_vec(),
                dropped: 9
            }
        );
    }

    #[test]
    fn test_take_returns_oldest_first_in_pieces_and_forgets_when_empty() {
        let mut c = Consoles::default();
        c.push(1, &text(b"hello "));
        c.push(2, &text(b"other"));
        c.push(1, &text(b"world\n"));
        let first = c.take(1, 8);
        assert_eq!(first.text, b"hello wo");
        assert_eq!(first.dropped, 0);
        assert_eq!(c.take(1, 100).text, b"rld\n");
        assert_eq!(c.take(1, 100), ConsoleText::default());
        assert_eq!(c.take(2, 100).text, b"other");
        assert_eq!(c.take(3, 100), ConsoleText::default());
    }

    #[test]
    fn test_full_buffer_drops_the_newest_and_counts_them_once() {
        let mut c = Consoles::default();
        let line = vec![b'x'; 1000];
        let lines = abi::CONSOLE_BYTES as usize / line.len() + 5;
        for _ in 0..lines {
            c.push(7, &text(&line));
        }
        let all = c.take(7, usize::MAX);
        assert_eq!(all.text.len(), abi::CONSOLE_BYTES as usize);
        assert_eq!(
            all.dropped,
            (lines * line.len()) as u64 - u64::from(abi::CONSOLE_BYTES)
        );
        c.push(7, &text(b"again"));
        assert_eq!(c.take(7, 100).dropped, 0);
    }

    #[test]
    fn test_forget_and_clear_drop_output() {
        let mut c = Consoles::default();
        c.push(1, &text(b"a"));
        c.push(2, &text(b"b"));
        c.forget(1);
        assert!(c.take(1, 10).text.is_empty());
        c.clear();
        assert!(c.take(2, 10).text.is_empty());
    }

    #[test]
    fn test_module_prints_looks_for_vprintf() {
        assert!(module_prints(
            b".version 8.0\n.target sm_80\n.address_size 64\n.extern .func (.param .b32 r) vprintf(.param .b64 a, .param .b64 b);\n"
        ));
        assert!(!module_prints(
            b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n"
        ));
        assert!(module_prints(
            b".version 8.0\n.target sm_80\n.address_size 64\n.extern .func __assertfail(.param .b64 a);\n"
        ));
        assert!(!module_prints(b"\x7fELF not a module"));
    }
}

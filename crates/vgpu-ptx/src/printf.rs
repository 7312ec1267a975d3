//! CUDA's device-side `printf`: the runtime's `vprintf(fmt, args)`,
//! formatted as the C library formats `printf` (glibc's output for the
//! cases C leaves open).
//!
//! nvcc packs the arguments into a buffer in order, each at a multiple of
//! its own size: `int` and everything narrower (promoted) in 4 bytes;
//! `long`, `long long`, `size_t`, pointers and `double` (`float` is
//! promoted to it) in 8. Every read of kernel memory (the format, the
//! arguments, `%s` strings) is bounded and may fail; nothing is written:
//! `%n` prints nothing and only passes over its pointer's slot.

/// Where a kernel's `printf` output goes: one call per `printf` call
/// of one thread, with its whole formatted text. Called from the
/// launch's worker threads.
pub trait PrintSink: Sync {
    /// Takes the text of one `printf` call.
    fn print(&self, text: &[u8]);
}

/// Longest format string read, bytes before its NUL.
pub const MAX_FORMAT: usize = 4096;
/// Longest `%s` string read, bytes.
pub const MAX_STRING: usize = 4096;
/// Most text one call produces: the rest is cut off.
pub const MAX_OUTPUT: usize = 4096;
/// Arguments CUDA's `printf` takes after the format: conversions past
/// them are printed as they are written.
pub const MAX_ARGS: i32 = 32;

/// What `vprintf` returns for a NULL or unreadable format.
pub const BAD_FORMAT: i32 = -1;
/// What `vprintf` returns when arguments cannot be read.
pub const BAD_ARGS: i32 = -2;

/// One `vprintf(fmt, args)` call: `fmt` and `args` are generic
/// addresses, `read(addr, buf)` fills `buf` from kernel memory and says
/// whether it could. The text goes to `out` (cleared first, left empty
/// when the call fails); returns what the call returns: the number of
/// arguments used, [`BAD_FORMAT`] or [`BAD_ARGS`].
pub fn vprintf(
    fmt: u64,
    args: u64,
    read: &mut impl FnMut(u64, &mut [u8]) -> bool,
    out: &mut Vec<u8>,
) -> i32 {
    out.clear();
    if fmt == 0 {
        return BAD_FORMAT;
    }
    match read_cstr(read, fmt, MAX_FORMAT + 1) {
        Some((f, true)) => format(&f, args, read, out).unwrap_or_else(|| {
            out.clear();
            BAD_ARGS
        }),
        _ => BAD_FORMAT,
    }
}

/// A failed `assert()` of one thread: the arguments of its
/// `__assertfail` call and where the thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assertion {
    /// Generic address of the asserted expression's text.
    pub message: u64,
    /// Generic address of the source file's name.
    pub file: u64,
    /// Source line.
    pub line: u32,
    /// Generic address of the function's name.
    pub function: u64,
    /// The thread's block.
    pub block: [u32; 3],
    /// The thread in its block.
    pub thread: [u32; 3],
}

impl Assertion {
    /// The line a GPU prints for it: `file:line: function: block:
    /// [x,y,z], thread: [x,y,z] Assertion `expr` failed.`; a text that
    /// cannot be read prints as `?`, each at most [`MAX_STRING`] bytes.
    pub fn text(&self, read: &mut impl FnMut(u64, &mut [u8]) -> bool) -> Vec<u8> {
        let mut string = |addr: u64| {
            if addr == 0 {
                return b"?".to_vec();
            }
            read_cstr(read, addr, MAX_STRING).map_or_else(|| b"?".to_vec(), |(s, _)| s)
        };
        let (file, function, message) = (
            string(self.file),
            string(self.function),
            string(self.message),
        );
        let mut out = Vec::with_capacity(file.len() + function.len() + message.len() + 96);
        out.extend_from_slice(&file);
        out.extend_from_slice(format!(":{}: ", self.line).as_bytes());
        out.extend_from_slice(&function);
        let [bx, by, bz] = self.block;
        let [tx, ty, tz] = self.thread;
        out.extend_from_slice(
            format!(": block: [{bx},{by},{bz}], thread: [{tx},{ty},{tz}] Assertion `").as_bytes(),
        );
        out.extend_from_slice(&message);
        out.extend_from_slice(b"` failed.\n");
        out
    }
}

/// Reads the bytes at `addr` up to a NUL or `max` bytes: the bytes and
/// whether the NUL was found; None if memory ends first.
fn read_cstr(
    read: &mut impl FnMut(u64, &mut [u8]) -> bool,
    addr: u64,
    max: usize,
) -> Option<(Vec<u8>, bool)> {
    let mut s = Vec::new();
    let mut chunk = [0u8; 64];
    while s.len() < max {
        let a = addr.checked_add(s.len() as u64)?;
        // Chunks end at 64-byte boundaries, so one read rarely runs past
        // the end of memory that holds the string's end.
        let n = (64 - (a % 64) as usize).min(max - s.len());
        let buf = &mut chunk[..n];
        let mut got = n;
        if !read(a, buf) {
            // Memory ends (or changes) inside the chunk: byte by byte.
            got = 0;
            while got < n && read(a + got as u64, &mut buf[got..got + 1]) {
                got += 1;
            }
        }
        if let Some(z) = buf[..got].iter().position(|&b| b == 0) {
            s.extend_from_slice(&buf[..z]);
            return Some((s, true));
        }
        if got < n {
            return None;
        }
        s.extend_from_slice(buf);
    }
    Some((s, false))
}

/// Formats `fmt` (without its NUL) against the arguments packed at
/// `args` into `out` (appended, at most [`MAX_OUTPUT`] bytes in all).
/// Returns the number of arguments used, or None if one (or a `%s`
/// string) cannot be read.
pub fn format(
    fmt: &[u8],
    args: u64,
    read: &mut impl FnMut(u64, &mut [u8]) -> bool,
    out: &mut Vec<u8>,
) -> Option<i32> {
    let mut a = Args {
        base: args,
        off: 0,
        count: 0,
        read,
    };
    let mut o = Out(out);
    let mut i = 0;
    while i < fmt.len() {
        if fmt[i] != b'%' {
            let end = fmt[i..]
                .iter()
                .position(|&c| c == b'%')
                .map_or(fmt.len(), |p| i + p);
            o.put(&fmt[i..end]);
            i = end;
            continue;
        }
        let (spec, next) = parse_spec(fmt, i + 1);
        let text = &fmt[i..next.min(fmt.len())];
        i = next;
        let Some(spec) = spec else {
            o.put(text);
            continue;
        };
        let needs = spec.width_star as i32 + spec.prec_star as i32 + spec.takes_arg() as i32;
        if a.count + needs > MAX_ARGS {
            o.put(text);
            continue;
        }
        conversion(spec, &mut a, &mut o)?;
    }
    Some(a.count)
}

/// The argument buffer, read in order.
struct Args<'r, R> {
    base: u64,
    off: u64,
    count: i32,
    read: &'r mut R,
}

impl<R: FnMut(u64, &mut [u8]) -> bool> Args<'_, R> {
    /// The next argument of `size` (4 or 8) bytes, zero-extended.
    fn next(&mut self, size: u64) -> Option<u64> {
        let off = self.off.next_multiple_of(size);
        let mut b = [0u8; 8];
        if !(self.read)(self.base.checked_add(off)?, &mut b[..size as usize]) {
            return None;
        }
        self.off = off + size;
        self.count += 1;
        Some(u64::from_le_bytes(b))
    }

    /// A `*` width or precision: a 4-byte int.
    fn int(&mut self) -> Option<i32> {
        self.next(4).map(|v| v as u32 as i32)
    }
}

/// Output bounded at [`MAX_OUTPUT`] bytes.
struct Out<'a>(&'a mut Vec<u8>);

impl Out<'_> {
    fn room(&self) -> usize {
        MAX_OUTPUT.saturating_sub(self.0.len())
    }

    fn put(&mut self, b: &[u8]) {
        let n = b.len().min(self.room());
        self.0.extend_from_slice(&b[..n]);
    }

    fn pad(&mut self, c: u8, n: usize) {
        let n = n.min(self.room());
        self.0.resize(self.0.len() + n, c);
    }
}

/// Integer length modifiers, by the size of the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Len {
    Char,
    Short,
    Int,
    /// `l`, `ll`, `z`, `j`, `t` (and `L`): 8 bytes.
    Long,
}

#[derive(Debug, Clone, Copy)]
struct Spec {
    left: bool,
    plus: bool,
    space: bool,
    alt: bool,
    zero: bool,
    width: usize,
    width_star: bool,
    /// None: not given (or a negative `*`).
    prec: Option<usize>,
    prec_star: bool,
    len: Len,
    conv: u8,
}

impl Spec {
    fn takes_arg(&self) -> bool {
        self.conv != b'%'
    }
}

/// Parses the conversion specification after a `%` at `i`: the spec
/// (None for one that is unknown or cut off by the end) and where the
/// text after it starts.
fn parse_spec(f: &[u8], mut i: usize) -> (Option<Spec>, usize) {
    let mut s = Spec {
        left: false,
        plus: false,
        space: false,
        alt: false,
        zero: false,
        width: 0,
        width_star: false,
        prec: None,
        prec_star: false,
        len: Len::Int,
        conv: 0,
    };
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    loop {
        match at(i) {
            b'-' => s.left = true,
            b'+' => s.plus = true,
            b' ' => s.space = true,
            b'#' => s.alt = true,
            b'0' => s.zero = true,
            _ => break,
        }
        i += 1;
    }
    let number = |i: &mut usize| {
        let mut n = 0usize;
        while at(*i).is_ascii_digit() {
            n = n
                .saturating_mul(10)
                .saturating_add((at(*i) - b'0') as usize);
            *i += 1;
        }
        n
    };
    if at(i) == b'*' {
        s.width_star = true;
        i += 1;
    } else {
        s.width = number(&mut i);
    }
    if at(i) == b'.' {
        i += 1;
        if at(i) == b'*' {
            s.prec_star = true;
            i += 1;
        } else {
            s.prec = Some(number(&mut i));
        }
    }
    s.len = match (at(i), at(i + 1)) {
        (b'h', b'h') => {
            i += 2;
            Len::Char
        }
        (b'l', b'l') => {
            i += 2;
            Len::Long
        }
        (b'h', _) => {
            i += 1;
            Len::Short
        }
        (b'l' | b'z' | b'j' | b't' | b'L', _) => {
            i += 1;
            Len::Long
        }
        _ => Len::Int,
    };
    s.conv = at(i);
    let known = matches!(
        s.conv,
        b'd' | b'i'
            | b'u'
            | b'o'
            | b'x'
            | b'X'
            | b'c'
            | b's'
            | b'p'
            | b'n'
            | b'%'
            | b'f'
            | b'F'
            | b'e'
            | b'E'
            | b'g'
            | b'G'
            | b'a'
            | b'A'
    );
    if i >= f.len() {
        return (None, f.len());
    }
    (known.then_some(s), i + 1)
}

/// Formats one conversion, taking its arguments; None if one cannot be
/// read.
fn conversion<R: FnMut(u64, &mut [u8]) -> bool>(
    mut s: Spec,
    a: &mut Args<'_, R>,
    o: &mut Out<'_>,
) -> Option<()> {
    if s.width_star {
        let w = a.int()?;
        s.left |= w < 0;
        s.width = w.unsigned_abs() as usize;
    }
    if s.prec_star {
        s.prec = usize::try_from(a.int()?).ok();
    }
    let size = if s.len == Len::Long { 8 } else { 4 };
    match s.conv {
        b'%' => o.put(b"%"),
        // Would write kernel memory: not done, but its pointer's slot
        // is passed over so the arguments after it stay in place.
        b'n' => {
            a.next(8)?;
        }
        b'd' | b'i' => {
            let v = a.next(size)?;
            let v = match s.len {
                Len::Char => v as i8 as i64,
                Len::Short => v as i16 as i64,
                Len::Int => v as i32 as i64,
                Len::Long => v as i64,
            };
            int(o, &s, sign(&s, v < 0), v.unsigned_abs(), 10);
        }
        b'u' | b'o' | b'x' | b'X' => {
            let v = a.next(size)?;
            let v = match s.len {
                Len::Char => v as u8 as u64,
                Len::Short => v as u16 as u64,
                Len::Int => v as u32 as u64,
                Len::Long => v,
            };
            let (radix, prefix): (u64, &[u8]) = match s.conv {
                b'u' => (10, b""),
                b'o' => (8, b""),
                _ if !s.alt || v == 0 => (16, b""),
                b'x' => (16, b"0x"),
                _ => (16, b"0X"),
            };
            int(o, &s, prefix, v, radix);
        }
        b'p' => {
            let v = a.next(8)?;
            if v == 0 {
                pad_out(o, &s, b"", 0, b"(nil)", false);
            } else {
                let prefix: &[u8] = match sign(&s, false) {
                    b"+" => b"+0x",
                    b" " => b" 0x",
                    _ => b"0x",
                };
                int(o, &s, prefix, v, 16);
            }
        }
        b'c' => {
            let v = a.next(4)?;
            pad_out(o, &s, b"", 0, &[v as u8], false);
        }
        b's' => {
            let p = a.next(8)?;
            if p == 0 {
                // glibc: "(null)" unless a precision cuts it.
                let t: &[u8] = if s.prec.is_none_or(|p| p >= 6) {
                    b"(null)"
                } else {
                    b""
                };
                pad_out(o, &s, b"", 0, t, false);
            } else {
                let max = s.prec.unwrap_or(MAX_STRING).min(MAX_STRING);
                let (t, _) = read_cstr(a.read, p, max)?;
                pad_out(o, &s, b"", 0, &t, false);
            }
        }
        _ => float(o, &s, f64::from_bits(a.next(8)?)),
    }
    Some(())
}

/// The sign a signed conversion of a value starts with.
fn sign(s: &Spec, neg: bool) -> &'static [u8] {
    if neg {
        b"-"
    } else if s.plus {
        b"+"
    } else if s.space {
        b" "
    } else {
        b""
    }
}

/// Writes `prefix`, `zeros` zeros and `body` padded to the width:
/// with zeros after the prefix where `zero_ok` and the `0` flag ask.
fn pad_out(o: &mut Out<'_>, s: &Spec, prefix: &[u8], zeros: usize, body: &[u8], zero_ok: bool) {
    let len = prefix
        .len()
        .saturating_add(zeros)
        .saturating_add(body.len());
    let fill = s.width.saturating_sub(len);
    if s.left {
        o.put(prefix);
        o.pad(b'0', zeros);
        o.put(body);
        o.pad(b' ', fill);
    } else if s.zero && zero_ok {
        o.put(prefix);
        o.pad(b'0', fill.saturating_add(zeros));
        o.put(body);
    } else {
        o.pad(b' ', fill);
        o.put(prefix);
        o.pad(b'0', zeros);
        o.put(body);
    }
}

/// An integer conversion of `v` in `radix`, after `prefix` (sign or
/// `0x`).
fn int(o: &mut Out<'_>, s: &Spec, prefix: &[u8], mut v: u64, radix: u64) {
    let digits = if s.conv == b'X' {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut buf = [0u8; 22];
    let mut at = buf.len();
    while v != 0 {
        at -= 1;
        buf[at] = digits[(v % radix) as usize];
        v /= radix;
    }
    // Zero is "0", or nothing at precision 0.
    if at == buf.len() && s.prec != Some(0) {
        at -= 1;
        buf[at] = b'0';
    }
    let body = &buf[at..];
    let mut zeros = s.prec.unwrap_or(0).saturating_sub(body.len());
    if s.conv == b'o' && s.alt && zeros == 0 && body.first() != Some(&b'0') {
        zeros = 1;
    }
    // A precision turns the `0` flag off.
    pad_out(o, s, prefix, zeros, body, s.prec.is_none());
}

/// `%f %e %g %a` (and their upper-case forms) of `v`.
fn float(o: &mut Out<'_>, s: &Spec, v: f64) {
    let upper = s.conv.is_ascii_uppercase();
    let sign = sign(s, v.is_sign_negative());
    if !v.is_finite() {
        let t: &[u8] = match (v.is_nan(), upper) {
            (true, false) => b"nan",
            (true, true) => b"NAN",
            (false, false) => b"inf",
            (false, true) => b"INF",
        };
        pad_out(o, s, sign, 0, t, false);
        return;
    }
    let v = v.abs();
    // A double's exact decimal expansion has fewer than 1100 fractional
    // digits: a precision past the output's length changes nothing seen.
    let prec = s.prec.map(|p| p.min(MAX_OUTPUT));
    let p = prec.unwrap_or(6);
    let mut prefix = sign.to_vec();
    let body = match s.conv.to_ascii_lowercase() {
        b'f' => fixed(v, p, s.alt),
        b'e' => exp(v, p, s.alt, upper),
        b'g' => general(v, p, s.alt, upper),
        _ => {
            prefix.extend_from_slice(if upper { b"0X" } else { b"0x" });
            hex(v, prec, s.alt, upper)
        }
    };
    pad_out(o, s, &prefix, 0, body.as_bytes(), true);
}

/// `%.pf` of `v >= 0`.
fn fixed(v: f64, p: usize, alt: bool) -> String {
    let mut t = format!("{v:.p$}");
    if alt && p == 0 {
        t.push('.');
    }
    t
}

/// `%.pe` of `v >= 0`: C's exponent has a sign and at least two digits.
fn exp(v: f64, p: usize, alt: bool, upper: bool) -> String {
    let t = format!("{v:.p$e}");
    let (m, e) = t.split_once('e').unwrap_or((&t, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    let dot = if alt && p == 0 { "." } else { "" };
    let ch = if upper { 'E' } else { 'e' };
    let sg = if e < 0 { '-' } else { '+' };
    format!("{m}{dot}{ch}{sg}{:02}", e.unsigned_abs())
}

/// `%.pg` of `v >= 0`: `%e` or `%f` by the exponent, `p` significant
/// digits, trailing zeros removed unless `alt`.
fn general(v: f64, p: usize, alt: bool, upper: bool) -> String {
    let p = p.max(1);
    // The exponent `%e` would print, after rounding to p digits.
    let x = if v == 0.0 {
        0
    } else {
        let t = format!("{v:.prec$e}", prec = p - 1);
        t.rsplit_once('e')
            .and_then(|(_, e)| e.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let mut t = if x >= -4 && x < p as i64 {
        fixed(v, (p as i64 - 1 - x) as usize, alt)
    } else {
        exp(v, p - 1, alt, upper)
    };
    if !alt {
        let e = t.find(['e', 'E']).unwrap_or(t.len());
        let (m, rest) = t.split_at(e);
        if m.contains('.') {
            let m = m.trim_end_matches('0').trim_end_matches('.');
            t = format!("{m}{rest}");
        }
    }
    t
}

/// `%a` of `v >= 0` (without the `0x`): glibc's form, `1.8p+0`, a
/// subnormal as `0.0...p-1022`; rounding to a precision may carry into
/// the leading digit (`2p+0`).
fn hex(v: f64, prec: Option<usize>, alt: bool, upper: bool) -> String {
    let bits = v.to_bits();
    let biased = (bits >> 52) as i64 & 0x7ff;
    let mut man = bits & ((1 << 52) - 1);
    let (mut lead, e) = match (biased, man) {
        (0, 0) => (0u64, 0i64),
        (0, _) => (0, -1022),
        _ => (1, biased - 1023),
    };
    let mut ndig = 13;
    if let Some(p) = prec.filter(|&p| p < 13) {
        let shift = 4 * (13 - p) as u32;
        let rest = man & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        man >>= shift;
        let odd = if p == 0 { lead & 1 } else { man & 1 };
        if rest > half || (rest == half && odd == 1) {
            man += 1;
            if man >> (4 * p) != 0 {
                man = 0;
                lead += 1;
            }
        }
        ndig = p;
    }
    let mut digits = String::new();
    for k in (0..ndig).rev() {
        let d = (man >> (4 * k)) & 0xf;
        let c = char::from_digit(d as u32, 16).unwrap_or('0');
        digits.push(if upper { c.to_ascii_uppercase() } else { c });
    }
    match prec {
        None => digits.truncate(digits.trim_end_matches('0').len()),
        Some(p) => digits.extend(std::iter::repeat_n('0', p.saturating_sub(digits.len()))),
    }
    let dot = if alt || !digits.is_empty() { "." } else { "" };
    let pc = if upper { 'P' } else { 'p' };
    format!("{lead}{dot}{digits}{pc}{e:+}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory of the tests: `mem` at `base`.
    fn reader(base: u64, mem: &[u8]) -> impl FnMut(u64, &mut [u8]) -> bool + '_ {
        move |a, buf| {
            let Some(off) = a.checked_sub(base) else {
                return false;
            };
            match usize::try_from(off)
                .ok()
                .and_then(|o| mem.get(o..o.checked_add(buf.len())?))
            {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }
    }

    /// Packs arguments as nvcc does: each at a multiple of its size.
    #[derive(Default)]
    struct Pack(Vec<u8>);
    impl Pack {
        fn put(mut self, b: &[u8]) -> Self {
            self.0.resize(self.0.len().next_multiple_of(b.len()), 0);
            self.0.extend_from_slice(b);
            self
        }
        fn i(self, v: i32) -> Self {
            self.put(&v.to_le_bytes())
        }
        fn l(self, v: i64) -> Self {
            self.put(&v.to_le_bytes())
        }
        fn d(self, v: f64) -> Self {
            self.put(&v.to_le_bytes())
        }
    }

    const BASE: u64 = 0x1000;

    /// Formats `fmt` against `args` (at BASE); memory after the arguments
    /// holds `extra` at BASE + 0x800.
    fn fmt_with(fmt: &str, args: &Pack, extra: &[u8]) -> (String, Option<i32>) {
        let mut mem = args.0.clone();
        mem.resize(0x800, 0);
        mem.extend_from_slice(extra);
        let mut out = Vec::new();
        let r = format(fmt.as_bytes(), BASE, &mut reader(BASE, &mem), &mut out);
        (String::from_utf8_lossy(&out).into_owned(), r)
    }

    fn f(fmt: &str, args: Pack) -> String {
        fmt_with(fmt, &args, b"").0
    }

    fn one(fmt: &str, v: f64) -> String {
        f(fmt, Pack::default().d(v))
    }

    #[test]
    fn integers() {
        let p = || Pack::default();
        assert_eq!(f("%d|%i|%u", p().i(-5).i(7).i(-1)), "-5|7|4294967295");
        assert_eq!(
            f("%5d|%-5d|%05d", p().i(42).i(42).i(-42)),
            "   42|42   |-0042"
        );
        assert_eq!(f("%+d|% d|%+d", p().i(3).i(3).i(-3)), "+3| 3|-3");
        assert_eq!(
            f("%.3d|%8.3d|%08.3d", p().i(7).i(-7).i(7)),
            "007|    -007|     007"
        );
        assert_eq!(f("%.0d|%.0x|%#.0o", p().i(0).i(0).i(0)), "||0");
        assert_eq!(
            f("%x|%X|%#x|%#X|%#x", p().i(255).i(255).i(255).i(255).i(0)),
            "ff|FF|0xff|0XFF|0"
        );
        assert_eq!(f("%o|%#o|%#5o", p().i(8).i(8).i(0)), "10|010|    0");
        assert_eq!(f("%#08x", p().i(0x1f)), "0x00001f");
        assert_eq!(
            f("%hhd|%hd|%hhu|%hu", p().i(0x1ff).i(0x18000).i(-1).i(-1)),
            "-1|-32768|255|65535"
        );
        // A 4-byte int, then an 8-byte long at offset 8.
        assert_eq!(f("%d %ld", p().i(1).l(-9_000_000_000)), "1 -9000000000");
        assert_eq!(
            f("%lld|%llu|%zu|%lx", p().l(i64::MIN).l(-1).l(5).l(0xabc)),
            "-9223372036854775808|18446744073709551615|5|abc"
        );
        assert_eq!(
            f(
                "%c%c%-3c|",
                p().i(b'o' as i32).i(b'k' as i32).i(b'!' as i32)
            ),
            "ok!  |"
        );
        assert_eq!(
            f("%p %p|%10p", p().l(0x7f00).l(0).l(0)),
            "0x7f00 (nil)|     (nil)"
        );
        assert_eq!(f("%+p|%-8p|", p().l(0x12).l(0x12)), "+0x12|0x12    |");
        assert_eq!(
            f("%05c|%05d|%-05d", p().i(b'x' as i32).i(-3).i(-3)),
            "    x|-0003|-3   "
        );
    }

    #[test]
    fn stars_percent_and_unknown() {
        let p = || Pack::default();
        assert_eq!(
            f("%*d|%-*d|%*d", p().i(4).i(1).i(3).i(2).i(-3).i(3)),
            "   1|2  |3  "
        );
        assert_eq!(
            f("%.*f|%.*f", p().i(2).d(1.0).i(-1).d(1.0)),
            "1.00|1.000000"
        );
        assert_eq!(f("100%% %y %5", p()), "100% %y %5");
        assert_eq!(f("%", p()), "%");
        // %n writes nothing; its pointer's slot is passed over.
        assert_eq!(fmt_with("a%nb%d", &p().l(0x1000).i(3), b"").0, "ab3");
        assert_eq!(
            fmt_with("%d %d %5.2f", &p().i(1).i(2).d(0.5), b"").1,
            Some(3)
        );
        assert_eq!(fmt_with("%*.*d", &p().i(1).i(1).i(1), b"").1, Some(3));
        assert_eq!(fmt_with("plain", &p(), b"").1, Some(0));
    }

    #[test]
    fn strings() {
        let s = BASE + 0x800;
        let p = || Pack::default();
        let (t, r) = fmt_with(
            "[%s|%4s|%-4s|%.1s|%s]",
            &p().l(s as i64).l(s as i64).l(s as i64).l(s as i64).l(0),
            b"ok\0",
        );
        assert_eq!((t.as_str(), r), ("[ok|  ok|ok  |o|(null)]", Some(5)));
        assert_eq!(fmt_with("%.3s|", &p().l(0), b"").0, "|");
        let (t, _) = fmt_with(
            "%05s|%-05s|%10.1s|%5%",
            &p().l(s as i64).l(s as i64).l(s as i64),
            b"ab\0",
        );
        assert_eq!(t, "   ab|ab   |         a|%");
        // Unterminated at the end of memory: unreadable.
        assert_eq!(fmt_with("%s", &p().l(s as i64), b"abc").1, None);
        // A precision reads no further than it prints.
        assert_eq!(fmt_with("%.3s", &p().l(s as i64), b"abc").0, "abc");
        // At most MAX_STRING bytes.
        let long = vec![b'x'; MAX_STRING + 10];
        let (t, _) = fmt_with("%s", &p().l(s as i64), &long);
        assert_eq!(t.len(), MAX_STRING);
        // Unreadable arguments.
        assert_eq!(
            fmt_with("%d", &p(), b"").1,
            Some(1),
            "zeros past the pack are memory"
        );
        let mut out = Vec::new();
        assert_eq!(format(b"%d", 0, &mut reader(BASE, &[]), &mut out), None);
    }

    #[test]
    fn floats() {
        let cases: &[(&str, f64, &str)] = &[
            ("%f", 1.5, "1.500000"),
            ("%f", -0.0, "-0.000000"),
            ("%.3f", 1.23456, "1.235"),
            ("%.0f", 2.5, "2"),
            ("%.0f", 3.5, "4"),
            ("%#.0f", 3.0, "3."),
            ("%.2f", 0.125, "0.12"),
            ("%10.3f", -1.0, "    -1.000"),
            ("%-10.1f|", 1.0, "1.0       |"),
            ("%010.2f", -3.0, "-000003.00"),
            ("%+f", 1.0, "+1.000000"),
            ("% f", 1.0, " 1.000000"),
            ("%f", 1e20, "100000000000000000000.000000"),
            ("%F", f64::INFINITY, "INF"),
            ("%f", f64::NEG_INFINITY, "-inf"),
            ("%05f", f64::NAN, "  nan"),
            ("%e", 12345.678, "1.234568e+04"),
            ("%E", 0.000123, "1.230000E-04"),
            ("%e", 0.0, "0.000000e+00"),
            ("%.0e", 15.0, "2e+01"),
            ("%#.0e", 1.0, "1.e+00"),
            ("%e", 1e-300, "1.000000e-300"),
            ("%g", 100000.0, "100000"),
            ("%g", 1000000.0, "1e+06"),
            ("%g", 0.0001, "0.0001"),
            ("%g", 0.00001, "1e-05"),
            ("%g", 1.5, "1.5"),
            ("%g", 0.0, "0"),
            ("%g", -0.0, "-0"),
            ("%.3g", 1.23456, "1.23"),
            ("%.0g", 123.0, "1e+02"),
            ("%g", 123456789.0, "1.23457e+08"),
            ("%g", 999999.5, "1e+06"),
            ("%#g", 1.0, "1.00000"),
            ("%#.0g", 1.0, "1."),
            ("%G", 1e-10, "1E-10"),
            ("%10.4g|", 1.0 / 3.0, "    0.3333|"),
            ("%a", 1.0, "0x1p+0"),
            ("%a", 1.5, "0x1.8p+0"),
            ("%a", -0.1, "-0x1.999999999999ap-4"),
            ("%a", 0.0, "0x0p+0"),
            ("%A", 255.0, "0X1.FEP+7"),
            ("%a", 5e-324, "0x0.0000000000001p-1022"),
            ("%.0a", 1.5, "0x2p+0"),
            ("%.0a", 2.5, "0x1p+1"),
            ("%.1a", 1.96875, "0x2.0p+0"),
            ("%a", 1e-310, "0x0.012688b70e62bp-1022"),
            ("%.15a", 0.1, "0x1.999999999999a00p-4"),
            ("%#.3g", 100.0, "100."),
            ("%#g", 0.0001, "0.000100000"),
            ("%.1a", 1.0, "0x1.0p+0"),
            ("%.2a", 1.0 / 3.0, "0x1.55p-2"),
            ("%#a", 1.0, "0x1.p+0"),
            ("%010a", 1.0, "0x00001p+0"),
        ];
        for &(fmt, v, want) in cases {
            assert_eq!(one(fmt, v), want, "{fmt} of {v}");
        }
        // A huge precision is bounded (and exact as far as it is shown).
        let t = one("%.99999999f", 0.1);
        assert_eq!(t.len(), MAX_OUTPUT);
        assert!(t.starts_with("0.1000000000000000055511151231257827"));
    }

    #[test]
    fn bounds() {
        // Output is cut at MAX_OUTPUT, however large the width.
        let t = f("%999999999d|%-999999999d", Pack::default().i(1).i(2));
        assert_eq!(t.len(), MAX_OUTPUT);
        assert!(t.bytes().all(|c| c == b' '));
        // Past MAX_ARGS arguments, conversions print as written.
        let mut p = Pack::default();
        for k in 0..33 {
            p = p.i(k);
        }
        let fmt = "%d".repeat(33);
        let (t, r) = fmt_with(&fmt, &p, b"");
        assert_eq!(r, Some(32));
        assert!(t.ends_with("31%d"), "{t}");
    }

    #[test]
    fn whole_calls() {
        let mut mem = b"n=%d\0".to_vec();
        mem.resize(8, 0);
        mem.extend_from_slice(&7i32.to_le_bytes());
        let mut out = Vec::new();
        let mut r = reader(BASE, &mem);
        assert_eq!(vprintf(BASE, BASE + 8, &mut r, &mut out), 1);
        assert_eq!(out, b"n=7");
        assert_eq!(vprintf(0, 0, &mut r, &mut out), BAD_FORMAT);
        assert!(out.is_empty());
        assert_eq!(vprintf(BASE + 0x100, 0, &mut r, &mut out), BAD_FORMAT);
        assert_eq!(vprintf(BASE, 0, &mut r, &mut out), BAD_ARGS);
        assert!(out.is_empty());
        // No NUL within MAX_FORMAT bytes.
        let big = vec![b'a'; MAX_FORMAT + 1];
        assert_eq!(
            vprintf(BASE, 0, &mut reader(BASE, &big), &mut out),
            BAD_FORMAT
        );
        let mut ok = vec![b'a'; MAX_FORMAT];
        ok.push(0);
        assert_eq!(vprintf(BASE, 0, &mut reader(BASE, &ok), &mut out), 0);
        assert_eq!(out.len(), MAX_FORMAT);
        // A format ending just before memory does, read chunk by chunk.
        let mut edge = vec![0u8; 40];
        edge.extend_from_slice(b"hi\0");
        assert_eq!(vprintf(BASE + 40, 0, &mut reader(BASE, &edge), &mut out), 0);
        assert_eq!(out, b"hi");
    }
}

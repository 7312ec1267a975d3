//! The software backend's kernels: the arithmetic of the built-in module on
//! host bytes, and the thread pool that splits it.

use std::sync::Mutex;

use vgpu_sys::warn_limited;

use super::lock;

/// Runs `f` on each item on up to `threads` threads (the caller's among
/// them); results come back in item order. If a thread cannot be started,
/// the ones that did (at least the caller's) do its share.
pub(super) fn run_parallel<T: Send, R: Send>(
    threads: usize,
    items: impl Iterator<Item = T> + Send,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let queue = Mutex::new(items.enumerate());
    let work = || {
        let mut done = Vec::new();
        loop {
            let next = lock(&queue).next();
            let Some((i, item)) = next else { break };
            done.push((i, f(item)));
        }
        done
    };
    let mut results = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 1..threads {
            match std::thread::Builder::new()
                .name("vgpu-software".into())
                .spawn_scoped(s, work)
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    warn_limited!("software backend: cannot start a worker thread: {e}");
                    break;
                }
            }
        }
        let mut all = work();
        for h in handles {
            all.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    results.sort_unstable_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Splits `out` into at most `threads` pieces of whole `unit`-byte
/// elements and runs `f(byte offset, piece)` on each, in parallel.
pub(super) fn par_chunks(
    threads: usize,
    unit: usize,
    out: &mut [u8],
    f: impl Fn(usize, &mut [u8]) + Sync,
) {
    let units = out.len().checked_div(unit).unwrap_or(0);
    let threads = threads.min(units).max(1);
    if threads == 1 {
        f(0, out);
        return;
    }
    let per = units.div_ceil(threads) * unit;
    run_parallel(threads, out.chunks_mut(per).enumerate(), |(i, c)| {
        f(i * per, c)
    });
}

/// A little-endian float from 4 bytes.
pub(super) fn get(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub(super) fn put(b: &mut [u8], v: f32) {
    b.copy_from_slice(&v.to_le_bytes());
}

/// Fills `buf` (a multiple of 4 bytes) with little-endian `pattern`.
pub(super) fn fill_pattern(buf: &mut [u8], pattern: u32) {
    let word = pattern.to_le_bytes();
    if word.iter().all(|&b| b == word[0]) {
        buf.fill(word[0]);
        return;
    }
    let mut block = [0u8; 256];
    for w in block.chunks_exact_mut(4) {
        w.copy_from_slice(&word);
    }
    let mut chunks = buf.chunks_exact_mut(block.len());
    for c in &mut chunks {
        c.copy_from_slice(&block);
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&block[..n]);
}

/// `c = a + b`; a `None` input is `c` itself.
pub(super) fn vadd(c: &mut [u8], a: Option<&[u8]>, b: Option<&[u8]>) {
    let c = c.chunks_exact_mut(4);
    match (a, b) {
        (Some(a), Some(b)) => {
            for ((c, a), b) in c.zip(a.chunks_exact(4)).zip(b.chunks_exact(4)) {
                put(c, get(a) + get(b));
            }
        }
        (Some(a), None) => {
            for (c, a) in c.zip(a.chunks_exact(4)) {
                let v = get(a) + get(c);
                put(c, v);
            }
        }
        (None, Some(b)) => {
            for (c, b) in c.zip(b.chunks_exact(4)) {
                let v = get(c) + get(b);
                put(c, v);
            }
        }
        (None, None) => {
            for c in c {
                let v = get(c) + get(c);
                put(c, v);
            }
        }
    }
}

/// `y = a * x + y`; a `None` `x` is `y` itself.
pub(super) fn saxpy(y: &mut [u8], x: Option<&[u8]>, a: f32) {
    match x {
        Some(x) => {
            for (y, x) in y.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                let v = a * get(x) + get(y);
                put(y, v);
            }
        }
        None => {
            for y in y.chunks_exact_mut(4) {
                let v = a * get(y) + get(y);
                put(y, v);
            }
        }
    }
}

/// `c = beta * c`, with `beta == 0` clearing `c` (NaNs included).
pub(super) fn scale(c: &mut [u8], beta: f32) {
    if beta == 0.0 {
        c.fill(0);
        return;
    }
    for c in c.chunks_exact_mut(4) {
        let v = beta * get(c);
        put(c, v);
    }
}

/// Rows of C kept in the accumulator at once.
const MB: usize = 16;
/// Columns of C kept in the accumulator at once.
const NB: usize = 256;
/// Rows of B (columns of A) per pass over the accumulator.
const KB: usize = 256;

/// `C = alpha * A * B + beta * C` for the rows of C in `c` (bytes, row
/// major, `n` columns); `a` holds the matching rows of A (`k` columns),
/// `b` all of B (`k` x `n`). With `beta == 0`, C is not read.
pub(super) fn sgemm_rows(
    c: &mut [u8],
    a: &[f32],
    b: &[f32],
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
) {
    let rows = c.len() / (n * 4);
    let mut acc = [0f32; MB * NB];
    for i0 in (0..rows).step_by(MB) {
        let mb = MB.min(rows - i0);
        for j0 in (0..n).step_by(NB) {
            let nb = NB.min(n - j0);
            acc[..mb * NB].fill(0.0);
            for p0 in (0..k).step_by(KB) {
                let kb = KB.min(k - p0);
                for i in 0..mb {
                    let arow = &a[(i0 + i) * k + p0..][..kb];
                    let accrow = &mut acc[i * NB..][..nb];
                    for (dp, &av) in arow.iter().enumerate() {
                        let brow = &b[(p0 + dp) * n + j0..][..nb];
                        for (s, &bv) in accrow.iter_mut().zip(brow) {
                            *s += av * bv;
                        }
                    }
                }
            }
            for i in 0..mb {
                let crow = &mut c[((i0 + i) * n + j0) * 4..][..nb * 4];
                for (cv, &s) in crow.chunks_exact_mut(4).zip(&acc[i * NB..][..nb]) {
                    let v = if beta == 0.0 {
                        alpha * s
                    } else {
                        alpha * s + beta * get(cv)
                    };
                    put(cv, v);
                }
            }
        }
    }
}
